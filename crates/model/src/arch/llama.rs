//! llama (Llama 2/3, Mistral, TinyLlama, stories): pre-norm layers of attention + SwiGLU MLP,
//! normal (adjacent-pair) RoPE — llama.cpp's converter permutes Q/K rows so that the
//! HF rotate-half layout becomes adjacent pairs. Optional QKV bias; `rope_freqs.weight`
//! (Llama 3.1 frequency factors) is read by the model loader.

use backend::Backend;

use crate::blocks::{load_dense_layers, AttnOptions, DenseLayer};
use crate::config::ModelConfig;
use crate::loader::Loader;
use crate::ModelError;

pub fn load<B: Backend>(
    l: &Loader<B>,
    cfg: &ModelConfig,
) -> Result<Vec<DenseLayer<B>>, ModelError> {
    load_dense_layers(l, cfg, AttnOptions { qk_norm: false })
}
