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
//! - MTP (`--mtp`, Qwen3.5's own multi-token-prediction layer, [`super::MtpSpec`]'s rules):
//!   every target pass also returns its hidden states, which queue the slot's exact MTP
//!   entries; a round's first draft step computes them with the first draft, later steps
//!   chain the MTP's own hidden state, and settling drops the chained entries. The MTP layer
//!   runs per slot (one layer: a small cost next to the target's pass). The hidden state of
//!   the last prompt token is kept with each checkpoint, so a slot reused at that prefix
//!   can go on drafting.
//! - target: verify rows run inside the scheduler's mixed step
//!   (`ModelOn::forward_multi_rows`, every row's logits for verify sequences). Attention-only
//!   targets truncate rejected tokens; hybrid ones snapshot the recurrent state before the
//!   step and, on a rejection, restore it and rerun the kept tokens — every rolled-back slot
//!   in one `forward_multi`.

use std::sync::Arc;

use backend::Backend;
use model::arch::qwen35_mtp::MtpState;
use model::{KvType, ModelOn, SeqStateOn};

use super::SpecOptions;
use crate::scheduler::BatchModel;

/// Rows per MTP pass when catching up on a long prompt.
const MTP_CHUNK: usize = 512;

/// What drafts for the slots.
pub enum SlotDrafter<B: Backend> {
    /// A separate draft model with the target's vocabulary.
    Model(Arc<ModelOn<B>>),
    /// The target's own MTP layer (`ModelOn::load_mtp` must have loaded it).
    Mtp,
}

/// A target model and its drafter, driven by the scheduler.
pub struct SpecBatch<B: Backend> {
    target: Arc<ModelOn<B>>,
    drafter: SlotDrafter<B>,
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
    draft: SeqDraft<B>,
    /// Open verify pass: the target's length before it, its token count, and whether the
    /// pass took its own snapshot (a checkpoint already there, e.g. at the end of the
    /// prompt, is kept for prefix reuse).
    verify: Option<(usize, usize, bool)>,
}

/// A slot's drafter state.
enum SeqDraft<B: Backend> {
    Model {
        state: SeqStateOn<B>,
        /// Open draft round: the drafter's length when it opened, and tokens it read since
        /// (a prefix of the step's verify tokens).
        round: Option<(usize, usize)>,
    },
    Mtp(Box<MtpSeq<B>>),
}

/// A slot's MTP cache and the entries waiting for it (see [`super::MtpSpec`]).
struct MtpSeq<B: Backend> {
    mtp: MtpState<B>,
    /// Entries not yet in the MTP cache: tokens and the target hidden state before each.
    pend_tokens: Vec<u32>,
    pend_hidden: Vec<f32>,
    /// The target's hidden state of its last token (pairs with the next decided token).
    last_hidden: Vec<f32>,
    /// The MTP's output hidden state of the previous draft step (chained).
    chain: Vec<f32>,
    /// MTP cache length after this round's first draft step (`Some`: a round is open).
    exact_len: Option<usize>,
    /// Hidden rows `[n, n_embd]` of the open verify pass.
    verify_hidden: Vec<f32>,
    /// `last_hidden` at each checkpoint position, for prefix reuse.
    saved: Vec<(usize, Vec<f32>)>,
}

impl<B: Backend> MtpSeq<B> {
    /// Queues entries for `tokens` just run through the target: the first pairs with
    /// `last_hidden` (none for the first token of a sequence), the others with `hidden` rows
    /// `0..`; the last row becomes `last_hidden`.
    fn queue(&mut self, tokens: &[u32], hidden: &[f32], e: usize) {
        for (i, &t) in tokens.iter().enumerate() {
            let h = if i == 0 {
                &self.last_hidden[..]
            } else {
                &hidden[(i - 1) * e..i * e]
            };
            if h.len() == e {
                self.pend_tokens.push(t);
                self.pend_hidden.extend_from_slice(h);
            }
        }
        if let Some(n) = tokens.len().checked_sub(1) {
            self.last_hidden = hidden[n * e..(n + 1) * e].to_vec();
        }
    }

    /// Back to a target holding `len` tokens whose last hidden state is `last` (empty when
    /// `len` is 0).
    fn truncate(&mut self, len: usize, last: Vec<f32>, e: usize) {
        let keep = len.saturating_sub(1);
        if self.mtp.len() > keep {
            self.mtp.truncate(keep);
            self.pend_tokens.clear();
            self.pend_hidden.clear();
        } else {
            let n_pend = (keep - self.mtp.len()).min(self.pend_tokens.len());
            self.pend_tokens.truncate(n_pend);
            self.pend_hidden.truncate(n_pend * e);
        }
        self.last_hidden = last;
        self.chain.clear();
    }
}

