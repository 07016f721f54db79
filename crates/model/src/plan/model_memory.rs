//! What the planner needs to know about a model: its tensor table (name, dims, type, bytes) and
//! the hyperparameters that size its caches, read from a GGUF file or from a built-in shape.

use gguf::{GgmlType, GgufFile};
use serde::Serialize;

use crate::synth::{plan_types, FileType, Shape, SynthPlan};
use crate::{ModelConfig, ModelError};

/// One tensor as the planner sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanTensor {
    pub name: String,
    /// ggml order: dims[0] is the row length.
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    pub n_bytes: u64,
}

/// Gated DeltaNet geometry: what one sequence's recurrent state holds per layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RecurrentDims {
    pub conv_kernel: usize,
    /// Channels of the causal conv (q, k and v of the fused projection).
    pub conv_channels: usize,
    pub n_v_heads: usize,
    pub head_k_dim: usize,
    pub head_v_dim: usize,
}

/// Which part of the model a tensor belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorGroup {
    /// `blk.N.*` of a main layer.
    Layer(usize),
    /// `blk.N.*` past the main layers: multi-token-prediction (draft) layers.
    Mtp(usize),
    /// The token-embedding table when it is not also the output head (lookup only: one row per
    /// token is read, so it stays in host memory and does not count as bytes read per token).
    TokenEmbedding,
    /// Output head, final norm and any other global tensor.
    Head,
}

/// A model's tensor table and cache-sizing hyperparameters.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelMemory {
    /// `general.name`, or the shape preset name.
    pub name: String,
    pub arch: String,
    /// The llama.cpp file type (`general.file_type`) when known.
    pub file_type: Option<String>,
    /// Main layers (MTP layers excluded).
    pub n_layer: usize,
    /// Multi-token-prediction layers stored after the main ones (`nextn_predict_layers`).
    pub n_mtp_layer: usize,
    pub n_embd: usize,
    /// Widest FFN hidden size.
    pub n_ff: usize,
    pub n_vocab: usize,
    pub n_ctx_train: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim_k: usize,
    pub head_dim_v: usize,
    /// Per main layer: true for a recurrent (DeltaNet) layer, which has no KV cache.
    pub recurrent: Vec<bool>,
    pub deltanet: Option<RecurrentDims>,
    pub tensors: Vec<PlanTensor>,
}

impl ModelMemory {
    /// Reads the tensor table and hyperparameters of a GGUF file (nothing is loaded).
    pub fn from_gguf(file: &GgufFile) -> Result<ModelMemory, ModelError> {
        let c = ModelConfig::from_gguf(file)?;
        let md = file.metadata();
        let arch = c.arch.name();
        // llama.cpp stores MTP ("NextN") layers as the last blocks and counts them in
        // block_count; ModelConfig already splits them off (n_layer = main layers only).
        let n_mtp_layer = c.n_mtp_layer;
        let n_layer = c.n_layer;
        let tensors: Vec<PlanTensor> = file
            .tensors()
            .iter()
            .map(|t| PlanTensor {
                name: t.name.clone(),
                dims: t.dims.clone(),
                ty: t.ty,
                n_bytes: t.n_bytes,
            })
            .collect();
        let widest_ffn = tensors
            .iter()
            .filter(|t| t.name.ends_with("ffn_up.weight"))
            .filter_map(|t| t.dims.get(1).map(|&d| d as usize))
            .max()
            .unwrap_or(c.n_ff);
        let file_type = match md.get_u32("general.file_type") {
            Some(id) => gguf::file_type_name(id).map(str::to_owned),
            None => guess_file_type(&tensors),
        };
        let m = ModelMemory {
            name: md.get_str("general.name").unwrap_or(arch).to_owned(),
            arch: arch.to_owned(),
            file_type,
            n_layer,
            n_mtp_layer,
            n_embd: c.n_embd,
            n_ff: widest_ffn.max(c.n_ff),
            n_vocab: c.n_vocab,
            n_ctx_train: c.n_ctx_train,
            n_head: c.n_head,
            n_head_kv: c.n_head_kv,
            head_dim_k: c.head_dim_k,
            head_dim_v: c.head_dim_v,
            recurrent: c.recurrent_layers[..n_layer].to_vec(),
            deltanet: c.ssm.map(|s| RecurrentDims {
                conv_kernel: s.d_conv,
                conv_channels: s.conv_channels(),
                n_v_heads: s.n_v_heads,
                head_k_dim: s.d_state,
                head_v_dim: s.d_v(),
            }),
            tensors,
        };
        m.check_bounds()?;
        Ok(m)
    }

