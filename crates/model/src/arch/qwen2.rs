//! qwen2 (Qwen2 / Qwen2.5): the llama layer with QKV bias and NeoX (rotate-half) RoPE.

use backend::Backend;

use crate::blocks::{load_dense_layers, AttnOptions, DenseLayer};
use crate::config::ModelConfig;
use crate::loader::{blk, Loader};
use crate::ModelError;

pub fn load<B: Backend>(
    l: &Loader<B>,
    cfg: &ModelConfig,
) -> Result<Vec<DenseLayer<B>>, ModelError> {
    let layers = load_dense_layers(l, cfg, AttnOptions { qk_norm: false })?;
    // The biases are what distinguishes qwen2 from llama: require them.
    for (il, layer) in layers.iter().enumerate() {
        if layer.attn.bq.is_none() || layer.attn.bk.is_none() || layer.attn.bv.is_none() {
            return Err(ModelError::MissingTensor(blk(il, "attn_{q,k,v}.bias")));
        }
    }
    Ok(layers)
}
