//! Memory that speculative decoding adds to a plan: a separate draft model (`-md`) placed
//! whole beside the target, and the target's own extras (a recurrent-state snapshot taken
//! before each verify pass, logits of every verified row). The MTP layer of a Qwen3.5 file
//! is counted by the main plan (`PlanOptions::use_mtp`). All in bytes.
//!
//! [`Speculation`] in [`super::PlanOptions::speculation`] puts these bytes in the ledger
//! (`Ledger::draft_weights`, `draft_cache`, `speculation_buffers`) and in the fit decision:
//! they are fixed costs placed on the GPU beside the output head (the draft model runs whole
//! on the GPU or not at all), so `--fit` reduces the context or offloads target layers to make
//! room for them, and `--fit gpu-only` refuses when the pair does not fit.

use backend::KvType;
use serde::Serialize;

use super::buffers::{kv_bytes_per_token, recurrent_state_bytes_per_seq};
use super::model_memory::ModelMemory;

/// Speculative decoding to plan for (`-md DRAFT.gguf` or `--mtp`).
#[derive(Debug, Clone, PartialEq)]
pub struct Speculation {
    /// The separate draft model (`-md`); None: the target drafts with its own MTP layer
    /// (`--mtp`; set `PlanOptions::use_mtp` too so that the layer is placed).
    pub draft: Option<Box<ModelMemory>>,
    /// KV cache type of the draft model (its cache holds the plan's whole `n_ctx`).
    pub draft_kv: KvType,
    /// Most tokens drafted per verify pass (sizes the verify logits).
    pub draft_max: usize,
}

impl Speculation {
    /// Draft model bytes at `n_ctx` (zero for MTP drafting).
    pub fn draft_bytes(&self, n_ctx: usize) -> DraftBytes {
        match &self.draft {
            Some(d) => draft_bytes(d, n_ctx, self.draft_kv),
            None => DraftBytes::default(),
        }
    }

    /// What speculation adds to `target` over `n_parallel` sequences.
    pub fn overhead_bytes(&self, target: &ModelMemory, n_parallel: usize) -> u64 {
        speculation_overhead_bytes(target, self.draft_max) * n_parallel as u64
    }
}

/// What a draft model costs on the device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct DraftBytes {
    /// Every tensor but its own MTP layers (a draft never drafts).
    pub weights: u64,
    /// KV cache of `n_ctx` positions, all attention layers.
    pub kv_cache: u64,
    /// Recurrent state of one sequence, plus one snapshot of it (hybrid drafts roll back).
    pub recurrent_state: u64,
}

impl DraftBytes {
    pub fn total(&self) -> u64 {
        self.weights + self.kv_cache + self.recurrent_state
    }
}

/// The device bytes of `draft` run beside the target with `n_ctx` positions, KV as `kv`.
pub fn draft_bytes(draft: &ModelMemory, n_ctx: usize, kv: KvType) -> DraftBytes {
    DraftBytes {
        weights: draft.total_bytes() - draft.mtp_bytes(),
        kv_cache: kv_bytes_per_token(draft, kv, kv) * n_ctx as u64,
        recurrent_state: 2 * recurrent_state_bytes_per_seq(draft),
    }
}