    /// Rejects hyperparameters far beyond any real model, so the planner's byte arithmetic
    /// (products of these with contexts up to [`super::MAX_CTX`]) stays well inside u64.
    fn check_bounds(&self) -> Result<(), ModelError> {
        let bad = |what: &str, v: usize| ModelError::BadKey {
            key: format!("{}.{what}", self.arch),
            detail: format!("{v} is beyond what the memory planner accepts"),
        };
        let limits = [
            ("block_count", self.n_layer, 1 << 12),
            ("embedding_length", self.n_embd, 1 << 24),
            ("feed_forward_length", self.n_ff, 1 << 24),
            ("vocab_size", self.n_vocab, 1 << 26),
            (
                "attention.head_count × key_length",
                self.n_head
                    .saturating_mul(self.head_dim_k.max(self.head_dim_v)),
                1 << 20,
            ),
            (
                "attention.head_count_kv × key_length",
                self.n_head_kv
                    .saturating_mul(self.head_dim_k.max(self.head_dim_v)),
                1 << 20,
            ),
        ];
        for (what, v, max) in limits {
            if v > max {
                return Err(bad(what, v));
            }
        }
        if let Some(d) = &self.deltanet {
            let state = d
                .n_v_heads
                .saturating_mul(d.head_k_dim)
                .saturating_mul(d.head_v_dim);
            let conv = d.conv_kernel.saturating_mul(d.conv_channels);
            if state > 1 << 28 || conv > 1 << 28 {
                return Err(bad("ssm.*", state.max(conv)));
            }
        }
        Ok(())
    }

    /// A built-in real shape quantized as `ftype` (llama.cpp's mix), without writing a file.
    pub fn from_shape(shape: &Shape, ftype: FileType) -> ModelMemory {
        let synth = SynthPlan::new(shape.clone(), ftype);
        let tensors = synth
            .tensors
            .iter()
            .map(|t| PlanTensor {
                name: t.name.clone(),
                dims: t.dims.clone(),
                ty: t.ty,
                n_bytes: t.n_bytes(),
            })
            .collect();
        ModelMemory {
            name: shape.name.clone(),
            arch: shape.arch.name().to_owned(),
            file_type: Some(ftype.name().to_owned()),
            n_layer: shape.n_layer,
            n_mtp_layer: 0,
            n_embd: shape.n_embd,
            n_ff: shape.n_ff,
            n_vocab: shape.n_vocab,
            n_ctx_train: shape.n_ctx_train,
            n_head: shape.n_head,
            n_head_kv: shape.n_head_kv,
            head_dim_k: shape.head_dim,
            head_dim_v: shape.head_dim,
            recurrent: (0..shape.n_layer).map(|i| shape.is_recurrent(i)).collect(),
            deltanet: shape.deltanet.map(|d| RecurrentDims {
                conv_kernel: d.conv_kernel,
                conv_channels: d.conv_channels(),
                n_v_heads: d.n_v_heads,
                head_k_dim: d.head_k_dim,
                head_v_dim: d.head_v_dim,
            }),
            tensors,
        }
    }

    /// The same model as llama-quantize would write it for `ftype`: this model's own tensor
    /// table with the types of that quant mix.
    pub fn requantized(&self, ftype: FileType) -> ModelMemory {
        let table: Vec<(String, Vec<u64>)> = self
            .tensors
            .iter()
            .map(|t| (t.name.clone(), t.dims.clone()))
            .collect();
        let types = plan_types(&table, ftype);
        let tensors = table
            .into_iter()
            .zip(types)
            .map(|((name, dims), ty)| {
                let n: u64 = dims.iter().product();
                // plan_types only picks types whose block divides the row; round up regardless.
                let n_bytes = ty
                    .bytes_for(n)
                    .unwrap_or_else(|| n.div_ceil(ty.block_size() as u64) * ty.type_size() as u64);
                PlanTensor {
                    name,
                    dims,
                    ty,
                    n_bytes,
                }
            })
            .collect();
        ModelMemory {
            file_type: Some(ftype.name().to_owned()),
            tensors,
            ..self.clone()
        }
    }

    /// Whether the input embedding is also the output head (no `output.weight`).
    pub fn tied_embeddings(&self) -> bool {
        !self.tensors.iter().any(|t| t.name == "output.weight")
    }

    /// Which part of the model `name` belongs to (layer from its `blk.N.` prefix).
    pub fn group_of(&self, name: &str) -> TensorGroup {
        if name == "token_embd.weight" && !self.tied_embeddings() {
            return TensorGroup::TokenEmbedding;
        }
        let layer = name
            .strip_prefix("blk.")
            .and_then(|rest| rest.split('.').next())
            .and_then(|n| n.parse::<usize>().ok());
        match layer {
            Some(il) if il < self.n_layer => TensorGroup::Layer(il),
            Some(il) => TensorGroup::Mtp(il),
            None => TensorGroup::Head,
        }
    }

    /// Bytes of every tensor in `group`.
    pub fn group_bytes(&self, group: TensorGroup) -> u64 {
        self.tensors
            .iter()
            .filter(|t| self.group_of(&t.name) == group)
            .map(|t| t.n_bytes)
            .sum()
    }

    /// Weight bytes of each main layer, in order.
    pub fn layer_bytes(&self) -> Vec<u64> {
        let mut v = vec![0u64; self.n_layer];
        for t in &self.tensors {
            if let TensorGroup::Layer(il) = self.group_of(&t.name) {
                v[il] += t.n_bytes;
            }
        }
        v
    }

