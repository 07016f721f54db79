//! A small persistent thread team for decode-sized work: the calling thread plus
//! `n_threads - 1` helpers that spin briefly between jobs, as ggml's CPU thread pool does.
//!
//! Why not rayon for decode: a one-token step is ~200 matvecs of 0.2–8 MB each, every one
//! a few tens of µs of work. Handing each to a rayon pool from outside it costs a futex
//! wake-up of a worker, the split, and a futex wake-up of the caller at the end: measured
//! ~50 µs per 1536 × 1536 Q4_K matvec on the 2-core box (86 µs per call vs ~35 µs of
//! kernel time per core), i.e. more than the work itself. Here the caller works too and a
//! helper that finished a job less than ~20 µs ago picks up the next one from a spin
//! loop, so a hand-off is one cache-line write.
//!
//! Work inside a job is shared dynamically: every participant calls the same closure,
//! which takes chunks from an atomic counter, so a helper that is late (parked, or
//! preempted by another process on a shared machine) costs nothing but its share.

use std::cell::UnsafeCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a helper spins for the next job before parking on a condition variable
/// (`REDLINE_TEAM_SPIN_US` overrides, for tuning).
fn spin_time() -> Duration {
    static SPIN: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *SPIN.get_or_init(|| {
        let us = std::env::var("REDLINE_TEAM_SPIN_US")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(20);
        Duration::from_micros(us)
    })
}

/// The job of the current epoch: a closure borrowed from [`Team::run`]'s caller.
type Job = *const (dyn Fn() + Sync);

struct Shared {
    /// `epoch << 1 | open`: the job count and whether the current job takes helpers.
    /// One word, so a helper can never see a new job's pointer under an old epoch (and
    /// run a job twice). Opened (with the next epoch) after `job` is written; closed once
    /// the caller's own call returned: helpers that have not entered by then skip the
    /// job (all of its work is taken), so a parked or preempted helper never holds up
    /// the caller.
    state: AtomicU64,
    /// Written by the caller while no helper is inside a job (`active` is 0, the state
    /// closed), read by helpers only after they entered (`active` raised, state open).
    job: UnsafeCell<Job>,
    /// Helpers inside the current job.
    active: AtomicUsize,
    /// Helpers waiting on `wake`.
    sleeping: AtomicUsize,
    panicked: AtomicBool,
    quit: AtomicBool,
    lock: Mutex<()>,
    wake: Condvar,
}

// SAFETY: `job` is only written by the one caller holding `Team::busy` while the state is
// closed and no helper is active; helpers read it only after raising `active` and seeing
// the state open (SeqCst on both sides: one of the two sees the other), and the caller
// waits for `active` to drop to 0 before returning, so the closure outlives every use.
unsafe impl Sync for Shared {}
// SAFETY: as above; the raw pointer is only dereferenced under that protocol.
unsafe impl Send for Shared {}

/// The caller plus `n_threads - 1` helper threads. Dropping it stops the helpers.
pub struct Team {
    shared: Arc<Shared>,
    helpers: Vec<JoinHandle<()>>,
    /// One job at a time; a nested or concurrent `run` runs inline instead.
    busy: Mutex<()>,
}

