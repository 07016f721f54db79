//! The memory planner: a pure function of (model, device, options) that says where every byte
//! goes, how many layers fit on the GPU, and how fast decoding can be.
//!
//! Decoding one token reads every weight once (except the token-embedding table, of which one
//! row is read), plus the KV cache and recurrent state at that depth, so
//! `tok/s ≤ bandwidth / bytes read per token`. When a layer does not fit in VRAM it runs from
//! host memory, and its bytes are read at host speed:
//! `time per token = GPU bytes / GPU bandwidth + host bytes / host bandwidth`.
//!
//! Placement: fixed costs first (runtime context, compute buffers), then the output head (read
//! every token, and where the logits are made), then the layers from the last one down (MTP
//! blocks first: they go with the output), each with its own KV cache or recurrent state, until
//! VRAM runs out; the rest stay on the CPU. That is llama.cpp's `-ngl N` convention (the GPU
//! takes the last N of the `n_layer + 1` positions), which `cuda::hybrid::Placement::from_ngl`
//! follows: the hidden state crosses to the GPU once per token. The token-embedding table
//! always stays in host memory (decode looks up one row). "Layers" in `X/Y` count the output
//! head as one, as llama.cpp's "offloaded X/Y layers" does.
//!
//! ```
//! use model::plan::{plan, GpuSpec, ModelMemory, PlanOptions};
//! use model::synth::{FileType, Shape};
//! let m = ModelMemory::from_shape(&Shape::qwen3_5_27b(), FileType::IQ4XS);
//! let gpu = GpuSpec::from_table("v100-16gb").unwrap();
//! let p = plan(&m, Some(&gpu), &PlanOptions::for_model(&m));
//! assert!(p.fits);
//! ```

pub mod buffers;
pub mod draft;
pub mod fit;
pub mod gpus;
pub mod model_memory;
pub mod split;
pub mod suggest;

use backend::KvType;
use serde::Serialize;

pub use buffers::{ComputeBytes, RUNTIME_OVERHEAD_BYTES};
pub use draft::{DraftBytes, Speculation};
pub use fit::{fit, Fit, FitMode, FitRefusal, FitRequest};
pub use gpus::GpuSpec;
pub use model_memory::{ModelMemory, PlanTensor, RecurrentDims, TensorGroup};
pub use split::{fit_split, plan_split, CardPlan, SplitFit, SplitMode, SplitPlan, SplitRequest};
pub use suggest::{ContextOption, QuantOption, Suggestions};

/// Effective read bandwidth of CPU matvec over host memory, GB/s, when layers run on the CPU.
/// The H200 host of shared/BENCHMARKING.md decoding Qwen3.5-27B Q4_K_M with 8 of 64 layers (and
/// the output head) on 16 cores gave 16.9 tok/s: ~3 GB of host weights per token in ~55 ms, i.e.
/// ~50 GB/s; a desktop with dual-channel DDR4/DDR5 reads 40–70 GB/s. 50 is the default;
/// `--host-bandwidth` overrides it.
pub const DEFAULT_HOST_BANDWIDTH_GBS: f64 = 50.0;

/// Largest context, slot count and micro-batch the planner computes with (larger values are
/// clamped), which keeps every byte count inside u64.
pub const MAX_CTX: usize = 1 << 26;
pub const MAX_PARALLEL: usize = 1 << 16;
pub const MAX_UBATCH: usize = 1 << 16;

/// Per-slot context used when none is given (as `redline serve` does).
pub const DEFAULT_CTX_PER_SLOT: usize = 4096;

