//! Scheduler behaviour against the fake model: outputs equal the model's own greedy
//! sequence no matter how requests are batched, chunked, reused, queued or cancelled.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::fake_model::FakeModel;
use super::*;

fn greedy() -> SamplingParams {
    SamplingParams {
        temperature: 0.0,
        ..Default::default()
    }
}

fn request(prompt: Vec<u32>, max_tokens: usize) -> GenerationRequest {
    GenerationRequest {
        prompt,
        sampling: greedy(),
        max_tokens,
        logprobs: None,
        ignore_eos: false,
        constraint: None,
    }
}

/// Drains a stream: (tokens, final event).
fn collect(mut rx: GenerationStream) -> (Vec<u32>, GenerationEvent) {
    let mut tokens = Vec::new();
    loop {
        match rx.blocking_recv() {
            Some(GenerationEvent::Token { id, .. }) => tokens.push(id),
            Some(end) => return (tokens, end),
            None => panic!("stream closed without Done"),
        }
    }
}

fn reference(model: &FakeModel, prompt: &[u32], n: usize, eog: &[u32]) -> Vec<u32> {
    let mut seq = prompt.to_vec();
    let mut out = Vec::new();
    for _ in 0..n {
        let t = model.next_after(&seq);
        if eog.contains(&t) {
            break;
        }
        out.push(t);
        seq.push(t);
    }
    out
}

fn start(model: &Arc<FakeModel>, n_slots: usize, n_ctx: usize) -> Scheduler {
    let config = SchedulerConfig {
        n_slots,
        n_ctx_per_slot: n_ctx,
        max_queue: 16,
        prefill_chunk: 3,
        eog_tokens: vec![],
    };
    Scheduler::start(model.clone(), config).unwrap()
}

fn wait_until(mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < Duration::from_secs(10), "timed out");
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn generates_the_models_greedy_sequence_with_chunked_prefill() {
    let model = Arc::new(FakeModel::new(50, Duration::ZERO));
    let s = start(&model, 1, 64);
    let prompt: Vec<u32> = (1..=10).collect();
    let (tokens, end) = collect(s.submit(request(prompt.clone(), 7)).unwrap());
    assert_eq!(tokens, reference(&model, &prompt, 7, &[]));
    match end {
        GenerationEvent::Done { reason, usage } => {
            assert_eq!(reason, FinishReason::Length);
            assert_eq!(
                (
                    usage.prompt_tokens,
                    usage.completion_tokens,
                    usage.cached_tokens
                ),
                (10, 7, 0)
            );
        }
        e => panic!("{e:?}"),
    }
    // Every prompt token computed once, then every generated token but the last fed once.
    assert_eq!(model.tokens_fed.load(Ordering::SeqCst), 10 + 6);
}

#[test]
fn stops_at_end_of_generation_token_without_sending_it() {
    let model = Arc::new(FakeModel::new(50, Duration::ZERO));
    let prompt = vec![3, 4, 5];
    let full = reference(&model, &prompt, 6, &[]);
    let eog = full[3];
    let config = SchedulerConfig {
        n_slots: 1,
        n_ctx_per_slot: 64,
        eog_tokens: vec![eog],
        ..Default::default()
    };
    let s = Scheduler::start(model.clone(), config).unwrap();
    let (tokens, end) = collect(s.submit(request(prompt.clone(), 6)).unwrap());
    assert_eq!(tokens, reference(&model, &prompt, 6, &[eog]));
    assert!(matches!(
        end,
        GenerationEvent::Done {
            reason: FinishReason::Stop,
            ..
        }
    ));
}

#[test]
fn concurrent_requests_are_decoded_in_one_batch_and_stay_separate() {
    let model = Arc::new(FakeModel::new(97, Duration::from_millis(2)));
    let s = start(&model, 4, 64);
    let prompts: Vec<Vec<u32>> = (0..4).map(|i| vec![i + 1, 2 * i + 3, 7]).collect();
    let streams: Vec<_> = prompts
        .iter()
        .map(|p| s.submit(request(p.clone(), 20)).unwrap())
        .collect();
    for (p, rx) in prompts.iter().zip(streams) {
        assert_eq!(collect(rx).0, reference(&model, p, 20, &[]));
    }
    assert!(
        model.max_batch.load(Ordering::SeqCst) >= 2,
        "decode steps were not batched"
    );
    // Stats are folded in at the end of the step that sent the last `Done`.
    wait_until(|| s.stats().busy_slots == 0);
    let st = s.stats();
    assert_eq!(
        (st.requests_total, st.generated_tokens_total, st.busy_slots),
        (4, 80, 0)
    );
}

