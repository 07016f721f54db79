//! Hyperparameters read from GGUF metadata, following the keys llama.cpp writes
//! (src/llama-arch.cpp: `{arch}.embedding_length`, `{arch}.attention.head_count`,
//! `{arch}.rope.freq_base`, `{arch}.ssm.*`, …).

use backend::{RopeMode, RopeParams};
use gguf::{GgufFile, Metadata};

use crate::ModelError;

/// The supported architectures (`general.architecture`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// Llama 2/3, Mistral, TinyLlama, stories: normal (adjacent-pair) RoPE.
    Llama,
    /// Qwen2 / Qwen2.5: NeoX RoPE, QKV bias.
    Qwen2,
    /// Qwen3 dense: NeoX RoPE, per-head RMS norm of q and k.
    Qwen3,
    /// Qwen3.5 / 3.6 dense: Gated DeltaNet layers and gated full-attention layers.
    Qwen35,
}

impl Arch {
    pub fn from_name(name: &str) -> Option<Arch> {
        match name {
            "llama" => Some(Arch::Llama),
            "qwen2" => Some(Arch::Qwen2),
            "qwen3" => Some(Arch::Qwen3),
            "qwen35" => Some(Arch::Qwen35),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Qwen35 => "qwen35",
        }
    }
}

/// Gated DeltaNet dimensions (Qwen3.5 linear-attention layers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SsmConfig {
    /// `ssm.conv_kernel`.
    pub d_conv: usize,
    /// Key/value head size (`ssm.state_size`).
    pub d_state: usize,
    /// Key heads (`ssm.group_count`).
    pub n_k_heads: usize,
    /// Value heads (`ssm.time_step_rank`).
    pub n_v_heads: usize,
    /// `n_v_heads * d_v` (`ssm.inner_size`).
    pub d_inner: usize,
}

impl SsmConfig {
    pub fn d_v(&self) -> usize {
        self.d_inner / self.n_v_heads
    }

    pub fn key_dim(&self) -> usize {
        self.n_k_heads * self.d_state
    }

    /// Conv channels: q, k (key_dim each) then v (d_inner).
    pub fn conv_channels(&self) -> usize {
        2 * self.key_dim() + self.d_inner
    }
}

/// Everything the forward pass needs to know about a model's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub arch: Arch,
    pub n_vocab: usize,
    /// Context length the model was trained with.
    pub n_ctx_train: usize,
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_ff: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim_k: usize,
    pub head_dim_v: usize,
    pub rms_eps: f32,
    /// Attention score scale (`attention.scale`, else 1/sqrt(head_dim_k)).
    pub attn_scale: f32,
    pub rope: RopeParams,
    /// Per layer: true for a recurrent (Gated DeltaNet) layer.
    pub recurrent_layers: Vec<bool>,
    pub ssm: Option<SsmConfig>,
    /// Multi-token-prediction ("NextN") blocks stored after the `n_layer` main ones
    /// (`nextn_predict_layers`; llama.cpp counts them in `block_count`). The main forward
    /// never runs them.
    pub n_mtp_layer: usize,
}

impl ModelConfig {
    pub fn is_hybrid(&self) -> bool {
        self.recurrent_layers.iter().any(|&r| r)
    }