/// What to plan for.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanOptions {
    /// KV positions over all slots (`-c`); each slot gets `n_ctx / n_parallel`.
    pub n_ctx: usize,
    /// Concurrent sequences (slots); each has its own recurrent state.
    pub n_parallel: usize,
    pub cache_type_k: KvType,
    pub cache_type_v: KvType,
    /// Micro-batch rows per forward call (sizes the compute buffers).
    pub n_ubatch: usize,
    /// Device memory the runtime takes, measured at load; None: the GPU table's estimate
    /// ([`GpuSpec::runtime_overhead_bytes`]).
    pub runtime_overhead_bytes: Option<u64>,
    pub host_bandwidth_gbs: f64,
    /// Whether the MTP layers are loaded (for self-speculative decoding).
    pub use_mtp: bool,
    /// Force this many layers (output head first, then blocks in order) onto the GPU.
    pub n_gpu_layers: Option<usize>,
    /// Keep the token-embedding table in VRAM too (a backend that looks rows up on the GPU).
    /// Default false, as llama.cpp: decode reads one row per token, so host memory serves it.
    pub embeddings_on_gpu: bool,
    /// Speculative decoding: a draft model and its cache, and the target's verify buffers,
    /// placed whole on the GPU as fixed costs (see [`draft`]).
    pub speculation: Option<Speculation>,
}

impl PlanOptions {
    /// Defaults for `m`: one slot of min(n_ctx_train, 4096) tokens, f16 KV, micro-batch 512.
    pub fn for_model(m: &ModelMemory) -> PlanOptions {
        PlanOptions {
            n_ctx: m.n_ctx_train.clamp(1, DEFAULT_CTX_PER_SLOT),
            n_parallel: 1,
            cache_type_k: KvType::F16,
            cache_type_v: KvType::F16,
            n_ubatch: buffers::DEFAULT_UBATCH,
            runtime_overhead_bytes: None,
            host_bandwidth_gbs: DEFAULT_HOST_BANDWIDTH_GBS,
            use_mtp: false,
            n_gpu_layers: None,
            embeddings_on_gpu: false,
            speculation: None,
        }
    }
}

/// Where a part of the model lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    Gpu,
    Host,
}

/// What kind of block a layer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LayerKind {
    Attention,
    Recurrent,
    Mtp,
}

/// One block and where it goes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LayerPlan {
    pub index: usize,
    pub kind: LayerKind,
    pub weight_bytes: u64,
    /// Its KV cache at the full context (attention) or state of every slot (recurrent).
    pub cache_bytes: u64,
    pub device: Device,
}

/// Every byte, by kind. Sums over all layers, wherever they are placed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Ledger {
    /// Weights of the main layers.
    pub layer_weights: u64,
    /// Output head, final norm and other global tensors.
    pub output_head: u64,
    /// Token-embedding table (host memory; not read per token).
    pub token_embedding: u64,
    /// MTP layers (counted in memory only when used).
    pub mtp_weights: u64,
    pub kv_cache: u64,
    pub recurrent_state: u64,
    pub compute: ComputeBytes,
    pub runtime_overhead: u64,
    /// Draft model weights (`-md`; its MTP layers excluded), on the GPU with the fixed costs.
    pub draft_weights: u64,
    /// The draft model's KV cache at `n_ctx` plus its recurrent state and one snapshot.
    pub draft_cache: u64,
    /// Speculation's extras on the target: a recurrent-state snapshot and the verify logits
    /// `[draft_max + 1, n_vocab]` f32, per slot.
    pub speculation_buffers: u64,
    /// Host memory (page-locked) the GPU's logits are copied into when a step needs whole rows
    /// on the host (penalties, logprobs, a grammar: sampling that device-side picks cannot
    /// serve): `[n_ubatch, n_vocab]` f32 rounded up to a power of two, at most
    /// [`LOGITS_DOWNLOAD_MAX_FLOATS`] floats (larger downloads go through pageable memory and
    /// are counted with the compute buffers' logits). 0 on a CPU plan.
    pub logits_download: u64,
}

/// Most floats of the page-locked logits download buffer (32 MiB; the CUDA backend's cap).
pub const LOGITS_DOWNLOAD_MAX_FLOATS: usize = 8 << 20;

/// Bytes the page-locked logits buffer can grow to when downloads are at most `floats` logits:
/// the largest one that fits the cap, rounded up to a power of two (the buffer grows that way).
pub fn logits_download_bytes(floats: usize) -> u64 {
    if floats == 0 {
        0
    } else {
        4 * floats.next_power_of_two().min(LOGITS_DOWNLOAD_MAX_FLOATS) as u64
    }
}

