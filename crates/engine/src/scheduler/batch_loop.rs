//! The scheduler thread: admit, cancel, run one mixed step (every running slot's next token
//! plus a bounded chunk of waiting prompts) through `forward_multi`, repeat.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::sampling::{token_logprob, RequestSampler};
use super::speculation::{draft_rows, judge_verify_rows, SlotSpec};
use super::{
    lock, BatchModel, FinishReason, GenerationEvent, GenerationRequest, Job, SchedulerConfig,
    SchedulerStats, Shared, TokenLogprob, Usage,
};

/// A request being served by a slot.
pub(super) struct Active {
    pub(super) request: GenerationRequest,
    pub(super) sampler: RequestSampler,
    events: mpsc::UnboundedSender<GenerationEvent>,
    /// Admission order; the oldest prefilling request goes first.
    seq: u64,
    /// Prompt tokens already in the cache.
    prompt_pos: usize,
    /// Sampled and sent, not yet fed to the model.
    pub(super) pending: Option<u32>,
    pub(super) n_generated: usize,
    /// Drafting and acceptance state when the model speculates (not for constrained
    /// requests: their mask must see each token before the next one is proposed).
    pub(super) spec: Option<SlotSpec>,
    cached_tokens: usize,
    admitted: Instant,
    first_token: Option<Instant>,
}

pub(super) struct Slot<S> {
    pub(super) state: Option<S>,
    /// Tokens held in `state`, in order (for prefix reuse).
    pub(super) cached: Vec<u32>,
    pub(super) active: Option<Active>,
    last_used: u64,
}

/// Runs a model call, turning a panic into an error so one bad step cannot kill the thread.
pub(super) fn guarded<T>(f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| {
        let msg = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        Err(format!("model panicked: {msg}"))
    })
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

