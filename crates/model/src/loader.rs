//! Loads named tensors through a backend, checking each shape against the configuration.

use std::sync::Arc;

use backend::Backend;
use gguf::GgufFile;

use crate::ModelError;

/// Tensor names as llama.cpp writes them (src/llama-arch.cpp `LLM_TENSOR_NAMES`).
pub fn blk(il: usize, name: &str) -> String {
    format!("blk.{il}.{name}")
}

pub struct Loader<'a, B: Backend> {
    pub backend: &'a B,
    pub file: &'a Arc<GgufFile>,
}

impl<B: Backend> Loader<'_, B> {
    /// A tensor that must exist with exactly `dims` (ggml order: `dims[0]` = row length).
    pub fn tensor(&self, name: &str, dims: &[usize]) -> Result<B::Weight, ModelError> {
        self.optional(name, dims)?
            .ok_or_else(|| ModelError::MissingTensor(name.to_owned()))
    }

    /// Like [`Loader::tensor`], but `None` if the tensor is absent.
    pub fn optional(&self, name: &str, dims: &[usize]) -> Result<Option<B::Weight>, ModelError> {
        let Some(info) = self.file.tensor(name) else {
            return Ok(None);
        };
        // ggml drops trailing dims of 1: [n] and [n, 1] are the same tensor.
        let mut found: Vec<u64> = info.dims.clone();
        while found.len() > 1 && found.last() == Some(&1) {
            found.pop();
        }
        let mut expected: Vec<u64> = dims.iter().map(|&d| d as u64).collect();
        while expected.len() > 1 && expected.last() == Some(&1) {
            expected.pop();
        }
        if found != expected {
            return Err(ModelError::TensorShape {
                name: name.to_owned(),
                found: info.dims.clone(),
                expected,
            });
        }
        Ok(Some(self.backend.load_weight(self.file, name)?))
    }

    /// `blk.{il}.{name}` with `dims`.
    pub fn layer(&self, il: usize, name: &str, dims: &[usize]) -> Result<B::Weight, ModelError> {
        self.tensor(&blk(il, name), dims)
    }

    pub fn layer_optional(
        &self,
        il: usize,
        name: &str,
        dims: &[usize],
    ) -> Result<Option<B::Weight>, ModelError> {
        self.optional(&blk(il, name), dims)
    }
}