/// What speculation adds to the target itself per sequence: one recurrent-state snapshot
/// (hybrid models; taken before each verify pass) and logits `[draft_max + 1, n_vocab]` f32
/// of a verify pass (held on the host as well as on the device).
pub fn speculation_overhead_bytes(target: &ModelMemory, draft_max: usize) -> u64 {
    recurrent_state_bytes_per_seq(target) + 4 * (draft_max as u64 + 1) * target.n_vocab as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{LoadOptions, Model};

    const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

    /// The planner's cache + state bytes equal what `new_state` allocates (its own count)
    /// plus the one snapshot, on an attention-only and on a hybrid model.
    #[test]
    fn draft_cache_matches_the_allocated_state() {
        for path in [
            "models/stories260K.gguf",
            "tests/data/fixtures/qwen35/model-q8_0.gguf",
        ] {
            let path = std::path::Path::new(ROOT).join(path);
            let file = gguf::GgufFile::open(&path).unwrap();
            let mem = ModelMemory::from_gguf(&file).unwrap();
            let m = Model::load(&path, &LoadOptions::default()).unwrap();
            for kv in [KvType::F16, KvType::F32] {
                let d = draft_bytes(&mem, 256, kv);
                let state = m.new_state(256, kv).unwrap();
                let one_state = d.kv_cache + d.recurrent_state / 2;
                assert_eq!(one_state as usize, state.bytes(), "{} {kv}", path.display());
                assert_eq!(d.weights, mem.total_bytes());
                assert_eq!(
                    d.recurrent_state > 0,
                    m.config().is_hybrid(),
                    "{}",
                    path.display()
                );
            }
        }
    }

    /// stories260K drafting for itself: the ledger's draft lines, by hand from the file's
    /// tensor table and hyperparameters, and the plan's totals grow by exactly those bytes.
    #[test]
    fn stories260k_as_its_own_draft() {
        use crate::plan::{plan_placement, GpuSpec, PlanOptions};
        let path = std::path::Path::new(ROOT).join("models/stories260K.gguf");
        let file = gguf::GgufFile::open(&path).unwrap();
        let mem = ModelMemory::from_gguf(&file).unwrap();
        // Weights: every tensor's elements at its type's block size.
        let weights: u64 = file
            .tensors()
            .iter()
            .map(|t| t.ty.bytes_for(t.dims.iter().product()).unwrap())
            .sum();
        // KV: K and V rows of n_head_kv × head_dim f16 per layer and position.
        let (n_ctx, draft_max) = (256usize, 5usize);
        let kv = (2 * mem.n_layer * mem.n_head_kv * mem.head_dim_k * 2 * n_ctx) as u64;
        // Verify logits [draft_max + 1, n_vocab] f32; no recurrent layer, so no snapshot.
        let logits = (4 * (draft_max + 1) * mem.n_vocab) as u64;
        let mut o = PlanOptions::for_model(&mem);
        o.n_ctx = n_ctx;
        let alone_cpu = plan_placement(&mem, None, &o);
        let gpu = GpuSpec::from_table("h200").unwrap();
        let alone_gpu = plan_placement(&mem, Some(&gpu), &o);
        o.speculation = Some(Speculation {
            draft: Some(Box::new(mem.clone())),
            draft_kv: KvType::F16,
            draft_max,
        });
        for (p, alone) in [
            (plan_placement(&mem, None, &o), &alone_cpu),
            (plan_placement(&mem, Some(&gpu), &o), &alone_gpu),
        ] {
            assert_eq!(p.ledger.draft_weights, weights);
            assert_eq!(p.ledger.draft_cache, kv);
            assert_eq!(p.ledger.speculation_buffers, logits);
            assert_eq!(p.ledger.speculation_total(), weights + kv + logits);
            assert_eq!(
                p.gpu_bytes_full,
                alone.gpu_bytes_full + weights + kv + logits
            );
        }
        let cpu = plan_placement(&mem, None, &o);
        assert_eq!(
            cpu.host_bytes_placed,
            alone_cpu.host_bytes_placed + weights + kv + logits
        );
        let g = plan_placement(&mem, Some(&gpu), &o);
        assert!(g.fits);
        assert_eq!(
            g.gpu_bytes_placed,
            alone_gpu.gpu_bytes_placed + weights + kv + logits
        );
        // Decoding speed is the target's (drafting is not in the per-token bytes).
        assert_eq!(g.bytes_per_token, alone_gpu.bytes_per_token);
    }

    /// Qwen3.5-27B (IQ4_XS shape) with one Q8_0 MTP block, drafting with it (`--mtp`): the
    /// MTP layer and its KV are placed as a layer, the snapshot + verify logits as buffers.
    #[test]
    fn qwen35_27b_with_mtp() {
        use crate::plan::{plan_placement, GpuSpec, LayerKind, PlanOptions, PlanTensor};
        use crate::synth::{FileType, Shape};
        use gguf::GgmlType;
        let mut m = ModelMemory::from_shape(&Shape::qwen3_5_27b(), FileType::IQ4XS);
        m.n_mtp_layer = 1;
        for (name, dims) in [
            ("blk.64.nextn.eh_proj.weight", vec![10240u64, 5120]),
            ("blk.64.attn_q.weight", vec![5120, 12288]),
            ("blk.64.ffn_up.weight", vec![5120, 17408]),
        ] {
            let n_bytes = GgmlType::Q8_0.bytes_for(dims.iter().product()).unwrap();
            m.tensors.push(PlanTensor {
                name: name.into(),
                dims,
                ty: GgmlType::Q8_0,
                n_bytes,
            });
        }
        // Q8_0: 34 bytes per 32 elements.
        let mtp_weights = (10240 * 5120 + 5120 * 12288 + 5120 * 17408) / 32 * 34;
        // One attention layer of f16 K and V: 4 KV heads × 256 dims × 2 × 2 bytes per token.
        assert_eq!((m.n_head_kv, m.head_dim_k, m.head_dim_v), (4, 256, 256));
        let n_ctx = 4096u64;
        let mtp_kv = 4 * 256 * 2 * 2 * n_ctx;
        // Snapshot: 48 DeltaNet layers × (conv 3 × 10240 + 48 heads × 128 × 128) f32;
        // verify logits: 9 rows × n_vocab f32.
        let snapshot = 48 * 4 * (3 * 10240 + 48 * 128 * 128);
        assert_eq!(m.n_vocab, 248320);
        let logits = 4 * 9 * 248320u64;
        let gpu = GpuSpec::from_table("h200").unwrap();
        let mut o = PlanOptions::for_model(&m);
        o.n_ctx = n_ctx as usize;
        let alone = plan_placement(&m, Some(&gpu), &o);
        o.use_mtp = true;
        o.speculation = Some(Speculation {
            draft: None,
            draft_kv: KvType::F16,
            draft_max: 8,
        });
        let p = plan_placement(&m, Some(&gpu), &o);
        assert_eq!(p.ledger.mtp_weights, mtp_weights);
        assert_eq!((p.ledger.draft_weights, p.ledger.draft_cache), (0, 0));
        assert_eq!(p.ledger.speculation_buffers, snapshot + logits);
        let mtp = p.layers.last().unwrap();
        assert_eq!(mtp.kind, LayerKind::Mtp);
        assert_eq!((mtp.weight_bytes, mtp.cache_bytes), (mtp_weights, mtp_kv));
        assert_eq!(
            p.gpu_bytes_full,
            alone.gpu_bytes_full + mtp_weights + mtp_kv + snapshot + logits
        );
        assert!(p.fits);
        assert_eq!(p.layers_on_gpu, 66);
    }

    #[test]
    fn overhead_counts_a_snapshot_and_the_verify_logits() {
        let path = std::path::Path::new(ROOT).join("tests/data/fixtures/qwen35/model-q8_0.gguf");
        let mem = ModelMemory::from_gguf(&gguf::GgufFile::open(&path).unwrap()).unwrap();
        let snap = recurrent_state_bytes_per_seq(&mem);
        assert!(snap > 0);
        assert_eq!(
            speculation_overhead_bytes(&mem, 7),
            snap + 4 * 8 * mem.n_vocab as u64
        );
    }
}