impl<B: Backend> SpecBatch<B> {
    /// Pairs `target` with `drafter` (a draft model is checked to share the vocabulary; MTP
    /// needs the target's MTP layer loaded). Slots' caches are `kv_type` for the target and
    /// `draft_kv_type` for the drafter.
    pub fn new(
        target: Arc<ModelOn<B>>,
        drafter: SlotDrafter<B>,
        kv_type: KvType,
        draft_kv_type: KvType,
        n_use: usize,
        opts: SpecOptions,
    ) -> Result<Self, super::SpecError> {
        match &drafter {
            SlotDrafter::Model(draft) => {
                if target.config().n_vocab != draft.config().n_vocab {
                    return Err(super::SpecError::VocabMismatch(format!(
                        "logits of {} in the target, {} in the draft",
                        target.config().n_vocab,
                        draft.config().n_vocab
                    )));
                }
                super::check_same_vocab(target.gguf(), draft.gguf())?;
            }
            SlotDrafter::Mtp => {
                if !target.has_mtp() {
                    return Err(super::SpecError::NoMtp);
                }
            }
        }
        let n_use = n_use.clamp(1, target.config().n_vocab);
        Ok(SpecBatch {
            target,
            drafter,
            kv_type,
            draft_kv_type,
            n_use,
            opts,
        })
    }

    /// Keeps the first `n_use` logits of each row (`logits`: [rows, model n_vocab]).
    fn cut(&self, logits: Vec<f32>) -> Result<Vec<f32>, String> {
        crate::scheduler::cut_rows(logits, self.target.config().n_vocab, self.n_use)
    }

    /// Target forward of a mixed batch; `all[i]`: every row of sequence i.
    fn run_target(
        &self,
        states: &mut [&mut SpecSeq<B>],
        tokens: &[&[u32]],
        all: &[bool],
    ) -> Result<Vec<f32>, String> {
        let mtp = matches!(self.drafter, SlotDrafter::Mtp);
        let mut targets: Vec<&mut SeqStateOn<B>> =
            states.iter_mut().map(|s| &mut s.target).collect();
        let (logits, hidden) = self
            .target
            .forward_multi_rows(&mut targets, tokens, all, mtp)
            .map_err(|e| e.to_string())?;
        let e = self.target.config().n_embd;
        let mut row = 0;
        for ((s, t), &verify) in states.iter_mut().zip(tokens).zip(all) {
            s.seq.extend_from_slice(t);
            if let SeqDraft::Mtp(m) = &mut s.draft {
                let h = hidden
                    .get(row * e..(row + t.len()) * e)
                    .ok_or("the target returned too few hidden rows")?;
                if verify {
                    // Queued when the pass is settled, for the kept tokens only.
                    m.verify_hidden = h.to_vec();
                } else {
                    m.queue(t, h, e);
                }
            }
            row += t.len();
        }
        self.cut(logits)
    }

    /// One MTP draft step of one slot ([`super::MtpSpec`]'s draft step).
    fn mtp_draft(&self, m: &mut MtpSeq<B>, token: u32) -> Result<Vec<f32>, String> {
        let model = &self.target;
        let err = |e: model::ModelError| format!("MTP: {e}");
        if m.exact_len.is_some() {
            let out = model
                .mtp_forward(&mut m.mtp, &[token], &m.chain, false)
                .map_err(err)?;
            m.chain = out.hidden;
            return Ok(out.logits);
        }
        // First draft step of a round: the pending exact entries plus (token, last hidden).
        let mut tokens = std::mem::take(&mut m.pend_tokens);
        let mut hidden = std::mem::take(&mut m.pend_hidden);
        tokens.push(token);
        hidden.extend_from_slice(&m.last_hidden);
        let e = model.config().n_embd;
        if hidden.len() != tokens.len() * e {
            return Err("MTP drafting needs the target's hidden state of the last token".into());
        }
        let mut out = None;
        for (t, h) in tokens.chunks(MTP_CHUNK).zip(hidden.chunks(MTP_CHUNK * e)) {
            out = Some(model.mtp_forward(&mut m.mtp, t, h, false).map_err(err)?);
        }
        let out = out.ok_or("empty MTP batch")?;
        let n_last = out.hidden.len() / e;
        m.chain = out.hidden[(n_last - 1) * e..].to_vec();
        m.exact_len = Some(m.mtp.len());
        Ok(out.logits)
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
        let draft = match &self.drafter {
            SlotDrafter::Model(d) => SeqDraft::Model {
                state: d
                    .new_state(n_ctx, self.draft_kv_type)
                    .map_err(|e| format!("draft model: {e}"))?,
                round: None,
            },
            SlotDrafter::Mtp => SeqDraft::Mtp(Box::new(MtpSeq {
                mtp: self
                    .target
                    .new_mtp_state(n_ctx, self.draft_kv_type)
                    .map_err(|e| format!("MTP: {e}"))?,
                pend_tokens: Vec::new(),
                pend_hidden: Vec::new(),
                last_hidden: Vec::new(),
                chain: Vec::new(),
                exact_len: None,
                verify_hidden: Vec::new(),
                saved: Vec::new(),
            })),
        };
        Ok(SpecSeq {
            target,
            seq: Vec::new(),
            draft,
            verify: None,
        })
    }

    fn state_len(&self, state: &SpecSeq<B>) -> usize {
        state.target.len()
    }

