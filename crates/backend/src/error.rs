//! The one error type of the `backend` crate.

/// Everything an op or an allocation can report.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackendError {
    #[error("tensor {0:?} not found in the GGUF file")]
    MissingTensor(String),
    #[error("{op}: shape mismatch: {detail}")]
    Shape { op: &'static str, detail: String },
    #[error("{op}: weight type {ty} is not supported")]
    UnsupportedType {
        op: &'static str,
        ty: gguf::GgmlType,
    },
    #[error("token id {token} is outside the vocabulary of {n_vocab}")]
    TokenOutOfRange { token: u32, n_vocab: usize },
    #[error("position {pos} is outside the KV cache of {n_ctx} positions")]
    PositionOutOfRange { pos: usize, n_ctx: usize },
    #[error("batch row refers to sequence {seq}, but only {n_seqs} states were given")]
    BadSequence { seq: usize, n_seqs: usize },
    #[error("KV type {kv_type}: head size {head_dim} is not a multiple of its block size {block}")]
    KvHeadDim {
        kv_type: crate::KvType,
        head_dim: usize,
        block: usize,
    },
    #[error("cannot allocate {bytes} bytes for {what}")]
    Alloc { what: &'static str, bytes: u128 },
    #[error("quantization error: {0}")]
    Quant(String),
    #[error("thread pool: {0}")]
    ThreadPool(String),
    /// A device (GPU driver, kernel launch, device memory) failure.
    #[error("device: {0}")]
    Device(String),
}