pub(super) fn run<M: BatchModel>(model: Arc<M>, shared: Arc<Shared>, config: Arc<SchedulerConfig>) {
    // Marks the scheduler stopped however this function ends.
    struct Stopped(Arc<Shared>);
    impl Drop for Stopped {
        fn drop(&mut self) {
            self.0.running.store(false, Ordering::Release);
            let mut q = lock(&self.0.queue);
            q.shutting_down = true;
            for job in q.jobs.drain(..) {
                let _ = job
                    .events
                    .send(GenerationEvent::Error("the scheduler stopped".into()));
            }
        }
    }
    let _stopped = Stopped(shared.clone());

    let mut slots: Vec<Slot<M::State>> = (0..config.n_slots)
        .map(|_| Slot {
            state: None,
            cached: Vec::new(),
            active: None,
            last_used: 0,
        })
        .collect();
    let mut clock: u64 = 0;

    loop {
        clock += 1;
        // 1. Admit.
        {
            let mut q = lock(&shared.queue);
            loop {
                let has_free = slots.iter().any(|s| s.active.is_none());
                if !has_free || q.jobs.is_empty() {
                    break;
                }
                let Some(job) = q.jobs.pop_front() else { break };
                admit(&*model, &config, &mut slots, job, clock);
            }
            let busy = slots.iter().any(|s| s.active.is_some());
            if !busy {
                if q.shutting_down && q.jobs.is_empty() {
                    return;
                }
                // Idle: sleep until a submit or shutdown wakes us.
                let _ = shared.wake.wait_timeout(q, Duration::from_millis(200));
                continue;
            }
        }

        // 2. Cancel requests whose client went away.
        let mut tally = Tally::default();
        for slot in &mut slots {
            if slot.active.as_ref().is_some_and(|a| a.events.is_closed()) {
                slot.active = None;
                slot.last_used = clock;
                tally.cancelled += 1;
            }
        }

        // 3. One mixed step: the pending token of every decoding slot plus prompt chunks of
        // the oldest prefilling slots (at most `prefill_chunk` prompt tokens in all), in one
        // `forward_multi` call. A running stream gets a token every step; a long prompt
        // only makes each step up to one chunk larger.
        // With speculation each decode row becomes a verify pass: the pending token plus the
        // drafts proposed for it by batched draft steps over all decoding slots.
        let step_t0 = Instant::now();
        let mut plan = plan_step(&slots, config.prefill_chunk);
        let spec = model.speculation();
        let mut drafts = match &spec {
            Some(opts) => draft_rows(&*model, &mut slots, &plan, opts, &config, clock, &mut tally),
            None => vec![Vec::new(); plan.len()],
        };
        // A slot whose drafter failed has ended with an error: drop its row.
        let mut r = 0;
        plan.retain(|p| {
            let keep = slots[p.slot].active.is_some() && slots[p.slot].state.is_some();
            if !keep {
                drafts.remove(r);
            } else {
                r += 1;
            }
            keep
        });
        let verify: Vec<bool> = plan
            .iter()
            .map(|p| spec.is_some() && !p.is_prefill())
            .collect();
        let (mut prefill_stats, mut decode_stats) = ((0u64, 0f64), (0u64, 0f64));
        if !plan.is_empty() {
            let inputs: Vec<Vec<u32>> = plan
                .iter()
                .zip(&drafts)
                .map(|(p, d)| match p.kind {
                    RowKind::Decode(t) => std::iter::once(t)
                        .chain(d.iter().map(|d| d.token))
                        .collect(),
                    RowKind::Prefill { from, to } => slots[p.slot]
                        .active
                        .as_ref()
                        .map_or_else(Vec::new, |a| a.request.prompt[from..to].to_vec()),
                })
                .collect();
            let n_prefill: usize = plan
                .iter()
                .map(|p| match p.kind {
                    RowKind::Prefill { from, to } => to - from,
                    RowKind::Decode(_) => 0,
                })
                .sum();
            // Tokens run for decoding slots (a verify pass counts all of its tokens).
            let n_decode: u64 = plan
                .iter()
                .zip(&inputs)
                .filter(|(p, _)| !p.is_prefill())
                .map(|(_, i)| i.len() as u64)
                .sum();
            // A step whose sampled rows all draw from their best logits alone asks the model for
            // those only (greedy: the picks).
            let top = if spec.is_none() && device_sampling() {
                step_top_needed(&slots, &plan, model.n_vocab())
            } else {
                None
            };
            let t0 = Instant::now();
            let result = {
                // `plan` is in slot order and names each slot once.
                let mut states: Vec<&mut M::State> = Vec::with_capacity(plan.len());
                let mut want = plan.iter().map(|p| p.slot).peekable();
                for (i, slot) in slots.iter_mut().enumerate() {
                    if want.peek() == Some(&i) {
                        want.next();
                        if let Some(st) = slot.state.as_mut() {
                            states.push(st);
                        }
                    }
                }
                let refs: Vec<&[u32]> = inputs.iter().map(Vec::as_slice).collect();
                guarded(|| {
                    if states.len() != refs.len() {
                        return Err("a planned slot has no state".to_string());
                    }
                    let out = match top {
                        Some(1) => StepOut::Picks(model.forward_multi_greedy(&mut states, &refs)?),
                        Some(k) => StepOut::Tops(model.forward_multi_top(&mut states, &refs, k)?),
                        None if spec.is_some() => {
                            StepOut::Logits(model.forward_verify(&mut states, &refs, &verify)?)
                        }
                        None => StepOut::Logits(model.forward_multi(&mut states, &refs)?),
                    };
                    // values: n_vocab logits a row (a verify pass: one row per token), or one
                    // pick / list a sequence
                    let (what, got, expected) = match &out {
                        StepOut::Logits(l) => {
                            let n_rows: usize = refs
                                .iter()
                                .zip(&verify)
                                .map(|(t, &v)| if v { t.len() } else { 1 })
                                .sum();
                            ("logits", l.len(), n_rows * model.n_vocab())
                        }
                        StepOut::Picks(p) => ("picks", p.len(), refs.len()),
                        StepOut::Tops(t) => ("top-k lists", t.len(), refs.len()),
                    };
                    if got != expected {
                        return Err(format!(
                            "the step returned {got} {what}, expected {expected}"
                        ));
                    }
                    Ok(out)
                })
            };
            // Mixed steps: time split by token count (metrics report tok/s of each kind).
            let secs = t0.elapsed().as_secs_f64();
            let total = (n_prefill as u64 + n_decode).max(1) as f64;
            prefill_stats = (n_prefill as u64, secs * n_prefill as f64 / total);
            decode_stats = (n_decode, secs * n_decode as f64 / total);
            match result {
                Ok(out) => {
                    let n_vocab = model.n_vocab();
                    let (mut logits, mut presampled) = match out {
                        StepOut::Logits(mut logits) => {
                            let p = presample(
                                &mut slots,
                                &plan,
                                &drafts,
                                &verify,
                                &mut logits,
                                n_vocab,
                            );
                            (logits, p)
                        }
                        // every row that ends in a sample is a plain greedy one (no logprobs,
                        // no constraint): its pick is what its sampler would draw
                        StepOut::Picks(picks) => (
                            Vec::new(),
                            picks.into_iter().map(|t| Some((t, None))).collect(),
                        ),
                        // each sampled row draws from its best logits with its own sampler
                        StepOut::Tops(tops) => {
                            let p = plan
                                .iter()
                                .zip(&tops)
                                .map(|(p, top)| {
                                    let a = slots[p.slot].active.as_mut()?;
                                    ends_in_sample(p, a).then(|| (a.sampler.sample_top(top), None))
                                })
                                .collect();
                            (Vec::new(), p)
                        }
                    };
                    let mut row = 0;
                    // Verify passes to settle: (slot, tokens kept).
                    let mut settle: Vec<(usize, usize)> = Vec::new();
                    for (i, ((p, d), &is_verify)) in
                        plan.iter().zip(&drafts).zip(&verify).enumerate()
                    {
                        let slot = &mut slots[p.slot];
                        let n_rows = if is_verify { 1 + d.len() } else { 1 };
                        // (no rows when the step returned picks: every sampled row has one)
                        let rows: &mut [f32] = logits
                            .get_mut(row * n_vocab..(row + n_rows) * n_vocab)
                            .unwrap_or_default();
                        row += n_rows;
                        if is_verify {
                            let RowKind::Decode(t) = p.kind else { continue };
                            let keep =
                                judge_verify_rows(slot, t, d, rows, &config, clock, &mut tally);
                            settle.push((p.slot, keep));
                            continue;
                        }
                        let row_logits = rows;
                        match p.kind {
                            RowKind::Decode(t) => {
                                if let Some(a) = slot.active.as_mut() {
                                    a.pending = None;
                                }
                                slot.cached.push(t);
                                match presampled[i].take() {
                                    Some(x) => on_sampled(slot, x, &config, clock, &mut tally),
                                    None => on_logits(slot, row_logits, &config, clock, &mut tally),
                                }
                            }
                            RowKind::Prefill { from, to } => {
                                let Some(a) = slot.active.as_mut() else {
                                    continue;
                                };
                                slot.cached.extend_from_slice(&a.request.prompt[from..to]);
                                a.prompt_pos = to;
                                if to == a.request.prompt.len() {
                                    if let Some(state) = slot.state.as_mut() {
                                        model.checkpoint(state);
                                    }
                                    match presampled[i].take() {
                                        Some(x) => on_sampled(slot, x, &config, clock, &mut tally),
                                        None => {
                                            on_logits(slot, row_logits, &config, clock, &mut tally)
                                        }
                                    }
                                }
                            }
                        }
                    }
                    settle_verified(&*model, &mut slots, &settle, clock, &mut tally);
                }
                Err(e) => {
                    for p in &plan {
                        fail(&mut slots[p.slot], e.clone(), clock, &mut tally);
                    }
                }
            }
        }

        if step_log() && !plan.is_empty() {
            let fwd = prefill_stats.1 + decode_stats.1;
            eprintln!(
                "step seqs={} decode={} prefill={} fwd_ms={:.2} host_ms={:.2}",
                plan.len(),
                decode_stats.0,
                prefill_stats.0,
                fwd * 1e3,
                (step_t0.elapsed().as_secs_f64() - fwd) * 1e3
            );
        }
        let mut st = lock(&shared.stats);
        st.prefill_tokens_total += prefill_stats.0;
        st.prefill_seconds_total += prefill_stats.1;
        st.decode_tokens_total += decode_stats.0;
        st.decode_seconds_total += decode_stats.1;
        st.busy_slots = slots.iter().filter(|s| s.active.is_some()).count();
        st.kv_tokens_used = slots.iter().map(|s| s.cached.len()).sum();
        let outbox = std::mem::take(&mut tally.outbox);
        tally_into_stats(&mut st, tally);
        drop(st);
        for (to, event) in outbox {
            let _ = to.send(event);
        }
    }
}

