//! The one error type of the `model` crate.

use backend::BackendError;
use gguf::GgufError;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error("the GGUF file has no general.architecture")]
    NoArchitecture,
    #[error("architecture {0:?} is not supported (supported: llama, qwen2, qwen3, qwen35)")]
    UnsupportedArchitecture(String),
    #[error("metadata key {0:?} is missing or has the wrong type")]
    MissingKey(String),
    #[error("metadata key {key:?}: {detail}")]
    BadKey { key: String, detail: String },
    #[error("tensor {0:?} is missing")]
    MissingTensor(String),
    #[error("tensor {name:?} has dims {found:?} (ggml order), expected {expected:?}")]
    TensorShape {
        name: String,
        found: Vec<u64>,
        expected: Vec<u64>,
    },
    #[error(
        "the prompt needs {needed} positions but the context holds {n_ctx} \
         (already used: {used}); use a larger context or a shorter prompt"
    )]
    ContextFull {
        needed: usize,
        used: usize,
        n_ctx: usize,
    },
    #[error("context length {0} is invalid (must be at least 1)")]
    BadContext(usize),
    #[error("cannot restore to position {pos}: {reason}")]
    CannotTruncate { pos: usize, reason: String },
    #[error("token id {token} is outside the vocabulary of {n_vocab}")]
    TokenOutOfRange { token: u32, n_vocab: usize },
    #[error("forward_batch: {n_states} states but {n_tokens} tokens")]
    BatchMismatch { n_states: usize, n_tokens: usize },
    #[error("sequence state belongs to a different model (layers {found}, expected {expected})")]
    ForeignState { found: usize, expected: usize },
    #[error("empty input: no tokens to run")]
    EmptyInput,
    #[error("the model has no multi-token-prediction (MTP) block loaded (qwen35 files with nextn_predict_layers > 0; call load_mtp)")]
    NoMtp,
}
