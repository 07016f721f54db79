//! The one error type of the convert crate.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Gguf(#[from] gguf::GgufError),
    #[error(transparent)]
    Quant(#[from] quant::QuantError),
    #[error(transparent)]
    Model(#[from] model::ModelError),
    #[error(transparent)]
    Tokenizer(#[from] engine::TokenizerError),
    #[error("tensor {name}: {what}")]
    Tensor { name: String, what: String },
    #[error("imatrix: {0}")]
    Imatrix(String),
    #[error("thread pool: {0}")]
    ThreadPool(String),
    #[error("{0}")]
    Input(String),
}

impl ConvertError {
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> ConvertError {
        ConvertError::Io {
            path: path.into(),
            source,
        }
    }
}