/// What a step's model call returned.
enum StepOut {
    /// `[rows, n_vocab]` logits (verify passes: every verified token's row).
    Logits(Vec<f32>),
    /// One greedy pick per sequence ([`BatchModel::forward_multi_greedy`]).
    Picks(Vec<Option<u32>>),
    /// Each sequence's best logits ([`BatchModel::forward_multi_top`]).
    Tops(Vec<Vec<(u32, f32)>>),
}

/// Whether a plan row ends in a sample (a decode row, the last chunk of a prompt).
fn ends_in_sample(p: &PlannedRow, a: &Active) -> bool {
    match p.kind {
        RowKind::Decode(_) => true,
        RowKind::Prefill { to, .. } => to == a.request.prompt.len(),
    }
}

/// How many of their best logits the rows of the plan that end in a sample need, when every
/// one of them can draw from those alone ([`RequestSampler::top_needed`]: greedy, or a top-k
/// sampler without bias or penalties; no constraint, no logprobs): the largest of them (1:
/// greedy picks do). `None`: some row needs its whole row of logits.
fn step_top_needed<S>(slots: &[Slot<S>], plan: &[PlannedRow], n_vocab: usize) -> Option<usize> {
    let mut k = 1;
    for p in plan {
        let a = slots.get(p.slot)?.active.as_ref()?;
        if !ends_in_sample(p, a) {
            continue;
        }
        if a.request.constraint.is_some() || a.request.logprobs.is_some() {
            return None;
        }
        k = k.max(a.sampler.top_needed(n_vocab, backend::MAX_TOP_K)?);
    }
    Some(k)
}

