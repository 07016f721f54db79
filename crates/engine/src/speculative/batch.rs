//! [`SpecBatch`]: the scheduler's model ([`BatchModel`]) with a drafter, so the server
//! speculates per slot. Each slot's state ([`SpecSeq`]) holds the target's sequence state and
//! the drafter's, kept in step as [`super::DraftModelSpec`] keeps them for one sequence:
//!
//! - draft model (`--md`): its state follows the target lazily. The first draft step of a
//!   round feeds the tokens the target holds that the drafter has not read plus the last
//!   decided token; every slot's draft step is one `forward_multi` of the draft model, so
//!   its weights are read once per round for all slots. Rejected drafts are dropped by
//!   truncation (attention-only drafter) or by restoring the snapshot taken when the round
//!   opened (hybrid drafter; the kept tokens are re-fed lazily next round).
//! - target: verify rows run inside the scheduler's mixed step
//!   (`ModelOn::forward_multi_rows`, every row's logits for verify sequences). Attention-only
//!   targets truncate rejected tokens; hybrid ones snapshot the recurrent state before the
//!   step and, on a rejection, restore it and rerun the kept tokens — every rolled-back slot
//!   in one `forward_multi`.

use std::sync::Arc;

use backend::Backend;
use model::{KvType, ModelOn, SeqStateOn};

use super::SpecOptions;
use crate::scheduler::BatchModel;

/// A target model and its draft model, driven by the scheduler.
pub struct SpecBatch<B: Backend> {
    target: Arc<ModelOn<B>>,
    draft: Arc<ModelOn<B>>,
    kv_type: KvType,
    draft_kv_type: KvType,
    /// Token ids that may be decided: the tokenizer's vocabulary (padded heads cut).
    n_use: usize,
    opts: SpecOptions,
}

/// One slot's target and drafter states.
pub struct SpecSeq<B: Backend> {
    target: SeqStateOn<B>,
    /// Every token the target holds, in order (what the drafter catches up on).
    seq: Vec<u32>,
    draft: SeqStateOn<B>,
    /// Open draft round: the drafter's length when it opened, and tokens it read since
    /// (a prefix of the step's verify tokens).
    round: Option<(usize, usize)>,
    /// Open verify pass: the target's length before it, its token count, and whether the
    /// pass took its own snapshot (a checkpoint already there, e.g. at the end of the
    /// prompt, is kept for prefix reuse).
    verify: Option<(usize, usize, bool)>,
}

impl<B: Backend> SpecBatch<B> {
    /// Pairs `target` with `draft` (checked to share the vocabulary). Slots' caches are
    /// `kv_type` for the target and `draft_kv_type` for the drafter.
    pub fn new(
        target: Arc<ModelOn<B>>,
        draft: Arc<ModelOn<B>>,
        kv_type: KvType,
        draft_kv_type: KvType,
        n_use: usize,
        opts: SpecOptions,
    ) -> Result<Self, super::SpecError> {
        if target.config().n_vocab != draft.config().n_vocab {
            return Err(super::SpecError::VocabMismatch(format!(
                "logits of {} in the target, {} in the draft",
                target.config().n_vocab,
                draft.config().n_vocab
            )));
        }
        super::check_same_vocab(target.gguf(), draft.gguf())?;
        let n_use = n_use.clamp(1, target.config().n_vocab);
        Ok(SpecBatch {
            target,
            draft,
            kv_type,
            draft_kv_type,
            n_use,
            opts,
        })
    }

    /// Keeps the first `n_use` logits of each row (`logits`: [rows, model n_vocab]).
    fn cut(&self, logits: Vec<f32>) -> Result<Vec<f32>, String> {
        let n = self.target.config().n_vocab;
        if self.n_use == n {
            return Ok(logits);
        }
        if !logits.len().is_multiple_of(n) {
            return Err(format!("{} logits are not rows of {n}", logits.len()));
        }
        Ok(logits
            .chunks_exact(n)
            .flat_map(|row| &row[..self.n_use])
            .copied()
            .collect())
    }