#[test]
fn next_turn_reuses_the_cached_prefix() {
    let model = Arc::new(FakeModel::new(50, Duration::ZERO));
    let s = start(&model, 2, 64);
    let turn1 = vec![1, 2, 3, 4];
    let (out1, _) = collect(s.submit(request(turn1.clone(), 5)).unwrap());
    let before = model.tokens_fed.load(Ordering::SeqCst);
    // The next turn repeats the conversation so far and adds two tokens.
    let mut turn2 = turn1.clone();
    turn2.extend(&out1);
    turn2.extend([9, 8]);
    let (out2, end) = collect(s.submit(request(turn2.clone(), 5)).unwrap());
    assert_eq!(out2, reference(&model, &turn2, 5, &[]));
    // The last generated token was never fed, so it is computed again with the new ones.
    // (plus the 4 generated tokens fed back).
    let computed = model.tokens_fed.load(Ordering::SeqCst) - before;
    assert_eq!(computed, 3 + 4);
    match end {
        GenerationEvent::Done { usage, .. } => assert_eq!(usage.cached_tokens, turn2.len() - 3),
        e => panic!("{e:?}"),
    }
    // A prompt that is a pure prefix of the cache still computes its last token.
    let (out3, _) = collect(s.submit(request(turn1.clone(), 5)).unwrap());
    assert_eq!(out3, out1);
}

#[test]
fn dropping_the_stream_frees_the_slot() {
    let model = Arc::new(FakeModel::new(50, Duration::from_millis(5)));
    let s = start(&model, 1, 1000);
    let mut rx = s.submit(request(vec![1, 2], 900)).unwrap();
    assert!(matches!(
        rx.blocking_recv(),
        Some(GenerationEvent::Token { .. })
    ));
    drop(rx);
    wait_until(|| s.stats().requests_cancelled == 1);
    assert_eq!(s.stats().busy_slots, 0);
    // The only slot serves the next request.
    let (tokens, _) = collect(s.submit(request(vec![5], 3)).unwrap());
    assert_eq!(tokens.len(), 3);
}

#[test]
fn full_queue_and_bad_requests_are_refused() {
    let model = Arc::new(FakeModel::new(50, Duration::from_millis(20)));
    let config = SchedulerConfig {
        n_slots: 1,
        n_ctx_per_slot: 32,
        max_queue: 1,
        ..Default::default()
    };
    let s = Scheduler::start(model, config).unwrap();
    let mut held = Vec::new();
    let refused = (0..5).find_map(|_| match s.submit(request(vec![1], 20)) {
        Ok(rx) => {
            held.push(rx);
            None
        }
        Err(e) => Some(e),
    });
    assert!(
        matches!(refused, Some(SchedulerError::QueueFull(1))),
        "{refused:?}"
    );
    assert_eq!(
        s.submit(request(vec![], 1)).err(),
        Some(SchedulerError::EmptyPrompt)
    );
    assert!(matches!(
        s.submit(request(vec![1; 30], 3)),
        Err(SchedulerError::ContextExceeded { .. })
    ));
    assert!(matches!(
        s.submit(request(vec![1; 32], 0)),
        Err(SchedulerError::ContextExceeded { .. })
    ));
}

#[test]
fn generation_stops_when_the_context_is_full() {
    let model = Arc::new(FakeModel::new(50, Duration::ZERO));
    let s = start(&model, 1, 8);
    let (tokens, end) = collect(s.submit(request(vec![1, 2, 3], 5)).unwrap());
    assert_eq!(tokens.len(), 5);
    assert!(matches!(
        end,
        GenerationEvent::Done {
            reason: FinishReason::Length,
            ..
        }
    ));
}

