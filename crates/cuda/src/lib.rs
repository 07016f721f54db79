//! CUDA backend runtime and kernels.
//!
//! Nothing CUDA is needed to build this crate: the driver is loaded at run time through cudarc
//! (`dynamic-loading`), NVRTC through our own loader ([`nvrtc`]), and the kernels are CUDA C++
//! sources under `kernels/`, embedded with `include_str!` and compiled for the card's exact
//! architecture at first use, then cached on disk ([`kernel_cache`]). With no GPU,
//! [`open_or_cpu`] says so once and the caller runs on the CPU.

pub mod attention;
pub mod backend;
pub mod bandwidth;
pub mod compile_check;
pub mod device;
pub mod error;
pub mod gemm;
pub mod hybrid;
pub mod kernel_cache;
pub mod matvec;
pub mod mmq;
pub mod mmv;
pub mod multi;
pub mod nvrtc;
pub mod ops;
pub mod pdl;
pub mod reference;
pub mod sources;
mod switch;
pub mod synthetic;
pub mod trace;

pub use device::{
    device_count, driver_present, list_devices, open_or_cpu, CudaDevice, CudaOptions, DeviceInfo,
};
pub use error::{CudaError, Result};
pub use matvec::{DeviceMatrix, MatvecScratch};
pub use sources::Program;

/// Re-exported so callers can allocate and copy device buffers without naming cudarc.
pub use cudarc::driver::CudaSlice;
