//! The one error type of the CUDA backend.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// No usable CUDA driver / device: the caller falls back to the CPU.
    #[error("no CUDA device found: {0}")]
    NoDevice(String),
    #[error("NVRTC library not found (searched: {searched})")]
    NvrtcNotFound { searched: String },
    #[error("cannot load NVRTC library {path}: {reason}")]
    NvrtcLoad { path: PathBuf, reason: String },
    #[error("NVRTC {call} failed: {message}")]
    Nvrtc { call: &'static str, message: String },
    #[error("kernel {kernel} failed to compile for {arch}:\n{log}")]
    Compile {
        kernel: String,
        arch: String,
        log: String,
    },
    #[error("NVRTC {version} cannot compile for sm_{arch} (supported: {supported:?})")]
    ArchUnsupported {
        version: String,
        arch: u32,
        supported: Vec<u32>,
    },
    #[error("CUDA driver: {0}")]
    Driver(String),
    /// Options that cannot work on this card or NVRTC (the message says what to change).
    #[error("{0}")]
    Options(String),
    /// cuBLAS missing or failing (the prefill GEMM path; callers fall back to the matvec).
    #[error("cuBLAS: {0}")]
    Cublas(String),
    #[error("unsupported weight type {0} for this CUDA op")]
    UnsupportedType(&'static str),
    #[error("bad shape: {0}")]
    Shape(String),
    #[error("kernel cache I/O at {path}: {source}")]
    CacheIo {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl From<cudarc::driver::DriverError> for CudaError {
    fn from(e: cudarc::driver::DriverError) -> Self {
        CudaError::Driver(e.to_string())
    }
}

pub type Result<T> = std::result::Result<T, CudaError>;