#[test]
fn shutdown_finishes_running_work_then_refuses() {
    let model = Arc::new(FakeModel::new(50, Duration::from_millis(1)));
    let s = start(&model, 1, 64);
    let rx = s.submit(request(vec![1, 2], 10)).unwrap();
    s.shutdown();
    assert_eq!(
        s.submit(request(vec![1], 1)).err(),
        Some(SchedulerError::ShuttingDown)
    );
    assert_eq!(collect(rx).0.len(), 10);
    wait_until(|| !s.is_running());
}

/// `wait_stopped` returns once the thread has exited and dropped everything it held (the
/// model's last clone outside this test), and in time while a generation is still running.
#[test]
fn wait_stopped_joins_the_thread() {
    let model = Arc::new(FakeModel::new(50, Duration::from_millis(20)));
    let s = start(&model, 1, 64);
    let rx = s.submit(request(vec![1, 2], 40)).unwrap();
    s.shutdown();
    assert!(
        !s.wait_stopped(Duration::from_millis(50)),
        "40 steps of 20 ms in 50 ms"
    );
    drop(rx); // the client goes: its generation is cancelled
    assert!(s.wait_stopped(Duration::from_secs(10)));
    assert!(!s.is_running());
    assert_eq!(Arc::strong_count(&model), 1);
}

#[test]
fn logprobs_come_with_tokens_when_asked() {
    let model = Arc::new(FakeModel::new(50, Duration::ZERO));
    let s = start(&model, 1, 64);
    let mut r = request(vec![4, 2], 2);
    r.logprobs = Some(3);
    let mut rx = s.submit(r).unwrap();
    match rx.blocking_recv() {
        Some(GenerationEvent::Token {
            id,
            logprob: Some(lp),
        }) => {
            assert_eq!(lp.top.len(), 3);
            assert_eq!(lp.top[0].0, id);
            assert!(lp.logprob < 0.0 && lp.logprob > -1.0, "{}", lp.logprob);
        }
        e => panic!("{e:?}"),
    }
}

/// Allows only even tokens and finishes after three of them.
struct EvenOnly(usize);
impl TokenConstraint for EvenOnly {
    fn mask(&mut self, logits: &mut [f32]) {
        for (i, l) in logits.iter_mut().enumerate() {
            if i % 2 == 1 {
                *l = f32::NEG_INFINITY;
            }
        }
    }
    fn commit(&mut self, token: u32) -> bool {
        self.0 += 1;
        token.is_multiple_of(2)
    }
    fn is_finished(&self) -> bool {
        self.0 >= 3
    }
}

#[test]
fn a_constraint_masks_tokens_and_ends_generation() {
    let model = Arc::new(FakeModel::new(50, Duration::ZERO));
    let s = start(&model, 1, 64);
    let mut r = request(vec![1, 2, 3], 20);
    r.constraint = Some(Box::new(EvenOnly(0)));
    let (tokens, end) = collect(s.submit(r).unwrap());
    assert_eq!(tokens.len(), 3);
    assert!(tokens.iter().all(|t| t % 2 == 0), "{tokens:?}");
    assert!(matches!(
        end,
        GenerationEvent::Done {
            reason: FinishReason::Stop,
            ..
        }
    ));
}

#[test]
fn recurrent_style_models_reuse_up_to_the_last_restore_point() {
    let mut m = FakeModel::new(50, Duration::ZERO);
    m.restore_points = true;
    let model = Arc::new(m);
    let s = start(&model, 1, 64);
    let turn1 = vec![1, 2, 3, 4];
    let (out1, _) = collect(s.submit(request(turn1.clone(), 5)).unwrap());
    let mut turn2 = turn1.clone();
    turn2.extend(&out1);
    turn2.extend([9, 8]);
    let (out2, end) = collect(s.submit(request(turn2.clone(), 5)).unwrap());
    assert_eq!(out2, reference(&model, &turn2, 5, &[]));
    // The checkpoint sits at the end of the first prompt.
    match end {
        GenerationEvent::Done { usage, .. } => assert_eq!(usage.cached_tokens, turn1.len()),
        e => panic!("{e:?}"),
    }
}

