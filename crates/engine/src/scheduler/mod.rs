//! Slot scheduler: continuous batching of many generation requests over one model.
//!
//! `n_slots` sequences each own a KV cache. One scheduler thread loops:
//! 1. admit queued requests into free slots, choosing the slot whose cached tokens share
//!    the longest prefix with the prompt (so a new chat turn prefills only its new tokens);
//! 2. drop requests whose receiver was dropped (client gone) and free their slots;
//! 3. run one mixed step through `BatchModel::forward_multi`: the next token of every
//!    generating slot plus prompt chunks of the oldest waiting prompts, at most
//!    `prefill_chunk` prompt tokens in all (the weights are read once for all of them), so a
//!    running stream gets a token every step and a long prompt only makes each step up to
//!    one chunk larger. With a drafter (`BatchModel::speculation`, e.g.
//!    `speculative::SpecBatch`), each decode row is a verify pass of the pending token plus
//!    drafts from batched draft steps; see `speculation.rs`.
//!
//! Callers talk to it through [`Scheduler::submit`] and a channel of [`GenerationEvent`]s.

mod batch_loop;
mod batch_model;
#[cfg(test)]
mod fake_model;
mod request;
mod sampling;
mod speculation;

pub use batch_model::{
    cut_rows, forward_multi_by_parts, greedy_picks_of_logits, top_k_of_logits, BatchModel,
};
pub use request::{
    FinishReason, GenerationEvent, GenerationRequest, GenerationStream, SamplingParams, SpecUsage,
    TokenConstraint, TokenLogprob, Usage,
};
pub use sampling::{token_logprob, RequestSampler};

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use tokio::sync::mpsc;

#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    /// Sequences decoded together.
    pub n_slots: usize,
    /// Context (tokens) of each slot's cache.
    pub n_ctx_per_slot: usize,
    /// Requests waiting for a slot beyond which `submit` answers `QueueFull`.
    pub max_queue: usize,
    /// Prompt tokens computed per scheduler step (shared by the waiting prompts, oldest
    /// first), on top of one decode token per running slot.
    pub prefill_chunk: usize,
    /// End-of-generation token ids (eos, eot, im_end …).
    pub eog_tokens: Vec<u32>,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            n_slots: 1,
            n_ctx_per_slot: 2048,
            max_queue: 64,
            prefill_chunk: 256,
            eog_tokens: Vec::new(),
        }
    }
}

#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum SchedulerError {
    #[error("the request queue is full ({0} waiting)")]
    QueueFull(usize),
    #[error("the server is shutting down")]
    ShuttingDown,
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("the prompt has {prompt} tokens; with max_tokens {max_tokens} it exceeds the context of {n_ctx} tokens")]
    ContextExceeded {
        prompt: usize,
        max_tokens: usize,
        n_ctx: usize,
    },
    #[error("invalid scheduler configuration: {0}")]
    Config(String),
}

/// Counters since start and current gauges, for `/metrics`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SchedulerStats {
    pub n_slots: usize,
    pub busy_slots: usize,
    pub queue_depth: usize,
    /// Tokens held in all slots' caches, and their capacity.
    pub kv_tokens_used: usize,
    pub kv_tokens_capacity: usize,
    pub requests_total: u64,
    pub requests_cancelled: u64,
    pub requests_failed: u64,
    pub prompt_tokens_total: u64,
    /// Prompt tokens reused from a slot's cache instead of computed.
    pub cached_prompt_tokens_total: u64,
    pub generated_tokens_total: u64,
    /// Prompt tokens computed and the seconds spent on them.
    pub prefill_tokens_total: u64,
    pub prefill_seconds_total: f64,
    /// Tokens decoded (one per slot per step) and the seconds spent in batched decode steps.
    pub decode_tokens_total: u64,
    pub decode_seconds_total: f64,
}

/// A queued request and where its events go.
struct Job {
    request: GenerationRequest,
    events: mpsc::UnboundedSender<GenerationEvent>,
    enqueued: Instant,
}