/// Whether steps whose rows allow it ask the model for greedy picks or top-k lists rather
/// than logits ([`BatchModel::forward_multi_greedy`], [`BatchModel::forward_multi_top`];
/// `REDLINE_DEVICE_SAMPLING=0`: logits, for A/B).
fn device_sampling() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("REDLINE_DEVICE_SAMPLING").as_deref() != Ok("0"))
}

/// What one slot contributes to a step.
#[derive(Clone, Copy, Debug)]
enum RowKind {
    /// The token sampled last step, fed to get the next one.
    Decode(u32),
    /// Prompt tokens `from..to`.
    Prefill { from: usize, to: usize },
}

#[derive(Clone, Copy, Debug)]
pub(super) struct PlannedRow {
    pub(super) slot: usize,
    kind: RowKind,
}

impl PlannedRow {
    /// The token a decode row feeds (`None` for a prompt chunk).
    pub(super) fn decode_token(&self) -> Option<u32> {
        match self.kind {
            RowKind::Decode(t) => Some(t),
            RowKind::Prefill { .. } => None,
        }
    }

    fn is_prefill(&self) -> bool {
        matches!(self.kind, RowKind::Prefill { .. })
    }
}

/// The rows of the next step, in slot order: every slot with a pending token decodes it;
/// prefilling slots, oldest admission first, share a budget of `prefill_chunk` prompt tokens.
fn plan_step<S>(slots: &[Slot<S>], prefill_chunk: usize) -> Vec<PlannedRow> {
    let mut rows = Vec::new();
    let mut prefilling = Vec::new();
    for (i, slot) in slots.iter().enumerate() {
        let Some(a) = slot.active.as_ref().filter(|_| slot.state.is_some()) else {
            continue;
        };
        match a.pending {
            Some(t) => rows.push(PlannedRow {
                slot: i,
                kind: RowKind::Decode(t),
            }),
            None if a.prompt_pos < a.request.prompt.len() => prefilling.push((a.seq, i)),
            None => {}
        }
    }
    prefilling.sort_unstable();
    let mut budget = prefill_chunk;
    for (_, i) in prefilling {
        if budget == 0 {
            break;
        }
        let Some(a) = slots[i].active.as_ref() else {
            continue;
        };
        let from = a.prompt_pos;
        let to = (from + budget).min(a.request.prompt.len());
        budget -= to - from;
        rows.push(PlannedRow {
            slot: i,
            kind: RowKind::Prefill { from, to },
        });
    }
    rows.sort_by_key(|r| r.slot);
    rows
}