/// Runs `a` (short prompt, long generation) and, once `a` streams, `b` (long prompt) on two
/// slots; returns both outputs and the step log.
#[allow(clippy::type_complexity)]
fn long_prompt_while_streaming(
    model: &Arc<FakeModel>,
    a: &[u32],
    b: &[u32],
    chunk: usize,
) -> (Vec<u32>, Vec<u32>, Vec<Vec<(usize, usize)>>) {
    let config = SchedulerConfig {
        n_slots: 2,
        n_ctx_per_slot: 512,
        max_queue: 4,
        prefill_chunk: chunk,
        eog_tokens: vec![],
    };
    let s = Scheduler::start(model.clone(), config).unwrap();
    let mut rx_a = s.submit(request(a.to_vec(), 80)).unwrap();
    let first = match rx_a.blocking_recv() {
        Some(GenerationEvent::Token { id, .. }) => id,
        e => panic!("{e:?}"),
    };
    let rx_b = s.submit(request(b.to_vec(), 5)).unwrap();
    let (out_b, _) = collect(rx_b);
    let (mut out_a, _) = collect(rx_a);
    out_a.insert(0, first);
    let steps = model.steps.lock().unwrap().clone();
    (out_a, out_b, steps)
}

#[test]
fn a_long_prompt_prefills_in_chunks_inside_the_running_streams_steps() {
    for native in [true, false] {
        let mut m = FakeModel::new(97, Duration::from_millis(2));
        m.native_multi = native;
        let model = Arc::new(m);
        let a: Vec<u32> = vec![4, 5, 6];
        let b: Vec<u32> = (0..150).map(|i| (i * 7 + 3) % 97).collect();
        let chunk = 16;
        let (out_a, out_b, steps) = long_prompt_while_streaming(&model, &a, &b, chunk);
        // Same tokens as each request alone (greedy).
        assert_eq!(out_a, reference(&model, &a, 80, &[]));
        assert_eq!(out_b, reference(&model, &b, 5, &[]));
        // State 0 serves `a`, state 1 serves `b`.
        let rows_of = |id: usize| -> Vec<usize> {
            steps
                .iter()
                .enumerate()
                .filter(|(_, st)| st.iter().any(|&(s, _)| s == id))
                .map(|(i, _)| i)
                .collect()
        };
        let (steps_a, steps_b) = (rows_of(0), rows_of(1));
        // `a` is in every step from its first to its last: never skipped, so a long prompt
        // delays it by at most one chunk's worth of work per step.
        assert_eq!(steps_a.len(), steps_a[steps_a.len() - 1] - steps_a[0] + 1);
        assert_eq!(steps_a.len(), 80, "1 prompt step + 79 decode steps");
        // Every step carries at most `chunk` prompt tokens of `b`; its prompt took
        // ceil(150 / 16) = 10 steps, each shared with a decode step of `a`.
        let b_prefill: Vec<usize> = steps
            .iter()
            .filter_map(|st| st.iter().find(|&&(s, n)| s == 1 && n > 1).map(|&(_, n)| n))
            .collect();
        assert!(b_prefill.iter().all(|&n| n <= chunk), "{b_prefill:?}");
        assert_eq!(b_prefill.iter().sum::<usize>(), 150);
        assert_eq!(steps_b.len(), 150usize.div_ceil(chunk) + 4);
        let shared = steps
            .iter()
            .filter(|st| {
                st.iter().any(|&(s, n)| s == 1 && n > 1) && st.iter().any(|&(s, _)| s == 0)
            })
            .count();
        assert_eq!(
            shared,
            150usize.div_ceil(chunk),
            "{native}: b's prefill ran beside a's decode"
        );
    }
}