struct Queue {
    jobs: VecDeque<Job>,
    shutting_down: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
    stats: Mutex<SchedulerStats>,
    running: AtomicBool,
    /// The scheduler thread, taken by [`Scheduler::wait_stopped`].
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// Handle to the scheduler thread; cheap to clone.
#[derive(Clone)]
pub struct Scheduler {
    shared: Arc<Shared>,
    config: Arc<SchedulerConfig>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic elsewhere must not take the server down with it: the data under these
    // locks (a queue, counters) stays consistent between statements.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Scheduler {
    /// Starts the scheduler thread over `model`.
    pub fn start<M: BatchModel>(
        model: Arc<M>,
        config: SchedulerConfig,
    ) -> Result<Scheduler, SchedulerError> {
        if config.n_slots == 0 || config.n_ctx_per_slot < 2 || config.prefill_chunk == 0 {
            return Err(SchedulerError::Config(format!(
                "n_slots {} (>= 1), n_ctx_per_slot {} (>= 2), prefill_chunk {} (>= 1)",
                config.n_slots, config.n_ctx_per_slot, config.prefill_chunk
            )));
        }
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                jobs: VecDeque::new(),
                shutting_down: false,
            }),
            wake: Condvar::new(),
            stats: Mutex::new(SchedulerStats {
                n_slots: config.n_slots,
                kv_tokens_capacity: config.n_slots * config.n_ctx_per_slot,
                ..Default::default()
            }),
            running: AtomicBool::new(true),
            thread: Mutex::new(None),
        });
        let config = Arc::new(config);
        let (s, c) = (shared.clone(), config.clone());
        let handle = std::thread::Builder::new()
            .name("scheduler".into())
            .spawn(move || batch_loop::run(model, s, c))
            .map_err(|e| {
                SchedulerError::Config(format!("cannot start the scheduler thread: {e}"))
            })?;
        *lock(&shared.thread) = Some(handle);
        Ok(Scheduler { shared, config })
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    /// Queues a request. Fails at once if the queue is full, the server is stopping, or the
    /// prompt plus `max_tokens` cannot fit a slot's context.
    pub fn submit(&self, request: GenerationRequest) -> Result<GenerationStream, SchedulerError> {
        if request.prompt.is_empty() {
            return Err(SchedulerError::EmptyPrompt);
        }
        let n_ctx = self.config.n_ctx_per_slot;
        if request.prompt.len() >= n_ctx || request.max_tokens > n_ctx - request.prompt.len() {
            return Err(SchedulerError::ContextExceeded {
                prompt: request.prompt.len(),
                max_tokens: request.max_tokens,
                n_ctx,
            });
        }
        let mut q = lock(&self.shared.queue);
        if q.shutting_down || !self.shared.running.load(Ordering::Acquire) {
            return Err(SchedulerError::ShuttingDown);
        }
        if q.jobs.len() >= self.config.max_queue {
            return Err(SchedulerError::QueueFull(q.jobs.len()));
        }
        let (tx, rx) = mpsc::unbounded_channel();
        q.jobs.push_back(Job {
            request,
            events: tx,
            enqueued: Instant::now(),
        });
        drop(q);
        self.shared.wake.notify_all();
        Ok(rx)
    }

    pub fn stats(&self) -> SchedulerStats {
        let mut s = lock(&self.shared.stats).clone();
        s.queue_depth = lock(&self.shared.queue).jobs.len();
        s
    }

    /// Stops accepting requests; queued and running ones still finish, then the thread exits.
    pub fn shutdown(&self) {
        lock(&self.shared.queue).shutting_down = true;
        self.shared.wake.notify_all();
    }

    /// After [`Scheduler::shutdown`]: waits up to `timeout` for the scheduler thread to finish
    /// its running generations and exit, and joins it (its model states are freed by then).
    /// True when it has exited. A process must not exit while the thread still runs: on the
    /// GPU the driver tears its context down at exit under the thread's feet.
    pub fn wait_stopped(&self, timeout: std::time::Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while self.is_running() {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        if let Some(h) = lock(&self.shared.thread).take() {
            let _ = h.join();
        }
        true
    }

    /// False once the scheduler thread has exited.
    pub fn is_running(&self) -> bool {
        self.shared.running.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod spec_tests;
#[cfg(test)]
mod tests;