    fn truncate(&self, state: &mut SpecSeq<B>, pos: usize) -> Result<usize, String> {
        let open = match &state.draft {
            SeqDraft::Model { round, .. } => round.is_some(),
            SeqDraft::Mtp(m) => m.exact_len.is_some(),
        };
        if open || state.verify.is_some() {
            return Err("truncate inside a speculative step".into());
        }
        // Attention-only models truncate anywhere; hybrid ones only to a snapshot.
        let mut kept = state.target.truncate_at_most(pos);
        let e = self.target.config().n_embd;
        match &mut state.draft {
            // The drafter re-reads what it lost from `seq` with its next draft step.
            SeqDraft::Model { state: d, .. } => {
                if d.len() > kept {
                    d.truncate_at_most(kept);
                }
            }
            SeqDraft::Mtp(m) => {
                let last = match kept {
                    0 => Some(Vec::new()),
                    _ => m
                        .saved
                        .iter()
                        .find(|(p, _)| *p == kept)
                        .map(|(_, h)| h.clone()),
                };
                match last {
                    Some(h) => m.truncate(kept, h, e),
                    None => {
                        // No hidden state saved there: start the sequence over.
                        state.target.truncate(0).map_err(|e| e.to_string())?;
                        m.truncate(0, Vec::new(), e);
                        kept = 0;
                    }
                }
                m.saved.retain(|(p, _)| *p <= kept);
            }
        }
        state.seq.truncate(kept);
        Ok(kept)
    }

    fn checkpoint(&self, state: &mut SpecSeq<B>) {
        state.target.snapshot();
        if let SeqDraft::Mtp(m) = &mut state.draft {
            let len = state.target.len();
            let live = state.target.snapshot_positions();
            m.saved.retain(|(p, _)| *p != len && live.contains(p));
            m.saved.push((len, m.last_hidden.clone()));
        }
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
        let draft = match &self.drafter {
            SlotDrafter::Model(d) => d,
            SlotDrafter::Mtp => {
                let mut out = Vec::with_capacity(states.len() * self.n_use);
                for (s, &t) in states.iter_mut().zip(tokens) {
                    let SeqDraft::Mtp(m) = &mut s.draft else {
                        return Err("a slot without an MTP state".into());
                    };
                    out.extend(self.cut(self.mtp_draft(m, t)?)?);
                }
                return Ok(out);
            }
        };
        let mut feeds: Vec<Vec<u32>> = Vec::with_capacity(states.len());
        let mut drafts: Vec<&mut SeqStateOn<B>> = Vec::with_capacity(states.len());
        for (s, &t) in states.iter_mut().zip(tokens) {
            let SeqDraft::Model { state, round } = &mut s.draft else {
                return Err("a slot without a draft model state".into());
            };
            let feed = match round {
                None => {
                    // Open the round: remember where the drafter was, catch it up.
                    if state.is_recurrent() {
                        state.snapshot();
                    }
                    let from = state.len().min(s.seq.len());
                    *round = Some((state.len(), 0));
                    let mut f = s.seq[from..].to_vec();
                    f.push(t);
                    f
                }
                Some(_) => vec![t],
            };
            if let Some((_, consumed)) = round.as_mut() {
                *consumed += 1;
            }
            feeds.push(feed);
            drafts.push(state);
        }
        let refs: Vec<&[u32]> = feeds.iter().map(Vec::as_slice).collect();
        let logits = draft
            .forward_multi(&mut drafts, &refs)
            .map_err(|e| format!("draft model: {e}"))?;
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
            let verified = s.seq[base..base + n].to_vec();
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
            match &mut s.draft {
                // Back to the kept prefix if the drafter read rejected drafts.
                SeqDraft::Model { state, round } => {
                    if let Some((dbase, consumed)) = round.take() {
                        if consumed > k {
                            if state.is_recurrent() {
                                state.truncate(dbase).map_err(|e| e.to_string())?;
                            } else {
                                state.truncate(base + k).map_err(|e| e.to_string())?;
                            }
                        }
                        state.drop_snapshot(dbase);
                    }
                }
                // Exact entries for the kept tokens; the chained draft entries go.
                SeqDraft::Mtp(m) => {
                    let e = self.target.config().n_embd;
                    let hidden = std::mem::take(&mut m.verify_hidden);
                    if hidden.len() != n * e {
                        return Err("verify pass without its hidden states".into());
                    }
                    let kept = &verified[..k];
                    match m.exact_len.take() {
                        Some(len) => {
                            // The first kept token's entry is exact (the round's first
                            // draft step wrote it); queue the rest.
                            m.mtp.truncate(len);
                            for (i, &t) in kept.iter().enumerate().skip(1) {
                                m.pend_tokens.push(t);
                                m.pend_hidden.extend_from_slice(&hidden[(i - 1) * e..i * e]);
                            }
                            m.last_hidden = hidden[(k - 1) * e..k * e].to_vec();
                        }
                        None => m.queue(kept, &hidden, e),
                    }
                    m.chain.clear();
                }
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