/// Puts `job` into the free slot sharing the longest prefix with its prompt
/// (least recently used on ties) and rolls that slot's cache back to the shared prefix.
fn admit<M: BatchModel>(
    model: &M,
    config: &SchedulerConfig,
    slots: &mut [Slot<M::State>],
    job: Job,
    clock: u64,
) {
    let prompt = &job.request.prompt;
    let Some(i) = slots
        .iter()
        .enumerate()
        .filter(|(_, s)| s.active.is_none())
        .max_by_key(|(_, s)| {
            (
                common_prefix(&s.cached, prompt),
                std::cmp::Reverse(s.last_used),
            )
        })
        .map(|(i, _)| i)
    else {
        return;
    };
    let slot = &mut slots[i];
    if job.events.is_closed() {
        return;
    }
    // Keep at least one prompt token to compute: its logits give the first new token.
    let mut keep = common_prefix(&slot.cached, prompt).min(prompt.len() - 1);
    let kept = match slot.state.as_mut() {
        Some(state) => guarded(|| model.truncate(state, keep))
            .ok()
            .filter(|&k| k <= keep),
        None => None,
    };
    match kept {
        Some(k) => keep = k,
        None => {
            keep = 0;
            slot.cached.clear();
            slot.state = None;
            match guarded(|| model.new_state(config.n_ctx_per_slot)) {
                Ok(s) => slot.state = Some(s),
                Err(e) => {
                    let _ = job.events.send(GenerationEvent::Error(format!(
                        "cannot allocate a sequence: {e}"
                    )));
                    return;
                }
            }
        }
    }
    slot.cached.truncate(keep);
    let sampler = RequestSampler::new(job.request.sampling.clone());
    let spec = (model.speculation().is_some() && job.request.constraint.is_none())
        .then(|| SlotSpec::new(sampler.config()));
    let _ = job.enqueued;
    slot.active = Some(Active {
        request: job.request,
        sampler,
        events: job.events,
        seq: clock,
        prompt_pos: keep,
        pending: None,
        n_generated: 0,
        spec,
        cached_tokens: keep,
        admitted: Instant::now(),
        first_token: None,
    });
    slot.last_used = clock;
}

/// Samples from a slot's logits ([n_vocab]), sends the token, and decides whether to go on.
pub(super) fn on_logits<S>(
    slot: &mut Slot<S>,
    logits: &mut [f32],
    config: &SchedulerConfig,
    clock: u64,
    tally: &mut Tally,
) {
    let Some(a) = slot.active.as_mut() else {
        return;
    };
    let x = sample_row(a, logits);
    on_sampled(slot, x, config, clock, tally);
}

/// A token drawn for a slot (`None`: the constraint allows nothing) and its log-probability
/// when the request asked for them.
pub(super) type Sampled = (Option<u32>, Option<TokenLogprob>);

/// Draws a request's next token from its logits ([n_vocab], masked in place by its
/// constraint). Touches only the request's own sampler and constraint, so several slots'
/// rows can be sampled at once.
fn sample_row(a: &mut Active, logits: &mut [f32]) -> Sampled {
    let logprob_of = a.request.logprobs.map(|n| (logits.to_vec(), n));
    let token = a
        .sampler
        .sample(logits, a.request.constraint.as_deref_mut());
    let logprob = token.and_then(|t| logprob_of.map(|(raw, n)| token_logprob(&raw, t, n)));
    (token, logprob)
}

/// Sends a slot's drawn token ([`sample_row`]) and decides whether to go on.
fn on_sampled<S>(
    slot: &mut Slot<S>,
    x: Sampled,
    config: &SchedulerConfig,
    clock: u64,
    tally: &mut Tally,
) {
    let (Some(token), logprob) = x else {
        return fail(
            slot,
            "no token is allowed at this point (constraint dead end)".into(),
            clock,
            tally,
        );
    };
    emit(slot, token, logprob, config, clock, tally);
}