impl Ledger {
    /// Everything speculative decoding adds beside the MTP layer.
    pub fn speculation_total(&self) -> u64 {
        self.draft_weights + self.draft_cache + self.speculation_buffers
    }
}

/// The planner's answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plan {
    pub model: String,
    pub arch: String,
    pub file_type: Option<String>,
    pub n_params: u64,
    pub n_layer: usize,
    pub n_attention_layers: usize,
    pub n_recurrent_layers: usize,
    pub n_mtp_layers: usize,
    pub n_ctx_train: usize,
    /// None: a CPU-only plan.
    pub gpu: Option<GpuSpec>,
    pub host_bandwidth_gbs: f64,
    pub n_ctx: usize,
    pub n_ctx_per_slot: usize,
    pub n_parallel: usize,
    pub cache_type_k: String,
    pub cache_type_v: String,
    pub n_ubatch: usize,
    /// The token-embedding table is counted in VRAM.
    pub embeddings_on_gpu: bool,
    /// KV bytes per token over all attention layers.
    pub kv_bytes_per_token: u64,
    /// Recurrent state bytes of one sequence.
    pub state_bytes_per_seq: u64,
    pub ledger: Ledger,
    pub layers: Vec<LayerPlan>,
    pub output_head_device: Device,
    /// GPU memory needed to hold everything (fixed costs, head, all layers and their caches).
    pub gpu_bytes_full: u64,
    /// GPU memory used by the placement below.
    pub gpu_bytes_placed: u64,
    /// Host memory the placement uses (embedding table, CPU layers and their caches).
    pub host_bytes_placed: u64,
    /// Everything fits on the GPU (false for a CPU-only plan).
    pub fits: bool,
    /// How much more GPU memory a full fit needs (0 when it fits).
    pub short_by_bytes: u64,
    /// Layers on the GPU, the output head counted as one.
    pub layers_on_gpu: usize,
    /// n_layer + 1 (the output head).
    pub layers_total: usize,
    /// Bytes read per decode step of one sequence at depth 0: all weights but the embedding
    /// table (and unused MTP layers), plus the recurrent state.
    pub bytes_per_token: u64,
    /// The same at a depth of `n_ctx_per_slot` (plus that many tokens of KV).
    pub bytes_per_token_full_ctx: u64,
    /// Decode ceiling with everything on the plan's device: bandwidth / bytes_per_token.
    pub ceiling_tok_s: f64,
    /// Bytes per token read from each side under this placement (depth 0).
    pub gpu_bytes_per_token: u64,
    pub host_bytes_per_token: u64,
    /// Predicted decode speed under this placement.
    pub expected_tok_s: f64,
    /// What would fit (GPU plans only).
    pub suggestions: Option<Suggestions>,
}

/// Plans `m` on `gpu` (None: CPU only), with suggestions of what would fit.
pub fn plan(m: &ModelMemory, gpu: Option<&GpuSpec>, opts: &PlanOptions) -> Plan {
    let mut p = plan_placement(m, gpu, opts);
    if let Some(g) = gpu {
        p.suggestions = Some(suggest::suggestions(m, g, opts));
    }
    p
}

/// Seconds per token for `gpu_bytes` read at GPU bandwidth and `host_bytes` at host bandwidth.
fn tok_per_s(gpu_bytes: u64, gpu_gbs: f64, host_bytes: u64, host_gbs: f64) -> f64 {
    let t = gpu_bytes as f64 / (gpu_gbs * 1e9) + host_bytes as f64 / (host_gbs * 1e9);
    if t > 0.0 {
        1.0 / t
    } else {
        f64::INFINITY
    }
}