    /// Bytes of all MTP layers.
    pub fn mtp_bytes(&self) -> u64 {
        self.tensors
            .iter()
            .filter(|t| matches!(self.group_of(&t.name), TensorGroup::Mtp(_)))
            .map(|t| t.n_bytes)
            .sum()
    }

    /// Bytes of all tensors (the file's tensor data without alignment padding).
    pub fn total_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.n_bytes).sum()
    }

    pub fn n_params(&self) -> u64 {
        self.tensors
            .iter()
            .map(|t| t.dims.iter().product::<u64>())
            .sum()
    }

    /// Attention (KV-cached) layers among the main layers.
    pub fn n_attention_layers(&self) -> usize {
        self.recurrent.iter().filter(|&&r| !r).count()
    }

    pub fn n_recurrent_layers(&self) -> usize {
        self.recurrent.iter().filter(|&&r| r).count()
    }
}

/// For a file without `general.file_type`: the type most of its 2-D weights have, as
/// llama.cpp guesses it ("F32 (guessed)"); `None` for a file without 2-D weights.
fn guess_file_type(tensors: &[PlanTensor]) -> Option<String> {
    let mut counts: Vec<(gguf::GgmlType, usize)> = Vec::new();
    for t in tensors.iter().filter(|t| t.dims.len() >= 2) {
        match counts.iter_mut().find(|(ty, _)| *ty == t.ty) {
            Some((_, n)) => *n += 1,
            None => counts.push((t.ty, 1)),
        }
    }
    // first of the most common, so ties go to the type met first in the file
    let mut best: Option<(gguf::GgmlType, usize)> = None;
    for &(ty, n) in &counts {
        if best.is_none_or(|(_, b)| n > b) {
            best = Some((ty, n));
        }
    }
    best.map(|(ty, _)| format!("{} (guessed)", ty.name().to_uppercase()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_without_file_type_gets_the_common_weight_type_guessed() {
        let t = |name: &str, dims: &[u64], ty| PlanTensor {
            name: name.into(),
            dims: dims.to_vec(),
            ty,
            n_bytes: 0,
        };
        let tensors = [
            t("blk.0.attn_norm.weight", &[64], GgmlType::F32),
            t("blk.0.attn_q.weight", &[64, 64], GgmlType::Q4K),
            t("blk.0.ffn_down.weight", &[128, 64], GgmlType::Q6K),
            t("blk.0.ffn_up.weight", &[64, 128], GgmlType::Q4K),
            t("output.weight", &[64, 512], GgmlType::Q6K),
            t("token_embd.weight", &[64, 512], GgmlType::Q4K),
        ];
        assert_eq!(guess_file_type(&tensors).as_deref(), Some("Q4_K (guessed)"));
        assert_eq!(guess_file_type(&tensors[..1]), None);
        // the bundled stories260K has no general.file_type and only F32 tensors
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/stories260K.gguf");
        let f = gguf::GgufFile::open(path).unwrap();
        let m = ModelMemory::from_gguf(&f).unwrap();
        assert_eq!(m.file_type.as_deref(), Some("F32 (guessed)"));
    }

    #[test]
    fn groups_partition_the_tensor_table() {
        let m = ModelMemory::from_shape(&Shape::qwen3_5_27b(), FileType::Q4KM);
        let layers: u64 = m.layer_bytes().iter().sum();
        let head = m.group_bytes(TensorGroup::Head);
        let embd = m.group_bytes(TensorGroup::TokenEmbedding);
        assert_eq!(layers + head + embd + m.mtp_bytes(), m.total_bytes());
        // token_embd Q4_K: 248320 rows × 5120 / 256 × 144 bytes
        assert_eq!(embd, 248320 * 20 * 144);
        // output Q6_K (210 bytes / 256) + output_norm f32
        assert_eq!(head, 248320 * 20 * 210 + 5120 * 4);
        assert_eq!(m.group_of("blk.63.ffn_up.weight"), TensorGroup::Layer(63));
        assert_eq!(
            m.group_of("blk.64.nextn.eh_proj.weight"),
            TensorGroup::Mtp(64)
        );
        assert_eq!(m.group_of("blk.x.weird"), TensorGroup::Head);
        assert_eq!(m.n_attention_layers(), 16);
        assert_eq!(m.n_recurrent_layers(), 48);
    }

    #[test]
    fn requantized_shape_equals_the_synth_mix() {
        let m = ModelMemory::from_shape(&Shape::qwen2_5_32b(), FileType::Q8_0);
        for ftype in FileType::COMMON_QUANTS {
            let direct = ModelMemory::from_shape(&Shape::qwen2_5_32b(), ftype);
            assert_eq!(m.requantized(ftype), direct, "{}", ftype.name());
        }
    }

    #[test]
    fn tied_embedding_is_the_head() {
        let shape = Shape {
            tied_embeddings: true,
            ..Shape::qwen2_5_1_5b()
        };
        let m = ModelMemory::from_shape(&shape, FileType::Q4KM);
        assert!(m.tied_embeddings());
        assert_eq!(m.group_of("token_embd.weight"), TensorGroup::Head);
        assert_eq!(m.group_bytes(TensorGroup::TokenEmbedding), 0);
    }
}