/// Whether a step's rows may be sampled on several threads (`REDLINE_PARALLEL_SAMPLING=0`:
/// one after another, for A/B measurements).
fn parallel_sampling() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("REDLINE_PARALLEL_SAMPLING").as_deref() != Ok("0"))
}

/// Whether every step prints one line to stderr (`REDLINE_STEP_LOG=1`, a diagnostic): its
/// sequences, decode and prompt tokens, the model call's time and the rest of the step's
/// (drafting, sampling, events).
fn step_log() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("REDLINE_STEP_LOG").as_deref() == Ok("1"))
}

/// Vocabularies from this size up sample a step's rows on several threads.
const PARALLEL_SAMPLING_VOCAB: usize = 8192;

/// Draws the next token of every plain row of a step that ends in a sample (a decode row, or
/// the last chunk of a prompt) at once, one rayon task per slot, before the step's results
/// are applied in plan order: with a 152k vocabulary one row costs ~0.05–0.4 ms of host time
/// (argmax, or the candidate path with penalties and top-p), which at 8–32 slots would
/// otherwise leave the GPU idle for several milliseconds per step. Returns one entry per
/// plan row (`None`: sample it in order, as verify rows and small vocabularies are).
fn presample<S: Send>(
    slots: &mut [Slot<S>],
    plan: &[PlannedRow],
    drafts: &[Vec<crate::speculative::Draft>],
    verify: &[bool],
    logits: &mut [f32],
    n_vocab: usize,
) -> Vec<Option<Sampled>> {
    use rayon::prelude::*;
    let mut out: Vec<Option<Sampled>> = vec![None; plan.len()];
    if n_vocab < PARALLEL_SAMPLING_VOCAB || !parallel_sampling() {
        return out;
    }
    // (plan row, request, its logits row); plan rows are in slot order, one per slot.
    let mut jobs: Vec<(usize, &mut Active, &mut [f32])> = Vec::with_capacity(plan.len());
    let mut rest = logits;
    let mut slot_iter = slots.iter_mut().enumerate();
    for (i, ((p, d), &is_verify)) in plan.iter().zip(drafts).zip(verify).enumerate() {
        let n_rows = if is_verify { 1 + d.len() } else { 1 };
        let Some((rows, tail)) = rest.split_at_mut_checked(n_rows * n_vocab) else {
            break;
        };
        rest = tail;
        let Some(slot) = slot_iter.find_map(|(j, s)| (j == p.slot).then_some(s)) else {
            break;
        };
        if let Some(a) = slot.active.as_mut() {
            if !is_verify && ends_in_sample(p, a) {
                jobs.push((i, a, rows));
            }
        }
    }
    if jobs.len() < 2 {
        return out;
    }
    let drawn: Vec<(usize, Sampled)> = jobs
        .into_par_iter()
        .map(|(i, a, row)| (i, sample_row(a, row)))
        .collect();
    for (i, x) in drawn {
        out[i] = Some(x);
    }
    out
}

/// Records a decided token of a slot (penalty window, constraint, counters), sends it unless
/// it ends the generation, and decides whether to go on; going on leaves it `pending`.
/// `logprob`: its log-probability under the raw logits, when the request asked for them.
pub(super) fn emit<S>(
    slot: &mut Slot<S>,
    token: u32,
    logprob: Option<TokenLogprob>,
    config: &SchedulerConfig,
    clock: u64,
    tally: &mut Tally,
) {
    let Some(a) = slot.active.as_mut() else {
        return;
    };
    a.sampler.accept(token);
    if let Some(spec) = a.spec.as_mut() {
        spec.drafts.accept(token);
    }
    a.first_token.get_or_insert_with(Instant::now);
    a.n_generated += 1;
    let constraint_ok = a
        .request
        .constraint
        .as_mut()
        .is_none_or(|c| c.commit(token));
    if !constraint_ok {
        return fail(
            slot,
            format!("the constraint rejected token {token}"),
            clock,
            tally,
        );
    }
    let eog = !a.request.ignore_eos && config.eog_tokens.contains(&token);
    if eog {
        return finish(slot, FinishReason::Stop, clock, tally);
    }
    if a.events
        .send(GenerationEvent::Token { id: token, logprob })
        .is_err()
    {
        slot.active = None; // the client went away
        tally.cancelled += 1;
        return;
    }
    if a.request
        .constraint
        .as_ref()
        .is_some_and(|c| c.is_finished())
    {
        return finish(slot, FinishReason::Stop, clock, tally);
    }
    // The pending token needs one more cache position before the next one can be sampled.
    if a.n_generated >= a.request.max_tokens || slot.cached.len() + 1 >= config.n_ctx_per_slot {
        return finish(slot, FinishReason::Length, clock, tally);
    }
    a.pending = Some(token);
}

