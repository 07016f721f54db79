//! Per-sequence state: a KV cache per attention layer and a recurrent state per Gated DeltaNet
//! layer, plus snapshots of the recurrent states so a sequence can be restored to an earlier
//! position.
//!
//! KV caches truncate for free (positions past the length are never read). Recurrent states
//! cannot be rewound, so a hybrid model restores position p only from a snapshot taken at p
//! (or p = 0, the zero state). Take snapshots where a rollback may be wanted: the end of a
//! chat turn (prefix reuse), or before verifying draft tokens.

use std::sync::atomic::{AtomicU64, Ordering};

use backend::Backend;

use crate::ModelError;

/// Source of [`SeqStateOn::buffers_id`] values: never reused within a process.
static NEXT_BUFFERS_ID: AtomicU64 = AtomicU64::new(1);

fn next_buffers_id() -> u64 {
    NEXT_BUFFERS_ID.fetch_add(1, Ordering::Relaxed)
}

pub(crate) enum LayerState<B: Backend> {
    Kv(B::KvCache),
    Recurrent(B::RecurrentState),
}

struct Snapshot<B: Backend> {
    pos: usize,
    /// One per recurrent layer, in layer order.
    states: Vec<B::RecurrentState>,
}

/// The cache and recurrent state of one sequence. Created by `Model::new_state`.
pub struct SeqStateOn<B: Backend> {
    pub(crate) n_ctx: usize,
    pub(crate) len: usize,
    pub(crate) layers: Vec<LayerState<B>>,
    snapshots: Vec<Snapshot<B>>,
    /// The buffers of the last dropped snapshot, reused by the next one (a speculative step
    /// takes and drops one per verify pass).
    spare: Option<Vec<B::RecurrentState>>,
    /// Set by `truncate(0)` on a hybrid model: the recurrent states must be zeroed before the
    /// next forward (zeroing needs the backend).
    pub(crate) needs_reset: bool,
    bytes: usize,
    /// Names this state's device buffers for recorded decode steps (`Backend::begin_step`
    /// keys): a new value whenever a layer's buffers are replaced (a snapshot restore on a
    /// backend whose restore does not copy in place).
    pub(crate) buffers_id: u64,
}

impl<B: Backend> SeqStateOn<B> {
    pub(crate) fn new(n_ctx: usize, layers: Vec<LayerState<B>>, bytes: usize) -> Self {
        SeqStateOn {
            n_ctx,
            len: 0,
            layers,
            snapshots: Vec::new(),
            spare: None,
            needs_reset: false,
            bytes,
            buffers_id: next_buffers_id(),
        }
    }

    /// Tokens in the sequence so far (the position of the next token).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Positions this state holds.
    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Bytes of cache and recurrent state (snapshots not counted).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// True if some layer keeps a recurrent state (truncation needs snapshots).
    pub fn is_recurrent(&self) -> bool {
        self.layers
            .iter()
            .any(|l| matches!(l, LayerState::Recurrent(_)))
    }

    /// Records the recurrent states at the current length, replacing an earlier snapshot at
    /// the same position. A no-op for attention-only models (they truncate anywhere).
    pub fn snapshot(&mut self) {
        if !self.is_recurrent() {
            return;
        }
        let live = self.layers.iter().filter_map(|l| match l {
            LayerState::Recurrent(s) => Some(s),
            LayerState::Kv(_) => None,
        });
        let states: Vec<B::RecurrentState> = match self.spare.take() {
            // clone_from lets a backend copy into the spare buffers instead of allocating.
            Some(mut spare) => {
                for (dst, src) in spare.iter_mut().zip(live) {
                    dst.clone_from(src);
                }
                spare
            }
            None => live.cloned().collect(),
        };
        let pos = self.len;
        self.snapshots.retain(|s| s.pos != pos);
        self.snapshots.push(Snapshot { pos, states });
    }

    /// Positions with a snapshot, ascending.
    pub fn snapshot_positions(&self) -> Vec<usize> {
        let mut v: Vec<usize> = self.snapshots.iter().map(|s| s.pos).collect();
        v.sort_unstable();
        v
    }

    /// Drops the snapshot at `pos`, if any (a speculative verify pass takes one per step and
    /// drops it once the step is settled, so they do not pile up).
    pub fn drop_snapshot(&mut self, pos: usize) {
        if let Some(i) = self.snapshots.iter().position(|s| s.pos == pos) {
            self.spare = Some(self.snapshots.swap_remove(i).states);
        }
    }

    /// Drops every snapshot.
    pub fn clear_snapshots(&mut self) {
        self.snapshots.clear();
    }

    /// True if `truncate(pos)` would succeed.
    pub fn can_truncate(&self, pos: usize) -> bool {
        pos <= self.len
            && (pos == self.len
                || pos == 0
                || !self.is_recurrent()
                || self.snapshots.iter().any(|s| s.pos == pos))
    }

    /// The longest prefix of at most `pos` tokens this state can be restored to: `pos`
    /// itself for attention-only models, else the latest snapshot at or before `pos` (or 0).
    pub fn restorable_prefix(&self, pos: usize) -> usize {
        let pos = pos.min(self.len);
        if self.can_truncate(pos) {
            return pos;
        }
        self.snapshots
            .iter()
            .map(|s| s.pos)
            .filter(|&p| p <= pos)
            .max()
            .unwrap_or(0)
    }

    /// Restores to [`SeqStateOn::restorable_prefix`]`(pos)` and returns that length: the
    /// caller re-feeds its tokens from there. Never fails.
    pub fn truncate_at_most(&mut self, pos: usize) -> usize {
        let p = self.restorable_prefix(pos);
        // Cannot fail: p is the current length, 0, or a snapshot position.
        let _ = self.truncate(p);
        p
    }

    /// Restores the sequence to its first `pos` tokens. Always works for attention-only
    /// models; for hybrid models `pos` must be 0, the current length, or a snapshot position.
    /// Snapshots past `pos` are dropped.
    pub fn truncate(&mut self, pos: usize) -> Result<(), ModelError> {
        if pos > self.len {
            return Err(ModelError::CannotTruncate {
                pos,
                reason: format!("the sequence has only {} tokens", self.len),
            });
        }
        if pos == self.len {
            return Ok(());
        }
        if self.is_recurrent() {
            if pos == 0 {
                self.needs_reset = true;
            } else {
                let snap = self
                    .snapshots
                    .iter()
                    .find(|s| s.pos == pos)
                    .ok_or_else(|| ModelError::CannotTruncate {
                        pos,
                        reason: format!(
                            "the model has recurrent layers and there is no snapshot at {pos} (snapshots: {:?})",
                            self.snapshot_positions()
                        ),
                    })?;
                let mut it = snap.states.iter();
                for l in &mut self.layers {
                    if let LayerState::Recurrent(s) = l {
                        if let Some(saved) = it.next() {
                            // clone_from: a backend can copy into the live buffers (keeping
                            // their addresses for recorded decode steps) instead of replacing.
                            s.clone_from(saved);
                        }
                    }
                }
                self.needs_reset = false;
                if !B::RESTORE_KEEPS_BUFFERS {
                    self.buffers_id = next_buffers_id();
                }
            }
        }
        self.snapshots.retain(|s| s.pos <= pos);
        self.len = pos;
        Ok(())
    }
}