    /// Reads the configuration of `file`.
    pub fn from_gguf(file: &GgufFile) -> Result<ModelConfig, ModelError> {
        let name = file.architecture().ok_or(ModelError::NoArchitecture)?;
        let arch = Arch::from_name(name)
            .ok_or_else(|| ModelError::UnsupportedArchitecture(name.to_owned()))?;
        let md = file.metadata();
        let keys = Keys { md, arch: name };
        let n_embd = keys.usize("embedding_length")?;
        let n_block = keys.usize("block_count")?;
        // MTP blocks come last and are counted in block_count; at least one main layer stays.
        let n_mtp_layer = keys
            .usize_or("nextn_predict_layers", 0)?
            .min(n_block.saturating_sub(1));
        let n_layer = n_block - n_mtp_layer;
        let n_head = keys.usize("attention.head_count")?;
        let n_head_kv = keys.usize_or("attention.head_count_kv", n_head)?;
        if n_embd == 0 || n_layer == 0 || n_head == 0 || n_head_kv == 0 || n_head % n_head_kv != 0 {
            return Err(ModelError::BadKey {
                key: format!("{name}.attention.head_count"),
                detail: format!(
                    "n_embd {n_embd}, n_layer {n_layer}, {n_head} heads over {n_head_kv} KV heads"
                ),
            });
        }
        // Every layer has tensors: a block count beyond the tensor count is a corrupt header
        // (and must not size any allocation).
        if n_layer > file.tensors().len() {
            return Err(ModelError::BadKey {
                key: format!("{name}.block_count"),
                detail: format!("{n_layer} layers but only {} tensors", file.tensors().len()),
            });
        }
        let head_dim_k = keys.usize_or("attention.key_length", n_embd / n_head)?;
        let head_dim_v = keys.usize_or("attention.value_length", n_embd / n_head)?;
        let n_vocab = match keys.usize_opt("vocab_size")? {
            Some(v) => v,
            None => file
                .tensor("token_embd.weight")
                .and_then(|t| t.dims.get(1).copied())
                .ok_or_else(|| ModelError::MissingTensor("token_embd.weight".into()))?
                as usize,
        };
        let rms_eps = keys.f32("attention.layer_norm_rms_epsilon")?;
        let attn_scale = keys
            .f32_opt("attention.scale")
            .filter(|&s| s != 0.0)
            .unwrap_or(1.0 / (head_dim_k as f32).sqrt());
        let n_rot = keys.usize_or("rope.dimension_count", head_dim_k)?;
        if n_rot > head_dim_k || n_rot % 2 != 0 {
            return Err(ModelError::BadKey {
                key: format!("{name}.rope.dimension_count"),
                detail: format!("{n_rot} rotated dims for heads of {head_dim_k}"),
            });
        }
        let mode = match arch {
            Arch::Llama => RopeMode::Normal,
            Arch::Qwen2 | Arch::Qwen3 => RopeMode::Neox,
            Arch::Qwen35 => {
                let mut sections = [0u32; 4];
                if let Some(v) = md.get_u32_vec(&format!("{name}.rope.dimension_sections")) {
                    for (d, s) in sections.iter_mut().zip(v) {
                        *d = s;
                    }
                }
                RopeMode::Mrope {
                    sections,
                    interleaved: true,
                }
            }
        };
        let freq_scale = match md.get_str(&format!("{name}.rope.scaling.type")) {
            None | Some("none") => 1.0,
            Some("linear") => {
                let f = keys.f32_opt("rope.scaling.factor").unwrap_or(1.0);
                if f > 0.0 {
                    1.0 / f
                } else {
                    1.0
                }
            }
            Some(other) => {
                tracing::warn!(
                    scaling = other,
                    "rope scaling type is not implemented; using unscaled RoPE"
                );
                1.0
            }
        };
        let rope = RopeParams {
            mode,
            n_rot,
            freq_base: keys.f32_opt("rope.freq_base").unwrap_or(10000.0),
            freq_scale,
            freq_factors: None,
        };
        let (recurrent_layers, ssm) = if arch == Arch::Qwen35 {
            let ssm = SsmConfig {
                d_conv: keys.usize("ssm.conv_kernel")?,
                d_state: keys.usize("ssm.state_size")?,
                n_k_heads: keys.usize("ssm.group_count")?,
                n_v_heads: keys.usize("ssm.time_step_rank")?,
                d_inner: keys.usize("ssm.inner_size")?,
            };
            if ssm.d_conv == 0
                || ssm.n_k_heads == 0
                || ssm.n_v_heads == 0
                || ssm.d_state == 0
                || !ssm.n_v_heads.is_multiple_of(ssm.n_k_heads)
                || !ssm.d_inner.is_multiple_of(ssm.n_v_heads)
                || ssm.d_v() != ssm.d_state
            {
                return Err(ModelError::BadKey {
                    key: format!("{name}.ssm.*"),
                    detail: format!("{ssm:?}"),
                });
            }
            (recurrent_pattern(md, name, n_layer)?, Some(ssm))
        } else {
            (vec![false; n_layer], None)
        };
        Ok(ModelConfig {
            arch,
            n_vocab,
            n_ctx_train: keys.usize_or("context_length", 4096)?,
            n_embd,
            n_layer,
            n_ff: keys.usize("feed_forward_length")?,
            n_head,
            n_head_kv,
            head_dim_k,
            head_dim_v,
            rms_eps,
            attn_scale,
            rope,
            recurrent_layers,
            ssm,
            n_mtp_layer,
        })
    }
}