/// The ledger and placement without suggestions.
pub fn plan_placement(m: &ModelMemory, gpu: Option<&GpuSpec>, opts: &PlanOptions) -> Plan {
    let n_parallel = opts.n_parallel.clamp(1, MAX_PARALLEL);
    let n_ctx = opts.n_ctx.clamp(1, MAX_CTX);
    let n_ubatch = opts.n_ubatch.clamp(1, MAX_UBATCH);
    let kv_per_layer_token =
        buffers::kv_bytes_per_token_per_layer(m, opts.cache_type_k, opts.cache_type_v);
    let state_per_layer = m
        .deltanet
        .as_ref()
        .map_or(0, buffers::recurrent_state_bytes_per_layer);
    let layer_weights = m.layer_bytes();
    let mut layers: Vec<LayerPlan> = layer_weights
        .iter()
        .enumerate()
        .map(|(i, &w)| {
            let recurrent = m.recurrent.get(i).copied().unwrap_or(false);
            LayerPlan {
                index: i,
                kind: if recurrent {
                    LayerKind::Recurrent
                } else {
                    LayerKind::Attention
                },
                weight_bytes: w,
                cache_bytes: if recurrent {
                    state_per_layer * n_parallel as u64
                } else {
                    kv_per_layer_token * n_ctx as u64
                },
                device: Device::Host,
            }
        })
        .collect();
    if opts.use_mtp && m.n_mtp_layer > 0 {
        // An MTP block is one full-attention layer with its own KV cache.
        layers.push(LayerPlan {
            index: m.n_layer,
            kind: LayerKind::Mtp,
            weight_bytes: m.mtp_bytes(),
            cache_bytes: kv_per_layer_token * n_ctx as u64 * m.n_mtp_layer as u64,
            device: Device::Host,
        });
    }
    let compute = buffers::compute_bytes(m, n_ubatch);
    let draft = opts
        .speculation
        .as_ref()
        .map_or(draft::DraftBytes::default(), |s| s.draft_bytes(n_ctx));
    let speculation_buffers = opts
        .speculation
        .as_ref()
        .map_or(0, |s| s.overhead_bytes(m, n_parallel));
    let runtime_overhead = match gpu {
        Some(g) => opts
            .runtime_overhead_bytes
            .unwrap_or(g.runtime_overhead_bytes),
        None => 0,
    };
    let ledger = Ledger {
        layer_weights: layer_weights.iter().sum(),
        output_head: m.group_bytes(TensorGroup::Head),
        token_embedding: m.group_bytes(TensorGroup::TokenEmbedding),
        mtp_weights: m.mtp_bytes(),
        kv_cache: kv_per_layer_token * n_ctx as u64 * m.n_attention_layers() as u64,
        recurrent_state: state_per_layer * m.n_recurrent_layers() as u64 * n_parallel as u64,
        compute,
        runtime_overhead,
        draft_weights: draft.weights,
        draft_cache: draft.kv_cache + draft.recurrent_state,
        speculation_buffers,
        logits_download: if gpu.is_some() {
            logits_download_bytes(n_ubatch * m.n_vocab)
        } else {
            0
        },
    };
    let embd_on_gpu = if opts.embeddings_on_gpu {
        ledger.token_embedding
    } else {
        0
    };
    let fixed = compute.total() + runtime_overhead + embd_on_gpu + ledger.speculation_total();
    let layers_need: u64 = layers.iter().map(|l| l.weight_bytes + l.cache_bytes).sum();
    let gpu_bytes_full = fixed + ledger.output_head + layers_need;

    // Place: head first, then layers in order, until the budget (or the forced count) runs out.
    let mut head_device = Device::Host;
    let mut layers_on_gpu = 0;
    let mut gpu_used = 0u64;
    if let Some(g) = gpu {
        let limit = opts.n_gpu_layers.unwrap_or(usize::MAX);
        let budget = g.usable_bytes;
        if fixed <= budget {
            gpu_used = fixed;
            let fits = |used: u64, need: u64| opts.n_gpu_layers.is_some() || used + need <= budget;
            if limit > 0 && fits(gpu_used, ledger.output_head) {
                head_device = Device::Gpu;
                gpu_used += ledger.output_head;
                layers_on_gpu = 1;
                for l in layers.iter_mut().rev() {
                    let need = l.weight_bytes + l.cache_bytes;
                    if layers_on_gpu >= limit || !fits(gpu_used, need) {
                        break;
                    }
                    l.device = Device::Gpu;
                    gpu_used += need;
                    layers_on_gpu += 1;
                }
            }
        }
        if head_device == Device::Host {
            gpu_used = 0;
        }
    }

    // Bytes read per token at depth 0: weights (not the embedding table) + one sequence's state.
    let state_read = |l: &LayerPlan| match l.kind {
        LayerKind::Recurrent => state_per_layer,
        _ => 0,
    };
    let mut gpu_read = 0u64;
    let mut host_read = 0u64;
    for l in &layers {
        let b = l.weight_bytes + state_read(l);
        match l.device {
            Device::Gpu => gpu_read += b,
            Device::Host => host_read += b,
        }
    }
    match head_device {
        Device::Gpu => gpu_read += ledger.output_head,
        Device::Host => host_read += ledger.output_head,
    }
    let bytes_per_token = gpu_read + host_read;
    let n_ctx_per_slot = n_ctx / n_parallel;
    let kv_read_full = kv_per_layer_token
        * n_ctx_per_slot as u64
        * layers
            .iter()
            .filter(|l| l.kind != LayerKind::Recurrent)
            .count() as u64;
    let device_gbs = gpu.map_or(opts.host_bandwidth_gbs, |g| g.bandwidth_gbs);
    let ceiling_tok_s = tok_per_s(bytes_per_token, device_gbs, 0, 1.0);
    let expected_tok_s = match gpu {
        Some(g) => tok_per_s(
            gpu_read,
            g.bandwidth_gbs,
            host_read,
            opts.host_bandwidth_gbs,
        ),
        None => ceiling_tok_s,
    };
    let host_layers: u64 = layers
        .iter()
        .filter(|l| l.device == Device::Host)
        .map(|l| l.weight_bytes + l.cache_bytes)
        .sum();
    let host_head = if head_device == Device::Host {
        ledger.output_head
    } else {
        0
    };
    let host_fixed = if gpu.is_none() {
        compute.total() + ledger.speculation_total()
    } else {
        0
    };
    let usable = gpu.map_or(0, |g| g.usable_bytes);
    Plan {
        model: m.name.clone(),
        arch: m.arch.clone(),
        file_type: m.file_type.clone(),
        n_params: m.n_params(),
        n_layer: m.n_layer,
        n_attention_layers: m.n_attention_layers(),
        n_recurrent_layers: m.n_recurrent_layers(),
        n_mtp_layers: m.n_mtp_layer,
        n_ctx_train: m.n_ctx_train,
        gpu: gpu.cloned(),
        host_bandwidth_gbs: opts.host_bandwidth_gbs,
        n_ctx,
        n_ctx_per_slot,
        n_parallel,
        cache_type_k: opts.cache_type_k.to_string(),
        cache_type_v: opts.cache_type_v.to_string(),
        n_ubatch,
        embeddings_on_gpu: opts.embeddings_on_gpu && gpu_used > 0,
        kv_bytes_per_token: kv_per_layer_token * m.n_attention_layers() as u64,
        state_bytes_per_seq: state_per_layer * m.n_recurrent_layers() as u64,
        ledger: ledger.clone(),
        layers,
        output_head_device: head_device,
        gpu_bytes_full,
        gpu_bytes_placed: gpu_used,
        host_bytes_placed: ledger.token_embedding - embd_on_gpu * u64::from(gpu_used > 0)
            + host_layers
            + host_head
            + host_fixed
            + ledger.logits_download * u64::from(gpu_used > 0),
        fits: gpu.is_some() && gpu_bytes_full <= usable,
        short_by_bytes: if gpu.is_some() {
            gpu_bytes_full.saturating_sub(usable)
        } else {
            0
        },
        layers_on_gpu,
        layers_total: m.n_layer + 1 + usize::from(opts.use_mtp && m.n_mtp_layer > 0),
        bytes_per_token,
        bytes_per_token_full_ctx: bytes_per_token + kv_read_full,
        ceiling_tok_s,
        gpu_bytes_per_token: gpu_read,
        host_bytes_per_token: host_read,
        expected_tok_s,
        suggestions: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::{FileType, Shape};
    use gguf::GgmlType;

    /// Qwen3.5-27B with one MTP block appended after the 64 main layers, as official files have.
    fn with_mtp() -> ModelMemory {
        let mut m = ModelMemory::from_shape(&Shape::qwen3_5_27b(), FileType::IQ4XS);
        m.n_mtp_layer = 1;
        for (name, dims) in [
            ("blk.64.nextn.eh_proj.weight", vec![10240u64, 5120]),
            ("blk.64.ffn_up.weight", vec![5120, 17408]),
        ] {
            let ty = GgmlType::Q8_0;
            let n_bytes = ty.bytes_for(dims.iter().product()).unwrap();
            m.tensors.push(PlanTensor {
                name: name.into(),
                dims,
                ty,
                n_bytes,
            });
        }
        m
    }

    /// The page-locked buffer the GPU's logits come down to is host memory of a GPU plan: the
    /// largest download it takes (n_ubatch rows of the vocabulary) rounded up to a power of
    /// two, at most 32 MiB; none on the CPU.
    #[test]
    fn logits_download_buffer_is_counted_on_the_host() {
        let m = ModelMemory::from_shape(&Shape::qwen3_5_27b(), FileType::Q4KM);
        assert_eq!(m.n_vocab, 248320);
        let gpu = GpuSpec::from_table("h100").unwrap();
        let mut o = PlanOptions::for_model(&m);
        o.n_ubatch = 1;
        let one = plan_placement(&m, Some(&gpu), &o);
        // 248320 floats -> 262144 (1 MiB)
        assert_eq!(one.ledger.logits_download, 4 * 262144);
        o.n_ubatch = 512;
        let big = plan_placement(&m, Some(&gpu), &o);
        assert_eq!(big.ledger.logits_download, 32 << 20);
        assert_eq!(
            big.host_bytes_placed,
            one.host_bytes_placed - one.ledger.logits_download + (32 << 20)
        );
        let cpu = plan_placement(&m, None, &o);
        assert_eq!(cpu.ledger.logits_download, 0);
    }

    #[test]
    fn mtp_layers_count_only_when_used() {
        let m = with_mtp();
        let mtp = m.mtp_bytes();
        assert_eq!(mtp, (10240 * 5120 + 5120 * 17408) / 32 * 34);
        let gpu = GpuSpec::from_table("h100").unwrap();
        let mut o = PlanOptions::for_model(&m);
        let off = plan_placement(&m, Some(&gpu), &o);
        assert_eq!(off.ledger.mtp_weights, mtp);
        assert_eq!(off.layers_total, 65);
        assert_eq!(off.layers.len(), 64);
        o.use_mtp = true;
        let on = plan_placement(&m, Some(&gpu), &o);
        assert_eq!(on.layers_total, 66);
        assert_eq!(on.layers_on_gpu, 66);
        let kv_layer = buffers::kv_bytes_per_token_per_layer(&m, KvType::F16, KvType::F16);
        assert_eq!(
            on.gpu_bytes_full,
            off.gpu_bytes_full + mtp + kv_layer * o.n_ctx as u64
        );
        assert_eq!(on.bytes_per_token, off.bytes_per_token + mtp);
    }

    #[test]
    fn forced_layers_ignore_the_budget_and_cpu_plans_place_nothing() {
        let m = ModelMemory::from_shape(&Shape::qwen2_5_32b(), FileType::Q4KM);
        let gpu = GpuSpec::from_table("t4").unwrap();
        let mut o = PlanOptions::for_model(&m);
        o.n_gpu_layers = Some(65);
        let p = plan_placement(&m, Some(&gpu), &o);
        assert_eq!(p.layers_on_gpu, 65);
        assert!(p.gpu_bytes_placed > gpu.usable_bytes);
        o.n_gpu_layers = Some(0);
        let p = plan_placement(&m, Some(&gpu), &o);
        assert_eq!(p.layers_on_gpu, 0);
        assert_eq!(p.gpu_bytes_per_token, 0);
        let cpu = plan(&m, None, &PlanOptions::for_model(&m));
        assert!(!cpu.fits && cpu.suggestions.is_none());
        assert!(cpu.layers.iter().all(|l| l.device == Device::Host));
        assert!((cpu.ceiling_tok_s - 50e9 / cpu.bytes_per_token as f64).abs() < 1e-9);
    }
}