#[test]
fn several_waiting_prompts_share_one_chunk_budget_per_step() {
    let model = Arc::new(FakeModel::new(61, Duration::ZERO));
    let config = SchedulerConfig {
        n_slots: 3,
        n_ctx_per_slot: 256,
        max_queue: 4,
        prefill_chunk: 8,
        eog_tokens: vec![],
    };
    let s = Scheduler::start(model.clone(), config).unwrap();
    let prompts: Vec<Vec<u32>> = (0..3u32)
        .map(|k| (0..(5 + 4 * k)).map(|i| (i * 3 + k) % 61).collect())
        .collect();
    let streams: Vec<_> = prompts
        .iter()
        .map(|p| s.submit(request(p.clone(), 6)).unwrap())
        .collect();
    for (p, rx) in prompts.iter().zip(streams) {
        assert_eq!(collect(rx).0, reference(&model, p, 6, &[]));
    }
    for st in model.steps.lock().unwrap().iter() {
        let prompt_tokens: usize = st.iter().filter(|r| r.1 > 1).map(|r| r.1).sum();
        assert!(prompt_tokens <= 8, "{st:?}");
    }
}

#[test]
fn large_vocabulary_rows_sampled_together_give_the_same_tokens_as_alone() {
    // 10 000 tokens: over PARALLEL_SAMPLING_VOCAB, so a step's rows are drawn on several
    // threads; each request must still see exactly its own logits, sampler and constraint.
    let model = Arc::new(FakeModel::new(10_000, Duration::from_millis(1)));
    let seeded = |prompt: Vec<u32>| {
        let mut r = request(prompt, 12);
        r.sampling = SamplingParams {
            temperature: 0.9,
            top_p: 0.95,
            presence_penalty: 0.5,
            seed: Some(7),
            ..Default::default()
        };
        r.logprobs = Some(2);
        r
    };
    let collect_logprobs = |mut rx: GenerationStream| {
        let mut out = Vec::new();
        while let Some(GenerationEvent::Token { id, logprob }) = rx.blocking_recv() {
            out.push((id, logprob.map(|l| l.logprob)));
        }
        out
    };
    // Alone: one slot, so every step samples one row, in order.
    let alone = start(&model, 1, 64);
    let want = collect_logprobs(alone.submit(seeded(vec![5, 6, 7])).unwrap());
    drop(alone);
    assert_eq!(want.len(), 12);
    assert!(want.iter().all(|(_, lp)| lp.is_some()));

    let s = start(&model, 4, 64);
    let greedy_prompts = [vec![1u32, 2, 3], vec![9, 8]];
    let g: Vec<_> = greedy_prompts
        .iter()
        .map(|p| s.submit(request(p.clone(), 12)).unwrap())
        .collect();
    let sampled = s.submit(seeded(vec![5, 6, 7])).unwrap();
    let mut c = request(vec![4, 4], 20);
    c.constraint = Some(Box::new(EvenOnly(0)));
    let constrained = s.submit(c).unwrap();
    for (p, rx) in greedy_prompts.iter().zip(g) {
        assert_eq!(collect(rx).0, reference(&model, p, 12, &[]));
    }
    assert_eq!(collect_logprobs(sampled), want);
    let (even, _) = collect(constrained);
    assert_eq!(even.len(), 3);
    assert!(even.iter().all(|t| t % 2 == 0), "{even:?}");
    assert!(
        model.max_batch.load(Ordering::SeqCst) >= 3,
        "the rows were not in one step"
    );
}

/// Host time per scheduler step at 8 slots on a Qwen-sized vocabulary (the fake model's own
/// logits included): `cargo test -p engine --release --lib -- --ignored step_host_time
/// --nocapture`, once with `REDLINE_PARALLEL_SAMPLING=0`.
#[test]
#[ignore = "timing"]
fn step_host_time_at_8_slots() {
    for (name, temperature, presence) in [
        ("greedy", 0.0, 0.0),
        ("t0.7 top-p 0.8 presence 0.5", 0.7, 0.5),
    ] {
        let model = Arc::new(FakeModel::new(152_064, Duration::ZERO));
        let s = start(&model, 8, 256);
        let t0 = Instant::now();
        let streams: Vec<_> = (0..8u32)
            .map(|i| {
                let mut r = request(vec![i + 1, 2, 3], 64);
                r.sampling = SamplingParams {
                    temperature,
                    top_p: 0.8,
                    presence_penalty: presence,
                    seed: Some(i as u64),
                    ..Default::default()
                };
                s.submit(r).unwrap()
            })
            .collect();
        for rx in streams {
            collect(rx);
        }
        let steps = model.steps.lock().unwrap().len();
        let secs = t0.elapsed().as_secs_f64();
        println!(
            "{name}: {steps} steps, {:.3} ms per step",
            secs * 1e3 / steps as f64
        );
    }
}