/// `attention.recurrent_layers` (bool per layer) if present, else every
/// `full_attention_interval`-th layer is full attention (llama.cpp's default interval is 4).
fn recurrent_pattern(md: &Metadata, arch: &str, n_layer: usize) -> Result<Vec<bool>, ModelError> {
    let key = format!("{arch}.attention.recurrent_layers");
    if let Some(a) = md.get_array(&key) {
        let v: Vec<bool> = match a {
            gguf::Array::Bool(b) => b.clone(),
            other => other
                .to_integers()
                .ok_or_else(|| ModelError::BadKey {
                    key: key.clone(),
                    detail: "not a bool array".into(),
                })?
                .into_iter()
                .map(|x| x != 0)
                .collect(),
        };
        if v.len() < n_layer {
            return Err(ModelError::BadKey {
                key,
                detail: format!("{} entries for {n_layer} layers", v.len()),
            });
        }
        return Ok(v[..n_layer].to_vec());
    }
    let interval = md
        .get_u32(&format!("{arch}.full_attention_interval"))
        .unwrap_or(4)
        .max(1) as usize;
    Ok((0..n_layer).map(|i| (i + 1) % interval != 0).collect())
}

/// `{arch}.`-prefixed metadata lookups with typed errors.
struct Keys<'a> {
    md: &'a Metadata,
    arch: &'a str,
}

impl Keys<'_> {
    fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }

    fn usize_opt(&self, k: &str) -> Result<Option<usize>, ModelError> {
        let key = self.key(k);
        match self.md.get(&key) {
            None => Ok(None),
            Some(_) => self
                .md
                .get_u64(&key)
                .map(|v| Some(v as usize))
                .ok_or(ModelError::MissingKey(key)),
        }
    }

    fn usize(&self, k: &str) -> Result<usize, ModelError> {
        self.usize_opt(k)?
            .ok_or_else(|| ModelError::MissingKey(self.key(k)))
    }

    fn usize_or(&self, k: &str, default: usize) -> Result<usize, ModelError> {
        Ok(self.usize_opt(k)?.unwrap_or(default))
    }

    fn f32_opt(&self, k: &str) -> Option<f32> {
        self.md.get_f32(&self.key(k))
    }

    fn f32(&self, k: &str) -> Result<f32, ModelError> {
        self.f32_opt(k)
            .ok_or_else(|| ModelError::MissingKey(self.key(k)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gguf::Value;

    #[test]
    fn recurrent_pattern_from_interval_or_array() {
        let mut md = Metadata::new();
        md.insert("qwen35.full_attention_interval", Value::U32(4));
        let p = recurrent_pattern(&md, "qwen35", 8).unwrap();
        assert_eq!(p, [true, true, true, false, true, true, true, false]);
        // The explicit per-layer array wins over the interval.
        md.insert(
            "qwen35.attention.recurrent_layers",
            Value::Array(gguf::Array::Bool(vec![true, false, true, false])),
        );
        assert_eq!(
            recurrent_pattern(&md, "qwen35", 4).unwrap(),
            [true, false, true, false]
        );
        assert!(recurrent_pattern(&md, "qwen35", 5).is_err());
        // Default interval 4.
        assert_eq!(
            recurrent_pattern(&Metadata::new(), "qwen35", 4).unwrap(),
            [true, true, true, false]
        );
    }
}
