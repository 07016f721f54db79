//! Memory that speculative decoding adds to a plan: a separate draft model (`-md`) placed
//! whole beside the target, and the target's own extras (a recurrent-state snapshot taken
//! before each verify pass, logits of every verified row). The MTP layer of a Qwen3.5 file
//! is counted by the main plan (`PlanOptions::use_mtp`). All in bytes.

use backend::KvType;
use serde::Serialize;

use super::buffers::{kv_bytes_per_token, recurrent_state_bytes_per_seq};
use super::model_memory::ModelMemory;

/// What a draft model costs on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
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
