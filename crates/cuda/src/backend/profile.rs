//! Per-op device time (`REDLINE_PROFILE_OPS=1`): every `Backend` op of a [`super::CudaBackend`]
//! is bracketed by two CUDA events and its device time added to a table keyed by op kind (and,
//! for matmuls, weight type × shape × rows), which [`op_profile_report`] prints.
//!
//! Profiling turns CUDA graphs off (steps run eagerly). An eager step is host-bound: a 3 µs
//! kernel whose launch arrives after the previous kernel finished would be timed with the
//! host's launch gap in it. So each decode step starts with a device-side spin
//! (`mo_spin_ns`, [`SPIN_NS`] long) while the host queues the whole step behind it; the events
//! then time kernels running back to back, as they would in a graph. The table also has the
//! device time of whole steps (first op to last op), so `sum(ops)` vs `step` shows the
//! inter-kernel gaps.

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};

use backend::BackendError;
use cudarc::driver::{sys, CudaEvent, CudaStream, LaunchConfig, PushKernelArg};

use super::{dev_err, CudaBackend};

/// Device spin at the start of each profiled step (ns): longer than the host needs to queue a
/// 64-layer step eagerly (~1300 launches + 2600 event records).
const SPIN_NS: u64 = 40_000_000;
/// Pending event pairs beyond this are harvested mid-step (prefill calls have no step).
const MAX_PENDING: usize = 4096;

/// Op kinds (a label's first word: `attention`, `rms_norm`, `matmul_many`, …) that
/// `REDLINE_SKIP_OPS` (comma-separated) says to leave out: a diagnostic for the cost of an op
/// inside a recorded step (the tg difference with and without it). The outputs are wrong.
fn skipped_ops() -> &'static [String] {
    static SKIP: OnceLock<Vec<String>> = OnceLock::new();
    SKIP.get_or_init(|| {
        std::env::var("REDLINE_SKIP_OPS")
            .map(|v| {
                v.split(',')
                    .map(|s| s.trim().to_string())
                    .filter(|s| !s.is_empty())
                    .collect()
            })
            .unwrap_or_default()
    })
}

/// Whether `REDLINE_PROFILE_OPS` asks for the per-op profile (read once).
pub fn op_profile_enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        std::env::var("REDLINE_PROFILE_OPS").is_ok_and(|v| !v.is_empty() && v != "0")
    })
}

/// Calls and total device milliseconds per label, over every profiled backend of the process.
#[derive(Default)]
struct Totals {
    rows: BTreeMap<String, (u64, f64)>,
}

fn totals() -> &'static Mutex<Totals> {
    static T: OnceLock<Mutex<Totals>> = OnceLock::new();
    T.get_or_init(|| Mutex::new(Totals::default()))
}

/// Forgets everything timed so far (e.g. a warm-up that compiled kernels).
pub fn op_profile_reset() {
    totals()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .rows
        .clear();
}

/// The table of device time per op label, most expensive first, or `None` when profiling is
/// off. Per-step figures divide by the number of profiled steps (label `step`).
pub fn op_profile_report() -> Option<String> {
    if !op_profile_enabled() {
        return None;
    }
    let t = totals().lock().unwrap_or_else(|e| e.into_inner());
    let steps = t.rows.get("step").map_or(0, |r| r.0).max(1);
    let mut rows: Vec<(&String, &(u64, f64))> = t
        .rows
        .iter()
        .filter(|(k, _)| k.as_str() != "step")
        .collect();
    rows.sort_by(|a, b| b.1 .1.total_cmp(&a.1 .1));
    let op_sum: f64 = rows.iter().map(|r| r.1 .1).sum();
    let step_ms = t.rows.get("step").map_or(0.0, |r| r.1);
    let mut s = format!(
        "op profile: {steps} steps; device ms per step: ops {:.3}, whole step {:.3} (gaps {:.3})\n",
        op_sum / steps as f64,
        step_ms / steps as f64,
        (step_ms - op_sum) / steps as f64
    );
    s.push_str(&format!(
        "{:<52} {:>10} {:>11} {:>9} {:>6}\n",
        "op", "calls/step", "ms/step", "us/call", "%"
    ));
    for (label, &(calls, ms)) in rows {
        s.push_str(&format!(
            "{:<52} {:>10.1} {:>11.4} {:>9.2} {:>6.1}\n",
            label,
            calls as f64 / steps as f64,
            ms / steps as f64,
            1000.0 * ms / calls.max(1) as f64,
            100.0 * ms / op_sum.max(1e-12)
        ));
    }
    Some(s)
}

