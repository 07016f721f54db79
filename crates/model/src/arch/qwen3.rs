//! qwen3 (Qwen3 dense): the llama layer with per-head RMS norm of q and k (before RoPE),
//! NeoX RoPE, no QKV bias, head_dim independent of n_embd / n_head.

use backend::Backend;

use crate::blocks::{load_dense_layers, AttnOptions, DenseLayer};
use crate::config::ModelConfig;
use crate::loader::Loader;
use crate::ModelError;

pub fn load<B: Backend>(
    l: &Loader<B>,
    cfg: &ModelConfig,
) -> Result<Vec<DenseLayer<B>>, ModelError> {
    load_dense_layers(l, cfg, AttnOptions { qk_norm: true })
}
