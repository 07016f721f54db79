//! "What would fit": the largest context per KV-cache type, and for each common quantization of
//! this model (its own tensor table under llama.cpp's mixes) whether it fits and how fast it
//! could decode.

use backend::KvType;
use serde::Serialize;

use super::{plan_placement, GpuSpec, ModelMemory, PlanOptions};
use crate::synth::FileType;

/// The largest context that fits with one KV-cache type (K and V alike).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ContextOption {
    pub cache_type: String,
    /// Largest context of the ladder (total over all slots) that fits fully; None if even the
    /// smallest does not.
    pub max_ctx: Option<usize>,
}

/// One quantization of this model.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QuantOption {
    pub file_type: String,
    /// Tensor bytes of the file.
    pub weight_bytes: u64,
    /// Fits fully at the requested context and cache types.
    pub fits: bool,
    /// Largest context that fits fully with q8_0 K and V.
    pub max_ctx_q8_0: Option<usize>,
    /// bandwidth / bytes read per token, everything on the GPU.
    pub ceiling_tok_s: f64,
    /// Predicted at the requested context (partly on the CPU when it does not fit).
    pub expected_tok_s: f64,
    pub layers_on_gpu: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Suggestions {
    /// The model as it is, per KV type.
    pub contexts: Vec<ContextOption>,
    pub quants: Vec<QuantOption>,
}

/// KV types offered as cheaper alternatives, largest first.
pub const KV_TYPES: [KvType; 3] = [KvType::F16, KvType::Q8_0, KvType::Q4_0];

/// Context ladder: 512, 1K, 2K … up to n_ctx_train per slot, times the slots.
/// Both are clamped so every entry stays within [`super::MAX_CTX`].
pub fn context_ladder(n_ctx_train: usize, n_parallel: usize) -> Vec<usize> {
    let slots = n_parallel.clamp(1, super::MAX_PARALLEL);
    let top = n_ctx_train.clamp(512, super::MAX_CTX);
    let mut v = Vec::new();
    let mut c = 512usize;
    while c <= top && c * slots <= super::MAX_CTX {
        v.push(c * slots);
        c *= 2;
    }
    v
}

/// Largest ladder context at which `m` fits fully on `gpu` with `kv` for K and V.
pub fn max_fitting_ctx(
    m: &ModelMemory,
    gpu: &GpuSpec,
    opts: &PlanOptions,
    kv: KvType,
) -> Option<usize> {
    let mut best = None;
    for ctx in context_ladder(m.n_ctx_train, opts.n_parallel) {
        let o = PlanOptions {
            n_ctx: ctx,
            cache_type_k: kv,
            cache_type_v: kv,
            n_gpu_layers: None,
            ..opts.clone()
        };
        if plan_placement(m, Some(gpu), &o).fits {
            best = Some(ctx);
        } else {
            break;
        }
    }
    best
}

pub fn suggestions(m: &ModelMemory, gpu: &GpuSpec, opts: &PlanOptions) -> Suggestions {
    let auto = PlanOptions {
        n_gpu_layers: None,
        ..opts.clone()
    };
    let contexts = KV_TYPES
        .iter()
        .map(|&kv| ContextOption {
            cache_type: kv.to_string(),
            max_ctx: max_fitting_ctx(m, gpu, &auto, kv),
        })
        .collect();
    let quants = FileType::COMMON_QUANTS
        .iter()
        .map(|&ft| {
            let q = m.requantized(ft);
            let p = plan_placement(&q, Some(gpu), &auto);
            QuantOption {
                file_type: ft.name().to_owned(),
                weight_bytes: q.total_bytes(),
                fits: p.fits,
                max_ctx_q8_0: max_fitting_ctx(&q, gpu, &auto, KvType::Q8_0),
                ceiling_tok_s: p.ceiling_tok_s,
                expected_tok_s: p.expected_tok_s,
                layers_on_gpu: p.layers_on_gpu,
            }
        })
        .collect();
    Suggestions { contexts, quants }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ladder_doubles_up_to_the_training_context() {
        assert_eq!(context_ladder(4096, 1), vec![512, 1024, 2048, 4096]);
        assert_eq!(context_ladder(3000, 2), vec![1024, 2048, 4096]);
        assert_eq!(context_ladder(100, 1), vec![512]);
        assert_eq!(context_ladder(262144, 1).len(), 10);
    }
}
