//! Speculative decoding inside the scheduler's steps.
//!
//! Each step, every decoding slot of a drafting model (`BatchModel::speculation`) turns its
//! decode row into a verify pass:
//! 1. draft: batched draft steps over all such slots at once (round r feeds each slot's
//!    previous draft; a slot leaves the round when its drafter is unsure (`p_min`) or it has
//!    drafted its limit), so the drafter's weights are read once per round, not per slot;
//! 2. verify: the pending token plus the drafts go into the step's one mixed forward next to
//!    the other slots' rows and prompt chunks, returning every verify row's logits;
//! 3. judge: the rows are walked in order with the request's own sampler (greedy: keep while
//!    the target agrees; sampled: rejection sampling), each decided token emitted exactly as
//!    a plain step would (penalties, stop/EOG, max_tokens, context, logprobs of its row);
//! 4. settle: one call rolls every verified sequence back to its kept tokens.
//!
//! Mixed prefill + decode steps need no special case: verify rows are decode rows with more
//! than one token, and the prompt-chunk budget is unchanged. Constrained requests (JSON
//! schema) decode plainly inside the same steps (a one-token verify pass).

use super::batch_loop::{emit, fail, guarded, Slot, Tally};
use super::request::SpecUsage;
use super::sampling::token_logprob;
use super::{BatchModel, SchedulerConfig};
use crate::sampler::SamplerConfig;
use crate::speculative::{Draft, DraftSampler, SpecOptions};

/// Per-request speculation state.
pub(super) struct SlotSpec {
    pub(super) drafts: DraftSampler,
    pub(super) usage: SpecUsage,
}

impl SlotSpec {
    pub(super) fn new(target: &SamplerConfig) -> SlotSpec {
        SlotSpec {
            drafts: DraftSampler::new(target),
            usage: SpecUsage::default(),
        }
    }
}

/// Most drafts a slot may verify this step: the model's limit, the tokens the request may
/// still generate after the pending one, and the context room that a plain run would still
/// decode in (so every token a verify pass decides is one the plain loop would reach).
fn draft_limit<S>(slot: &Slot<S>, opts: &SpecOptions, config: &SchedulerConfig) -> usize {
    let Some(a) = slot.active.as_ref() else {
        return 0;
    };
    if a.spec.is_none() || a.pending.is_none() {
        return 0;
    }
    let left = a.request.max_tokens.saturating_sub(a.n_generated + 1);
    let room = config.n_ctx_per_slot.saturating_sub(slot.cached.len() + 2);
    opts.draft_max.min(left).min(room)
}

/// The drafts of every planned row (empty for prompt chunks and plain rows), from batched
/// draft steps over the decoding slots. A slot whose draft step fails ends with an error.
pub(super) fn draft_rows<M: BatchModel>(
    model: &M,
    slots: &mut [Slot<M::State>],
    plan: &[super::batch_loop::PlannedRow],
    opts: &SpecOptions,
    config: &SchedulerConfig,
    clock: u64,
    tally: &mut Tally,
) -> Vec<Vec<Draft>> {
    let n_vocab = model.n_vocab();
    let mut drafts: Vec<Vec<Draft>> = vec![Vec::new(); plan.len()];
    // (plan row, slot, token to feed, limit), in slot order as the plan is.
    let mut round: Vec<(usize, usize, u32, usize)> = plan
        .iter()
        .enumerate()
        .filter_map(|(r, p)| {
            let t = p.decode_token()?;
            let k = draft_limit(&slots[p.slot], opts, config);
            (k > 0).then_some((r, p.slot, t, k))
        })
        .collect();
    while !round.is_empty() {
        let tokens: Vec<u32> = round.iter().map(|x| x.2).collect();
        let result = {
            let mut states: Vec<&mut M::State> = Vec::with_capacity(round.len());
            let mut want = round.iter().map(|x| x.1).peekable();
            for (i, slot) in slots.iter_mut().enumerate() {
                if want.peek() == Some(&i) {
                    want.next();
                    if let Some(st) = slot.state.as_mut() {
                        states.push(st);
                    }
                }
            }
            guarded(|| {
                if states.len() != tokens.len() {
                    return Err("a drafting slot has no state".to_string());
                }
                let logits = model.draft_step(&mut states, &tokens)?;
                if logits.len() != tokens.len() * n_vocab {
                    return Err(format!(
                        "draft_step returned {} logits, expected {}",
                        logits.len(),
                        tokens.len() * n_vocab
                    ));
                }
                Ok(logits)
            })
        };
        let logits = match result {
            Ok(l) => l,
            Err(e) => {
                for &(_, i, _, _) in &round {
                    fail(&mut slots[i], format!("draft step: {e}"), clock, tally);
                }
                break;
            }
        };
        let mut next = Vec::with_capacity(round.len());
        for (j, &(r, i, _, k)) in round.iter().enumerate() {
            let Some(spec) = slots[i].active.as_mut().and_then(|a| a.spec.as_mut()) else {
                continue;
            };
            let row = &logits[j * n_vocab..(j + 1) * n_vocab];
            if let Some(d) = spec.drafts.propose(row, opts.p_min) {
                let t = d.token;
                drafts[r].push(d);
                if drafts[r].len() < k {
                    next.push((r, i, t, k));
                }
            }
        }
        round = next;
    }
    for d in &mut drafts {
        if d.len() < opts.draft_min {
            d.clear();
        }
    }
    drafts
}

/// Walks one slot's verify rows (`rows`: `[1 + drafts.len(), n_vocab]`, row j scoring the
/// token after verify token j; `t` the pending token, now in the cache) and emits the
/// decided tokens. Returns how many verify tokens the sequence keeps (`t` plus the kept
/// drafts), which the slot's cache already holds.
pub(super) fn judge_verify_rows<S>(
    slot: &mut Slot<S>,
    t: u32,
    drafts: &[Draft],
    rows: &mut [f32],
    config: &SchedulerConfig,
    clock: u64,
    tally: &mut Tally,
) -> usize {
    if let Some(a) = slot.active.as_mut() {
        a.pending = None;
    }
    slot.cached.push(t);
    let n_vocab = rows.len() / (drafts.len() + 1);
    let mut keep = 1;
    if let Some(spec) = slot.active.as_mut().and_then(|a| a.spec.as_mut()) {
        spec.usage.verify_passes += 1;
        spec.usage.drafted += drafts.len();
    }
    if drafts.is_empty() {
        // A plain decode step inside the verify machinery (also constrained requests).
        super::batch_loop::on_logits(slot, rows, config, clock, tally);
        return keep;
    }
    for (j, row) in rows.chunks_exact_mut(n_vocab).enumerate() {
        let Some(a) = slot.active.as_mut() else {
            break;
        };
        let Some(spec) = a.spec.as_mut() else {
            break;
        };
        let logprob = a.request.logprobs.map(|n| (row.to_vec(), n));
        let v = spec
            .drafts
            .judge(a.sampler.engine_sampler(), row, drafts.get(j));
        if v.kept_draft {
            spec.usage.accepted += 1;
        }
        let logprob = logprob.map(|(raw, n)| token_logprob(&raw, v.token, n));
        emit(slot, v.token, logprob, config, clock, tally);
        if !v.kept_draft {
            break;
        }
        // The kept draft is in the state already; the next row scores the token after it.
        keep += 1;
        slot.cached.push(v.token);
        if let Some(a) = slot.active.as_mut() {
            a.pending = None;
        }
    }
    keep
}