/// Event pairs of one backend not yet read back.
pub(super) struct OpProfile {
    pending: Vec<(String, CudaEvent, CudaEvent)>,
    pool: Vec<CudaEvent>,
    /// Start event of the open step (recorded after the spin).
    step_start: Option<CudaEvent>,
}

// SAFETY: CUDA events are plain driver handles usable from any thread bound to their context
// (cudarc binds before each call); the profile is only touched behind the backend's mutex.
unsafe impl Send for OpProfile {}

impl OpProfile {
    pub(super) fn new() -> OpProfile {
        OpProfile {
            pending: Vec::new(),
            pool: Vec::new(),
            step_start: None,
        }
    }

    fn event(&mut self, stream: &CudaStream) -> Result<CudaEvent, BackendError> {
        let e = match self.pool.pop() {
            Some(e) => e,
            None => stream
                .context()
                .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(dev_err)?,
        };
        e.record(stream).map_err(dev_err)?;
        Ok(e)
    }

    /// Waits for the stream and adds every pending pair to the totals.
    fn harvest(&mut self) -> Result<(), BackendError> {
        let mut t = totals().lock().unwrap_or_else(|e| e.into_inner());
        for (label, a, b) in self.pending.drain(..) {
            let ms = a.elapsed_ms(&b).map_err(dev_err)? as f64;
            let row = t.rows.entry(label).or_insert((0, 0.0));
            row.0 += 1;
            row.1 += ms;
            self.pool.push(a);
            self.pool.push(b);
        }
        Ok(())
    }
}

impl CudaBackend {
    /// Runs one op, timed on the device when profiling.
    pub(super) fn timed<T: Default>(
        &self,
        label: impl FnOnce() -> String,
        op: impl FnOnce() -> Result<T, BackendError>,
    ) -> Result<T, BackendError> {
        // Every op counts (the fused paths reuse a q8_1 copy only from the op before).
        self.ops.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let skip = skipped_ops();
        if self.profile.is_none() && skip.is_empty() {
            return op();
        }
        let label = label();
        if skip
            .iter()
            .any(|k| label.split(' ').next() == Some(k.as_str()))
        {
            return Ok(T::default());
        }
        let Some(p) = &self.profile else {
            return op();
        };
        let stream = self.dev.stream();
        let start = p.lock().unwrap_or_else(|e| e.into_inner()).event(stream)?;
        let r = op();
        let mut p = p.lock().unwrap_or_else(|e| e.into_inner());
        let end = p.event(stream)?;
        p.pending.push((label, start, end));
        if p.pending.len() >= MAX_PENDING {
            p.harvest()?;
        }
        r
    }

    /// Profiled step start: the device spins while the host queues the step.
    pub(super) fn profile_begin_step(&self) -> Result<(), BackendError> {
        let Some(p) = &self.profile else {
            return Ok(());
        };
        let stream = self.dev.stream();
        let f = self.function("mo_spin_ns")?;
        let ns = SPIN_NS;
        let mut b = stream.launch_builder(&f);
        b.arg(&ns);
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: matches mo_spin_ns(unsigned long long ns); touches no memory.
        unsafe { b.launch(cfg) }.map_err(dev_err)?;
        let mut p = p.lock().unwrap_or_else(|e| e.into_inner());
        let e = p.event(stream)?;
        p.step_start = Some(e);
        Ok(())
    }

    /// Profiled step end: times the whole step and reads every pair back.
    pub(super) fn profile_end_step(&self) -> Result<(), BackendError> {
        let Some(p) = &self.profile else {
            return Ok(());
        };
        let stream = self.dev.stream();
        let mut p = p.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(start) = p.step_start.take() {
            let end = p.event(stream)?;
            p.pending.push(("step".to_string(), start, end));
        }
        p.harvest()
    }
}