    /// Target forward of a mixed batch; `all[i]`: every row of sequence i.
    fn run_target(
        &self,
        states: &mut [&mut SpecSeq<B>],
        tokens: &[&[u32]],
        all: &[bool],
    ) -> Result<Vec<f32>, String> {
        let mut targets: Vec<&mut SeqStateOn<B>> =
            states.iter_mut().map(|s| &mut s.target).collect();
        let (logits, _) = self
            .target
            .forward_multi_rows(&mut targets, tokens, all, false)
            .map_err(|e| e.to_string())?;
        for (s, t) in states.iter_mut().zip(tokens) {
            s.seq.extend_from_slice(t);
        }
        self.cut(logits)
    }
}

impl<B: Backend + 'static> BatchModel for SpecBatch<B> {
    type State = SpecSeq<B>;

    fn n_vocab(&self) -> usize {
        self.n_use
    }

    fn new_state(&self, n_ctx: usize) -> Result<SpecSeq<B>, String> {
        let target = self
            .target
            .new_state(n_ctx, self.kv_type)
            .map_err(|e| e.to_string())?;
        let draft = self
            .draft
            .new_state(n_ctx, self.draft_kv_type)
            .map_err(|e| format!("draft model: {e}"))?;
        Ok(SpecSeq {
            target,
            seq: Vec::new(),
            draft,
            round: None,
            verify: None,
        })
    }

    fn state_len(&self, state: &SpecSeq<B>) -> usize {
        state.target.len()
    }

    fn truncate(&self, state: &mut SpecSeq<B>, pos: usize) -> Result<usize, String> {
        if state.round.is_some() || state.verify.is_some() {
            return Err("truncate inside a speculative step".into());
        }
        // Attention-only models truncate anywhere; hybrid ones only to a snapshot.
        let kept = state.target.truncate_at_most(pos);
        state.seq.truncate(kept);
        // The drafter re-reads what it lost from `seq` with its next draft step.
        if state.draft.len() > kept {
            state.draft.truncate_at_most(kept);
        }
        Ok(kept)
    }

    fn checkpoint(&self, state: &mut SpecSeq<B>) {
        state.target.snapshot();
    }

    fn prefill(&self, state: &mut SpecSeq<B>, tokens: &[u32]) -> Result<Vec<f32>, String> {
        self.run_target(&mut [state], &[tokens], &[false])
    }

    fn decode_batch(
        &self,
        states: &mut [&mut SpecSeq<B>],
        tokens: &[u32],
    ) -> Result<Vec<f32>, String> {
        let per: Vec<&[u32]> = tokens.chunks(1).collect();
        self.run_target(states, &per, &vec![false; per.len()])
    }

    fn forward_multi(
        &self,
        states: &mut [&mut SpecSeq<B>],
        tokens: &[&[u32]],
    ) -> Result<Vec<f32>, String> {
        self.run_target(states, tokens, &vec![false; tokens.len()])
    }

    fn speculation(&self) -> Option<SpecOptions> {
        Some(self.opts.clone())
    }

    fn draft_step(
        &self,
        states: &mut [&mut SpecSeq<B>],
        tokens: &[u32],
    ) -> Result<Vec<f32>, String> {
        if states.len() != tokens.len() {
            return Err(format!(
                "{} states but {} draft tokens",
                states.len(),
                tokens.len()
            ));
        }
        let mut feeds: Vec<Vec<u32>> = Vec::with_capacity(states.len());
        for (s, &t) in states.iter_mut().zip(tokens) {
            let feed = match s.round {
                None => {
                    // Open the round: remember where the drafter was, catch it up.
                    if s.draft.is_recurrent() {
                        s.draft.snapshot();
                    }
                    let from = s.draft.len().min(s.seq.len());
                    s.round = Some((s.draft.len(), 0));
                    let mut f = s.seq[from..].to_vec();
                    f.push(t);
                    f
                }
                Some(_) => vec![t],
            };
            feeds.push(feed);
        }
        let refs: Vec<&[u32]> = feeds.iter().map(Vec::as_slice).collect();
        let mut drafts: Vec<&mut SeqStateOn<B>> = states.iter_mut().map(|s| &mut s.draft).collect();
        let logits = self
            .draft
            .forward_multi(&mut drafts, &refs)
            .map_err(|e| format!("draft model: {e}"))?;
        for s in states.iter_mut() {
            if let Some((_, consumed)) = s.round.as_mut() {
                *consumed += 1;
            }
        }
        self.cut(logits)
    }

    fn forward_verify(
        &self,
        states: &mut [&mut SpecSeq<B>],
        tokens: &[&[u32]],
        verify: &[bool],
    ) -> Result<Vec<f32>, String> {
        if verify.len() != states.len() {
            return Err("one verify flag per sequence".into());
        }
        for (s, (t, &v)) in states.iter_mut().zip(tokens.iter().zip(verify)) {
            if v {
                if s.verify.is_some() {
                    return Err("a verify pass was not settled".into());
                }
                let base = s.target.len();
                let own = s.target.is_recurrent() && !s.target.snapshot_positions().contains(&base);
                if own {
                    s.target.snapshot();
                }
                s.verify = Some((base, t.len(), own));
            }
        }
        let result = self.run_target(states, tokens, verify);
        if result.is_err() {
            for s in states.iter_mut() {
                if let Some((base, _, true)) = s.verify.take() {
                    s.target.drop_snapshot(base);
                }
            }
        }
        result
    }

    fn settle(&self, states: &mut [&mut SpecSeq<B>], keep: &[usize]) -> Result<(), String> {
        if keep.len() != states.len() {
            return Err("one keep count per sequence".into());
        }
        // Hybrid targets with a rejection: restored now, kept tokens rerun together below.
        let mut rerun: Vec<(usize, Vec<u32>)> = Vec::new();
        for (i, (s, &k)) in states.iter_mut().zip(keep).enumerate() {
            let (base, n, own) = s.verify.take().ok_or("settle without a verify pass")?;
            if k == 0 || k > n {
                return Err(format!("keep {k} outside 1..={n}"));
            }
            s.seq.truncate(base + k);
            if k < n {
                if s.target.is_recurrent() {
                    s.target.truncate(base).map_err(|e| e.to_string())?;
                    rerun.push((i, s.seq[base..].to_vec()));
                } else {
                    s.target.truncate(base + k).map_err(|e| e.to_string())?;
                }
            }
            if own {
                s.target.drop_snapshot(base);
            }
            // The drafter: back to the kept prefix if it read rejected drafts.
            if let Some((dbase, consumed)) = s.round.take() {
                if consumed > k {
                    if s.draft.is_recurrent() {
                        s.draft.truncate(dbase).map_err(|e| e.to_string())?;
                    } else {
                        s.draft.truncate(base + k).map_err(|e| e.to_string())?;
                    }
                }
                s.draft.drop_snapshot(dbase);
            }
        }
        if rerun.is_empty() {
            return Ok(());
        }
        let refs: Vec<&[u32]> = rerun.iter().map(|(_, t)| t.as_slice()).collect();
        let mut targets: Vec<&mut SeqStateOn<B>> = Vec::with_capacity(rerun.len());
        let mut want = rerun.iter().map(|(i, _)| *i).peekable();
        for (i, s) in states.iter_mut().enumerate() {
            if want.peek() == Some(&i) {
                want.next();
                targets.push(&mut s.target);
            }
        }
        self.target
            .forward_multi(&mut targets, &refs)
            .map_err(|e| format!("rerunning kept tokens: {e}"))?;
        Ok(())
    }
}