impl Team {
    /// A team of `n_threads` participants (the caller and `n_threads - 1` helpers; 0 or 1
    /// means the caller alone).
    pub fn new(n_threads: usize) -> Team {
        let shared = Arc::new(Shared {
            state: AtomicU64::new(0),
            job: UnsafeCell::new(std::ptr::null::<fn()>() as Job),
            active: AtomicUsize::new(0),
            sleeping: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            quit: AtomicBool::new(false),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        let helpers = (1..n_threads.max(1))
            .map(|i| {
                let s = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("redline-team-{i}"))
                    .spawn(move || helper_loop(&s))
                    .expect("spawn team helper thread")
            })
            .collect();
        Team {
            shared,
            helpers,
            busy: Mutex::new(()),
        }
    }

    /// Participants, the caller included.
    pub fn n_threads(&self) -> usize {
        self.helpers.len() + 1
    }

    /// `f(i)` for every `i` in `0..n`, each exactly once, spread over the participants that
    /// join (tasks taken from one counter); the results in index order.
    pub fn map<T: Send>(&self, n: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
        let slots: Vec<Mutex<Option<T>>> = (0..n).map(|_| Mutex::new(None)).collect();
        let next = AtomicUsize::new(0);
        self.run(&|| loop {
            let i = next.fetch_add(1, Relaxed);
            let Some(slot) = slots.get(i) else { break };
            let r = f(i);
            *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
        });
        slots
            .into_iter()
            .map(|m| {
                m.into_inner()
                    .unwrap_or_else(|e| e.into_inner())
                    .expect("every task of Team::map ran")
            })
            .collect()
    }

    /// Runs `f` on the caller and on every helper that joins before the caller's own call
    /// returns, and returns when all of those calls have returned. So `f` runs at least
    /// once and at most `n_threads` times, concurrently: it must share the work itself
    /// (e.g. chunks from an atomic counter) and leave nothing undone when called once.
    /// Panics if a helper's call panicked.
    pub fn run(&self, f: &(dyn Fn() + Sync)) {
        let guard = match self.busy.try_lock() {
            Ok(g) if !self.helpers.is_empty() => g,
            _ => {
                f();
                return;
            }
        };
        let s = &*self.shared;
        // SAFETY: we hold `busy`, the state is closed and `active` is 0 (the previous run waited
        // for that), so no helper reads `job` now. The pointer's lifetime is erased; it is
        // not dereferenced after this function returns (we wait for `active` to reach 0).
        unsafe {
            *s.job.get() = std::mem::transmute::<&(dyn Fn() + Sync), Job>(f);
        }
        let epoch = (s.state.load(Relaxed) >> 1) + 1;
        s.state.store(epoch << 1 | 1, SeqCst);
        if s.sleeping.load(SeqCst) > 0 {
            let _l = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        let mine = catch_unwind(AssertUnwindSafe(f));
        s.state.store(epoch << 1, SeqCst);
        let mut spins = 0u32;
        while s.active.load(SeqCst) > 0 {
            spins += 1;
            if spins < 1 << 14 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        let helper_panicked = s.panicked.swap(false, Relaxed);
        drop(guard);
        if let Err(p) = mine {
            std::panic::resume_unwind(p);
        }
        if helper_panicked {
            panic!("a team helper thread panicked");
        }
    }
}

impl Drop for Team {
    fn drop(&mut self) {
        let s = &*self.shared;
        s.quit.store(true, SeqCst);
        {
            let _l = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        for h in self.helpers.drain(..) {
            let _ = h.join();
        }
    }
}

fn helper_loop(s: &Shared) {
    let spin = spin_time();
    let mut seen = 0u64;
    loop {
        // Spin, then park until the epoch moves.
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            if s.quit.load(Relaxed) {
                return;
            }
            if s.state.load(Acquire) >> 1 != seen {
                break;
            }
            spins += 1;
            if !spins.is_multiple_of(1024) || start.elapsed() < spin {
                std::hint::spin_loop();
                continue;
            }
            let mut l = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.sleeping.fetch_add(1, SeqCst);
            while s.state.load(SeqCst) >> 1 == seen && !s.quit.load(SeqCst) {
                l = s.wake.wait(l).unwrap_or_else(|e| e.into_inner());
            }
            s.sleeping.fetch_sub(1, SeqCst);
            break;
        }
        if s.quit.load(Relaxed) {
            return;
        }
        s.active.fetch_add(1, SeqCst);
        let state = s.state.load(SeqCst);
        seen = state >> 1;
        if state & 1 == 1 {
            // SAFETY: the state was open after we raised `active`, so the caller wrote
            // `job` before opening it and waits for `active` to drop before returning.
            let job = unsafe { &**s.job.get() };
            if catch_unwind(AssertUnwindSafe(job)).is_err() {
                s.panicked.store(true, Relaxed);
            }
        }
        s.active.fetch_sub(1, SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_participant_runs_each_job_once() {
        for n in [0, 1, 2, 3] {
            let team = Team::new(n);
            for round in 0..2000 {
                let calls = AtomicUsize::new(0);
                team.run(&|| {
                    calls.fetch_add(1, Relaxed);
                });
                let c = calls.load(Relaxed);
                assert!(c >= 1 && c <= n.max(1), "n {n} round {round}: {c} calls");
                if round % 500 == 0 {
                    // Let helpers park, so the wake-up path is exercised too.
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
        }
    }

    #[test]
    fn shared_counter_covers_all_chunks() {
        let team = Team::new(2);
        let next = AtomicUsize::new(0);
        let sum = AtomicU64::new(0);
        team.run(&|| loop {
            let i = next.fetch_add(1, Relaxed);
            if i >= 10_000 {
                break;
            }
            sum.fetch_add(i as u64, Relaxed);
        });
        assert_eq!(sum.load(Relaxed), 10_000 * 9_999 / 2);
    }

    #[test]
    fn map_runs_every_index_once_in_order() {
        for n in [0, 1, 2, 3] {
            let team = Team::new(n);
            for len in [0usize, 1, 2, 7, 1000] {
                let calls = AtomicUsize::new(0);
                let got = team.map(len, |i| {
                    calls.fetch_add(1, Relaxed);
                    i * i
                });
                assert_eq!(got, (0..len).map(|i| i * i).collect::<Vec<_>>());
                assert_eq!(calls.load(Relaxed), len);
            }
        }
    }

    #[test]
    fn nested_run_is_inline_and_helper_panic_propagates() {
        let team = Team::new(2);
        let calls = AtomicUsize::new(0);
        team.run(&|| {
            team.run(&|| {
                calls.fetch_add(1, Relaxed);
            });
        });
        let c = calls.load(Relaxed);
        assert!(c == 1 || c == 2, "{c}");
        let r = catch_unwind(AssertUnwindSafe(|| team.run(&|| panic!("boom"))));
        assert!(r.is_err());
        // Still usable afterwards.
        let calls = AtomicUsize::new(0);
        team.run(&|| {
            calls.fetch_add(1, Relaxed);
        });
        assert!(calls.load(Relaxed) >= 1);
    }
}