/// Steps whose sampled rows are all plain greedy ask the model for picks
/// (`forward_multi_greedy`), and give the model's greedy sequence; a request that needs the
/// distribution (logprobs, a penalty, a temperature) makes its steps ask for logits.
#[test]
fn greedy_steps_ask_for_picks_and_others_for_logits() {
    let model = Arc::new(FakeModel::new(50, Duration::ZERO));
    let s = start(&model, 2, 64);
    let prompts = [vec![1u32, 2, 3, 4, 5], vec![9, 8]];
    let rx: Vec<_> = prompts
        .iter()
        .map(|p| s.submit(request(p.clone(), 10)).unwrap())
        .collect();
    for (p, rx) in prompts.iter().zip(rx) {
        assert_eq!(collect(rx).0, reference(&model, p, 10, &[]));
    }
    drop(s);
    let steps = model.steps.lock().unwrap().len();
    assert!(steps > 0);
    assert_eq!(model.greedy_calls.load(Ordering::SeqCst), steps);

    for (what, change) in [
        ("logprobs", 0),
        ("presence penalty", 1),
        ("temperature", 2),
        ("logit bias", 3),
    ] {
        let model = Arc::new(FakeModel::new(50, Duration::ZERO));
        let s = start(&model, 2, 64);
        let mut r = request(vec![3, 1, 4], 6);
        match change {
            0 => r.logprobs = Some(2),
            1 => r.sampling.presence_penalty = 0.5,
            2 => r.sampling.temperature = 0.7,
            _ => r.sampling.logit_bias = vec![(7, 1.0)],
        }
        let (tokens, end) = collect(s.submit(r).unwrap());
        assert!(
            matches!(end, GenerationEvent::Done { .. }),
            "{what}: {end:?}"
        );
        assert_eq!(tokens.len(), 6, "{what}");
        drop(s);
        assert_eq!(model.greedy_calls.load(Ordering::SeqCst), 0, "{what}");
        // a temperature with the default top-k 40 draws from the 40 best logits alone
        let tops = model.top_calls.load(Ordering::SeqCst);
        assert_eq!(
            tops > 0,
            what == "temperature",
            "{what}: {tops} top-k steps"
        );
    }
}

/// Seeded top-k sampling from the model's best logits alone (the step asks for top-k lists)
/// draws the same tokens as from whole rows (logprobs make the step ask for logits), several
/// requests batched, with top-p and min-p on; top-k 0 (off) takes whole rows.
#[test]
fn top_k_steps_draw_what_whole_rows_draw() {
    let run = |logprobs: Option<usize>, top_k: usize| {
        let model = Arc::new(FakeModel::new(300, Duration::ZERO));
        let s = start(&model, 3, 64);
        let rx: Vec<_> = (0..3u32)
            .map(|i| {
                let mut r = request(vec![i + 2, 7, 1], 12);
                r.logprobs = logprobs;
                r.sampling = SamplingParams {
                    temperature: 1.5,
                    top_k,
                    top_p: 0.97,
                    min_p: 0.01,
                    seed: Some(40 + i as u64),
                    ..Default::default()
                };
                s.submit(r).unwrap()
            })
            .collect();
        let out: Vec<Vec<u32>> = rx.into_iter().map(|rx| collect(rx).0).collect();
        drop(s);
        (out, model.top_calls.load(Ordering::SeqCst))
    };
    let (whole, n_whole) = run(Some(0), 20);
    let (top, n_top) = run(None, 20);
    assert_eq!(n_whole, 0);
    assert!(n_top > 0);
    assert_eq!(top, whole);
    assert!(whole.iter().all(|t| t.len() == 12));
    // the fake model's logits give every token some probability at t = 1.5: not all greedy
    assert!(
        whole
            .iter()
            .flatten()
            .collect::<std::collections::HashSet<_>>()
            .len()
            > 12
    );
    assert_eq!(run(None, 0).1, 0);
}
