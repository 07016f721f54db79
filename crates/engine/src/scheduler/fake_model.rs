//! A deterministic stand-in model for scheduler tests: the greedy next token depends on the
//! whole sequence so far, so a wrong cache (bad prefix reuse, mixed-up batch rows) shows.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use super::{forward_multi_by_parts, greedy_picks_of_logits, top_k_of_logits, BatchModel};

pub struct FakeModel {
    pub n_vocab: usize,
    /// Sleep per model call, to make steps observable.
    pub delay: Duration,
    pub prefill_tokens: AtomicUsize,
    pub decode_calls: AtomicUsize,
    pub max_batch: AtomicUsize,
    /// Truncate only to checkpoints, as a model with recurrent state does.
    pub restore_points: bool,
    /// `forward_multi` runs as one call (as `ModelOn::forward_multi`); false: the trait's
    /// by-parts fallback (prefill calls + one decode_batch).
    pub native_multi: bool,
    /// Every token appended to any state, by any call.
    pub tokens_fed: AtomicUsize,
    /// `forward_multi_greedy` calls (steps that asked for greedy picks, not logits).
    pub greedy_calls: AtomicUsize,
    /// `forward_multi_top` calls (steps that asked for top-k lists).
    pub top_calls: AtomicUsize,
    /// One entry per `forward_multi` call: (state id, tokens appended) per sequence.
    pub steps: Mutex<Vec<Vec<(usize, usize)>>>,
    next_state_id: AtomicUsize,
}

impl FakeModel {
    pub fn new(n_vocab: usize, delay: Duration) -> FakeModel {
        FakeModel {
            n_vocab,
            delay,
            prefill_tokens: AtomicUsize::new(0),
            decode_calls: AtomicUsize::new(0),
            max_batch: AtomicUsize::new(0),
            restore_points: false,
            native_multi: true,
            tokens_fed: AtomicUsize::new(0),
            greedy_calls: AtomicUsize::new(0),
            top_calls: AtomicUsize::new(0),
            steps: Mutex::new(Vec::new()),
            next_state_id: AtomicUsize::new(0),
        }
    }

    /// The token the fake model favours after `seq`.
    pub fn next_after(&self, seq: &[u32]) -> u32 {
        let h = seq
            .iter()
            .fold(17u64, |h, &t| h.wrapping_mul(31).wrapping_add(t as u64 + 1));
        (h % self.n_vocab as u64) as u32
    }

    fn logits(&self, seq: &[u32]) -> Vec<f32> {
        let mut l: Vec<f32> = (0..self.n_vocab).map(|j| (j % 7) as f32 * 0.1).collect();
        l[self.next_after(seq) as usize] = 5.0;
        l
    }
}

pub struct FakeState {
    /// Creation order, for the step log.
    pub id: usize,
    tokens: Vec<u32>,
    n_ctx: usize,
    checkpoints: Vec<usize>,
}

impl BatchModel for FakeModel {
    type State = FakeState;

    fn n_vocab(&self) -> usize {
        self.n_vocab
    }

    fn new_state(&self, n_ctx: usize) -> Result<FakeState, String> {
        Ok(FakeState {
            id: self.next_state_id.fetch_add(1, Ordering::SeqCst),
            tokens: Vec::new(),
            n_ctx,
            checkpoints: Vec::new(),
        })
    }

    fn state_len(&self, state: &FakeState) -> usize {
        state.tokens.len()
    }

    fn truncate(&self, state: &mut FakeState, pos: usize) -> Result<usize, String> {
        if pos > state.tokens.len() {
            return Err("truncate past the end".into());
        }
        // Like a recurrent model: only restore points are reachable.
        let kept = match self.restore_points {
            true => state
                .checkpoints
                .iter()
                .copied()
                .filter(|&c| c <= pos)
                .max()
                .unwrap_or(0),
            false => pos,
        };
        state.tokens.truncate(kept);
        state.checkpoints.retain(|&c| c <= kept);
        Ok(kept)
    }

    fn checkpoint(&self, state: &mut FakeState) {
        state.checkpoints.push(state.tokens.len());
    }

    fn prefill(&self, state: &mut FakeState, tokens: &[u32]) -> Result<Vec<f32>, String> {
        std::thread::sleep(self.delay);
        if state.tokens.len() + tokens.len() > state.n_ctx {
            return Err("context overflow".into());
        }
        self.prefill_tokens
            .fetch_add(tokens.len(), Ordering::SeqCst);
        self.tokens_fed.fetch_add(tokens.len(), Ordering::SeqCst);
        state.tokens.extend_from_slice(tokens);
        Ok(self.logits(&state.tokens))
    }

    fn decode_batch(
        &self,
        states: &mut [&mut FakeState],
        tokens: &[u32],
    ) -> Result<Vec<f32>, String> {
        std::thread::sleep(self.delay);
        assert_eq!(states.len(), tokens.len());
        self.decode_calls.fetch_add(1, Ordering::SeqCst);
        self.max_batch.fetch_max(tokens.len(), Ordering::SeqCst);
        let mut out = Vec::with_capacity(tokens.len() * self.n_vocab);
        for (s, &t) in states.iter_mut().zip(tokens) {
            if s.tokens.len() >= s.n_ctx {
                return Err("context overflow".into());
            }
            s.tokens.push(t);
            self.tokens_fed.fetch_add(1, Ordering::SeqCst);
            out.extend(self.logits(&s.tokens));
        }
        Ok(out)
    }

    fn forward_multi(
        &self,
        states: &mut [&mut FakeState],
        tokens: &[&[u32]],
    ) -> Result<Vec<f32>, String> {
        let log: Vec<(usize, usize)> = states
            .iter()
            .zip(tokens)
            .map(|(s, t)| (s.id, t.len()))
            .collect();
        self.steps
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(log);
        if !self.native_multi {
            return forward_multi_by_parts(self, states, tokens);
        }
        std::thread::sleep(self.delay);
        assert_eq!(states.len(), tokens.len());
        // Checked before anything runs, as the real model does.
        if states
            .iter()
            .zip(tokens)
            .any(|(s, t)| t.is_empty() || s.tokens.len() + t.len() > s.n_ctx)
        {
            return Err("empty input or context overflow".into());
        }
        self.max_batch.fetch_max(tokens.len(), Ordering::SeqCst);
        let mut out = Vec::with_capacity(tokens.len() * self.n_vocab);
        for (s, t) in states.iter_mut().zip(tokens) {
            s.tokens.extend_from_slice(t);
            self.tokens_fed.fetch_add(t.len(), Ordering::SeqCst);
            out.extend(self.logits(&s.tokens));
        }
        Ok(out)
    }

    fn forward_multi_greedy(
        &self,
        states: &mut [&mut FakeState],
        tokens: &[&[u32]],
    ) -> Result<Vec<Option<u32>>, String> {
        self.greedy_calls.fetch_add(1, Ordering::SeqCst);
        greedy_picks_of_logits(self, states, tokens)
    }

    fn forward_multi_top(
        &self,
        states: &mut [&mut FakeState],
        tokens: &[&[u32]],
        k: usize,
    ) -> Result<Vec<Vec<(u32, f32)>>, String> {
        self.top_calls.fetch_add(1, Ordering::SeqCst);
        top_k_of_logits(self, states, tokens, k)
    }
}