fn usage_of(a: &Active) -> Usage {
    let first = a.first_token.unwrap_or(a.admitted);
    Usage {
        prompt_tokens: a.request.prompt.len(),
        cached_tokens: a.cached_tokens,
        completion_tokens: a.n_generated,
        prefill_seconds: (first - a.admitted).as_secs_f64(),
        decode_seconds: first.elapsed().as_secs_f64(),
        speculative: a.spec.as_ref().map(|s| s.usage),
    }
}

/// What happened to requests during one step, folded into the stats at its end.
#[derive(Default)]
pub(super) struct Tally {
    /// Usage of each request that ended, and whether it ended without an error.
    ended: Vec<(Usage, bool)>,
    cancelled: u64,
    /// Final events, sent after the stats are updated so a client that saw `Done` also
    /// sees its request counted.
    outbox: Vec<(mpsc::UnboundedSender<GenerationEvent>, GenerationEvent)>,
}

fn finish<S>(slot: &mut Slot<S>, reason: FinishReason, clock: u64, tally: &mut Tally) {
    if let Some(a) = slot.active.take() {
        let usage = usage_of(&a);
        tally
            .outbox
            .push((a.events, GenerationEvent::Done { reason, usage }));
        tally.ended.push((usage, true));
    }
    slot.last_used = clock;
}

/// Ends a slot's request with an error and forgets its cache (it may be inconsistent).
pub(super) fn fail<S>(slot: &mut Slot<S>, message: String, clock: u64, tally: &mut Tally) {
    if let Some(a) = slot.active.take() {
        let usage = usage_of(&a);
        tally
            .outbox
            .push((a.events, GenerationEvent::Error(message)));
        tally.ended.push((usage, false));
    }
    slot.state = None;
    slot.cached.clear();
    slot.last_used = clock;
}

/// Settles the step's verify passes (`(slot, tokens kept)`) in one model call; the slots'
/// caches already hold the kept tokens. A failure ends those slots' requests.
fn settle_verified<M: BatchModel>(
    model: &M,
    slots: &mut [Slot<M::State>],
    settle: &[(usize, usize)],
    clock: u64,
    tally: &mut Tally,
) {
    let mut states: Vec<&mut M::State> = Vec::with_capacity(settle.len());
    let mut keep = Vec::with_capacity(settle.len());
    let mut which = Vec::with_capacity(settle.len());
    let mut want = settle.iter().peekable();
    for (i, slot) in slots.iter_mut().enumerate() {
        if let Some(&&(si, k)) = want.peek() {
            if si == i {
                want.next();
                if let Some(st) = slot.state.as_mut() {
                    states.push(st);
                    keep.push(k);
                    which.push(i);
                }
            }
        }
    }
    if states.is_empty() {
        return;
    }
    if let Err(e) = guarded(|| model.settle(&mut states, &keep)) {
        drop(states);
        for i in which {
            fail(
                &mut slots[i],
                format!("settling a speculative step: {e}"),
                clock,
                tally,
            );
        }
    }
}

fn tally_into_stats(st: &mut SchedulerStats, tally: Tally) {
    st.requests_cancelled += tally.cancelled;
    for (usage, ok) in tally.ended {
        st.requests_total += 1;
        if !ok {
            st.requests_failed += 1;
        }
        st.prompt_tokens_total += usage.prompt_tokens as u64;
        st.cached_prompt_tokens_total += usage.cached_tokens as u64;
        st.generated_tokens_total += usage.completion_tokens as u64;
    }
}
