//! Decode steps without gaps: per-step temporaries from a bump arena, host inputs through one
//! pinned staging buffer, and the whole step recorded once as a CUDA graph and replayed.
//!
//! `Backend::begin_step(key)` opens a step. Per key:
//! 1. first time: **eager** — ops run as called, but tensors come from the arena (reset every
//!    step, never freed while graphs may point into it) and host integers go through the
//!    staging buffer (pinned host words + a device mirror, one async copy per op). This warms
//!    everything a capture cannot do: kernel compilation, scratch and arena growth.
//! 2. second time: **capture** — the stream is recorded into a graph whose first node copies
//!    the staging words the warm step used to the device; ops record their launches and write
//!    their host inputs into the same pinned slots. `end_step` instantiates and launches it.
//! 3. later: **replay** — ops launch nothing and only write their host inputs into the same
//!    slots (the model's host code runs the same op sequence, so slots and arena addresses
//!    repeat); `end_step` launches the graph: one H2D copy + every kernel of the step.
//!
//! **Segments**: the model marks the end of every layer (`Backend::step_mark`). At the marks
//! of [`split_marks`] (after layer 2 by default) a recording is cut: a replay
//! launches the part recorded so far right there, so the card starts on the first layers while
//! the host walks the rest (the walk of an 8-row 32B step is 0.2–0.4 ms; unsplit, the card
//! waited for all of it). Each part's graph starts with the copy of its own staging words.
//! A capture cuts the same way and launches every part at the end.
//!
//! Kernels in a step never take a size that changes between steps with one key from the host:
//! positions and lengths are read on the device (attention splits are sized from `n_ctx`).
//! `REDLINE_CUDA_GRAPHS=0` keeps steps eager (for debugging).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use backend::{BackendError, StepMode};
use cudarc::driver::sys::{self, CUdeviceptr};
use cudarc::driver::{result, CudaGraph, CudaSlice, CudaStream};

use super::dev_err;

/// Arena chunks are at least this big (bytes).
const ARENA_CHUNK_BYTES: usize = 64 << 20;
/// Arena and staging allocations are aligned to this many bytes.
const ALIGN_BYTES: usize = 256;
/// Staging words (4 bytes each) for the host inputs of one step.
const STAGING_WORDS: usize = 1 << 20;
/// Most recorded graphs kept; the least recently used one is dropped beyond this.
const MAX_GRAPHS: usize = 64;
/// Most keys remembered as warmed or failed (a server sees a new key per batch composition);
/// beyond this the sets start over.
const MAX_KEYS: usize = 4096;

/// What the ops of the current step do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// No step open: ops allocate and upload as they go (prefill, tests).
    Off,
    /// Arena + staging, launches run now.
    Eager,
    /// Arena + staging, launches are recorded.
    Capture,
    /// Arena + staging, nothing is launched.
    Replay,
}

/// Device memory from `cuMemAlloc` (not stream-ordered, so it may grow during a capture).
struct Chunk {
    ptr: CUdeviceptr,
    bytes: usize,
}

impl Drop for Chunk {
    fn drop(&mut self) {
        // SAFETY: ptr came from malloc_sync and is freed once; no graph that reads it is
        // launched after the arena is dropped (graphs are dropped first, see StepCtl).
        let _ = unsafe { result::free_sync(self.ptr) };
    }
}

/// Bump allocator for a step's temporaries, reset at every step. Chunks are only added, so
/// addresses recorded in a graph stay valid while the arena lives.
struct Arena {
    chunks: Vec<Chunk>,
    chunk: usize,
    offset: usize,
    /// Bytes handed out in this step: equal op sequences hand out equal amounts.
    handed: usize,
}

impl Arena {
    fn reset(&mut self) {
        self.chunk = 0;
        self.offset = 0;
        self.handed = 0;
    }

    fn alloc(&mut self, bytes: usize) -> Result<CUdeviceptr, BackendError> {
        let bytes = bytes.max(1).div_ceil(ALIGN_BYTES) * ALIGN_BYTES;
        self.handed += bytes;
        loop {
            match self.chunks.get(self.chunk) {
                Some(c) if self.offset + bytes <= c.bytes => {
                    let p = c.ptr + self.offset as u64;
                    self.offset += bytes;
                    return Ok(p);
                }
                Some(_) => {
                    self.chunk += 1;
                    self.offset = 0;
                }
                None => {
                    let size = bytes.max(ARENA_CHUNK_BYTES);
                    // SAFETY: a plain device allocation of `size` bytes, owned by Chunk.
                    let ptr =
                        unsafe { result::malloc_sync(size) }.map_err(|_| BackendError::Alloc {
                            what: "step arena",
                            bytes: size as u128,
                        })?;
                    self.chunks.push(Chunk { ptr, bytes: size });
                }
            }
        }
    }
}

/// Pinned host words and their device mirror: the host inputs of one step.
struct Staging {
    host: *mut u32,
    dev: CudaSlice<u32>,
    /// Words handed out in this step.
    used: usize,
}

impl Drop for Staging {
    fn drop(&mut self) {
        // SAFETY: host came from malloc_host and is freed once, after the graphs that read it.
        let _ = unsafe { result::free_host(self.host as *mut std::ffi::c_void) };
    }
}

/// Staging words and arena bytes one step used, and the staging words in use at each split
/// mark it passed.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Usage {
    staging_words: usize,
    arena_bytes: usize,
    splits: Vec<usize>,
}

/// A recorded step (one graph per segment, in order) and when it was last used.
struct Recorded {
    graphs: Vec<CudaGraph>,
    last_use: u64,
}

/// The layer marks after which a recorded step is cut into segments
/// (`REDLINE_STEP_SPLITS`: comma-separated marks, `0` or empty: never; default 2: the first
/// two layers' device time covers the host's walk of the rest, and every cut costs a graph
/// launch; H100, 32B, 8 rows: none 678 / 681 tok/s, `2` 695 / 698, `2,8,32` 692 / 693).
fn split_marks() -> &'static [usize] {
    static M: std::sync::OnceLock<Vec<usize>> = std::sync::OnceLock::new();
    M.get_or_init(|| match std::env::var("REDLINE_STEP_SPLITS") {
        Ok(v) => {
            let mut m: Vec<usize> = v
                .split(',')
                .filter_map(|x| x.trim().parse().ok())
                .filter(|&x| x > 0)
                .collect();
            m.sort_unstable();
            m.dedup();
            m
        }
        Err(_) => vec![2],
    })
}

/// The step machinery of one `CudaBackend` (behind its mutex).
pub(super) struct StepCtl {
    pub(super) mode: Mode,
    key: u64,
    /// Recorded steps first (they point into the arena and staging, dropped after them).
    graphs: HashMap<u64, Recorded>,
    /// Keys run eagerly once, with the staging words and arena bytes they used: a recording
    /// is kept and replayed only while its steps use exactly the same (so every slot and
    /// tensor, the downloaded logits included, sits where the graph has it).
    warmed: HashMap<u64, Usage>,
    /// Keys whose capture failed: they stay eager.
    failed: HashSet<u64>,
    arena: Arena,
    staging: Option<Staging>,
    /// This step's shared scratch (attention partials): arena address and f32 capacity.
    shared_scratch: Option<(CUdeviceptr, usize)>,
    tick: u64,
    graphs_enabled: bool,
    /// Steps captured and replayed so far (for tests and logs).
    pub(super) captures: u64,
    pub(super) replays: u64,
    /// Layer marks passed in the open step.
    marks: usize,
    /// Staging words in use at each split mark the open step passed.
    seg_words: Vec<usize>,
    /// Capture: the graphs of the segments recorded so far (launched when the step ends).
    pending: Vec<CudaGraph>,
    /// With `REDLINE_STEP_LOG=1`: when the open step's ops began and how long its opening
    /// waited for the previous step's work.
    log_t: Option<(std::time::Instant, f64)>,
    /// The side stream of L2 prefetch launches (super::prefetch), made at first use, and
    /// whether it has work the main stream has not joined yet (joined before every capture
    /// segment ends and at the step's end: nothing on the main stream waits for it before).
    side: Option<Arc<CudaStream>>,
    side_pending: bool,
    /// `REDLINE_TRACE` (crate::trace): the open step is the traced replay.
    trace_armed: bool,
}

// SAFETY: the raw pinned pointer and the graph handles are only used while the backend's
// mutex is held, on the backend's one stream.
unsafe impl Send for StepCtl {}

impl StepCtl {
    pub(super) fn new() -> StepCtl {
        let graphs_enabled = std::env::var("REDLINE_CUDA_GRAPHS").map_or(true, |v| v != "0");
        StepCtl {
            mode: Mode::Off,
            key: 0,
            graphs: HashMap::new(),
            warmed: HashMap::new(),
            failed: HashSet::new(),
            arena: Arena {
                chunks: Vec::new(),
                chunk: 0,
                offset: 0,
                handed: 0,
            },
            staging: None,
            shared_scratch: None,
            tick: 0,
            graphs_enabled,
            captures: 0,
            replays: 0,
            marks: 0,
            seg_words: Vec::new(),
            pending: Vec::new(),
            log_t: None,
            side: None,
            side_pending: false,
            trace_armed: false,
        }
    }

    /// The side stream, forked from `stream` at this point (it waits for the work queued on
    /// `stream` so far, then runs beside what follows); its work is joined back by
    /// [`Self::join_side`].
    pub(super) fn fork_side(
        &mut self,
        stream: &Arc<CudaStream>,
    ) -> Result<Arc<CudaStream>, BackendError> {
        let side = match &self.side {
            Some(s) => s.clone(),
            None => {
                let s = stream.context().new_stream().map_err(dev_err)?;
                self.side = Some(s.clone());
                s
            }
        };
        side.join(stream).map_err(dev_err)?;
        self.side_pending = true;
        Ok(side)
    }

    /// Makes `stream` wait for the side stream's work (a capture must join every stream it
    /// forked before it ends).
    fn join_side(&mut self, stream: &Arc<CudaStream>) -> Result<(), BackendError> {
        if !self.side_pending {
            return Ok(());
        }
        self.side_pending = false;
        match &self.side {
            Some(side) => stream.join(side).map_err(dev_err),
            None => Ok(()),
        }
    }

    pub(super) fn set_graphs_enabled(&mut self, on: bool) {
        self.graphs_enabled = on;
    }

    /// Drops every recorded graph (a buffer they point to is about to go away or move).
    pub(super) fn forget_graphs(&mut self) {
        self.graphs.clear();
        self.warmed.clear();
    }

    fn staging(&mut self, stream: &Arc<CudaStream>) -> Result<&mut Staging, BackendError> {
        if self.staging.is_none() {
            // SAFETY: pinned host memory of STAGING_WORDS words, owned by Staging.
            let host = unsafe { result::malloc_host(STAGING_WORDS * 4, 0) }.map_err(dev_err)?;
            let dev = stream.alloc_zeros::<u32>(STAGING_WORDS).map_err(dev_err)?;
            self.staging = Some(Staging {
                host: host as *mut u32,
                dev,
                used: 0,
            });
        }
        Ok(self.staging.as_mut().expect("created above"))
    }

    /// Opens a step (see the module notes). An unfinished step is aborted first.
    pub(super) fn begin(&mut self, key: u64, stream: &Arc<CudaStream>) -> StepMode {
        if self.mode != Mode::Off {
            self.abort(stream);
        }
        self.tick += 1;
        self.key = key;
        self.arena.reset();
        self.shared_scratch = None;
        self.marks = 0;
        self.seg_words.clear();
        self.pending.clear();
        // The previous step's graph may still read the pinned words we are about to rewrite.
        // (A failed sync means a lost device: the next op reports it.)
        let t0 = std::time::Instant::now();
        let _ = stream.synchronize();
        let waited = t0.elapsed().as_secs_f64() * 1e3;
        let mode = match self.open(key, stream) {
            Ok(m) => m,
            Err(e) => {
                // Recording is an optimization: say why it is off for this key, run eagerly.
                eprintln!("cuda: decode step not recorded ({e}); running it eagerly");
                self.failed.insert(key);
                Mode::Eager
            }
        };
        self.mode = mode;
        self.trace_armed = false;
        if let (Mode::Replay, Some(cfg), Some(buf)) =
            (mode, crate::trace::config(), crate::trace::buffer())
        {
            if self.replays + 1 == cfg.step {
                // the probe's per-SM counters to zero before this step's first launch
                // SAFETY: buf is the probe's live buffer; the counters are its first bytes.
                let zeroed = unsafe {
                    cudarc::driver::result::memset_d8_async(
                        buf,
                        0,
                        crate::trace::SMS * 4,
                        stream.cu_stream(),
                    )
                };
                self.trace_armed = zeroed.is_ok();
            }
        }
        if step_log() {
            eprintln!("cuda step {mode:?}");
            self.log_t = Some((std::time::Instant::now(), waited));
        }
        match mode {
            Mode::Capture => StepMode::Capture,
            Mode::Replay => StepMode::Replay,
            Mode::Eager | Mode::Off => StepMode::Eager,
        }
    }

    fn open(&mut self, key: u64, stream: &Arc<CudaStream>) -> Result<Mode, BackendError> {
        let tick = self.tick;
        let enabled = self.graphs_enabled;
        let st = self.staging(stream)?;
        st.used = 0;
        if !enabled || self.failed.contains(&key) {
            return Ok(Mode::Eager);
        }
        if let Some(g) = self.graphs.get_mut(&key) {
            g.last_use = tick;
            return Ok(Mode::Replay);
        }
        let Some(warm) = self.warmed.get(&key) else {
            return Ok(Mode::Eager);
        };
        let words = warm.splits.first().copied().unwrap_or(warm.staging_words);
        self.begin_segment(0, words, stream)?;
        Ok(Mode::Capture)
    }

    /// Starts capturing a segment whose first node copies staging words `from..to` (which the
    /// ops of every replay rewrite before the segment's launch) to the device mirror.
    fn begin_segment(
        &self,
        from: usize,
        to: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<(), BackendError> {
        let st = self.staging.as_ref().ok_or_else(|| dev_err("no staging"))?;
        stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
            .map_err(dev_err)?;
        if to > from {
            let dst = dev_ptr(&st.dev, stream) + (from * 4) as u64;
            // SAFETY: from..to lies inside the pinned buffer (to <= a step's use <=
            // STAGING_WORDS) and its device mirror.
            let r = unsafe {
                let src = std::slice::from_raw_parts(st.host.add(from), to - from);
                result::memcpy_htod_async(dst, src, stream.cu_stream())
            };
            if let Err(e) = r {
                let _ = stream.end_capture(sys::CUgraphInstantiate_flags(0));
                return Err(dev_err(e));
            }
        }
        Ok(())
    }

    /// The end of a layer inside the open step. At a split mark ([`split_marks`]) a capture
    /// closes the segment so far and opens the next one; a replay launches the recorded
    /// segment, so the card runs it while the host walks the rest of the step. Errors (the
    /// step left its recording's path, a capture failed) abort the step.
    pub(super) fn mark(&mut self, stream: &Arc<CudaStream>) -> Result<(), BackendError> {
        if self.mode == Mode::Off {
            return Ok(());
        }
        self.marks += 1;
        if !split_marks().contains(&self.marks) {
            return Ok(());
        }
        let used = self.staging.as_ref().map_or(0, |s| s.used);
        let k = self.seg_words.len();
        self.seg_words.push(used);
        let warm = self.warmed.get(&self.key);
        let warm_split = warm.and_then(|u| u.splits.get(k).copied());
        match self.mode {
            Mode::Off | Mode::Eager => Ok(()),
            Mode::Capture => {
                if warm_split != Some(used) {
                    return Err(dev_err(format!(
                        "captured decode step split {k} at staging word {used}, its warm step \
                         at {warm_split:?}"
                    )));
                }
                let next = warm.map_or(used, |u| {
                    u.splits.get(k + 1).copied().unwrap_or(u.staging_words)
                });
                self.join_side(stream)?;
                let graph = match stream.end_capture(sys::CUgraphInstantiate_flags(0)) {
                    Ok(Some(g)) => g,
                    other => {
                        return Err(dev_err(format!("stream capture failed: {:?}", other.err())))
                    }
                };
                self.pending.push(graph);
                self.begin_segment(used, next, stream)
            }
            Mode::Replay => {
                let g = self
                    .graphs
                    .get(&self.key)
                    .and_then(|r| r.graphs.get(k))
                    .filter(|_| warm_split == Some(used))
                    .ok_or_else(|| {
                        dev_err(format!(
                            "decode step differs from its recording at split {k} (staging word \
                             {used}, recorded {warm_split:?})"
                        ))
                    })?;
                g.launch().map_err(dev_err)
            }
        }
    }

    /// Closes the step: records the warm step's staging use, or instantiates and launches
    /// the capture, or replays.
    pub(super) fn end(&mut self, stream: &Arc<CudaStream>) -> Result<(), BackendError> {
        let log_t = self.log_t.take();
        let mode = self.end_inner(stream);
        if std::mem::take(&mut self.trace_armed) {
            if let Some(buf) = crate::trace::buffer() {
                let _ = stream.synchronize();
                match crate::trace::dump(buf) {
                    Ok(n) => eprintln!(
                        "REDLINE_TRACE: {n} block records of replay {} written",
                        self.replays
                    ),
                    Err(e) => eprintln!("REDLINE_TRACE: could not write the trace: {e}"),
                }
            }
        }
        if let Some((t, waited)) = log_t {
            // (the diagnostic waits for the step's device work, to time it apart from the host)
            let host = t.elapsed().as_secs_f64() * 1e3;
            let _ = stream.synchronize();
            let total = t.elapsed().as_secs_f64() * 1e3;
            eprintln!(
                "cuda step timing: host {host:.2} ms (ops walked / launched), device done at \
                 {total:.2} ms, the opening waited {waited:.2} ms"
            );
        }
        mode
    }

    fn end_inner(&mut self, stream: &Arc<CudaStream>) -> Result<(), BackendError> {
        let joined = self.join_side(stream);
        let mode = std::mem::replace(&mut self.mode, Mode::Off);
        let used = Usage {
            staging_words: self.staging.as_ref().map_or(0, |s| s.used),
            arena_bytes: self.arena.handed,
            splits: std::mem::take(&mut self.seg_words),
        };
        let pending = std::mem::take(&mut self.pending);
        if let Err(e) = joined {
            if mode == Mode::Capture {
                let _ = stream.end_capture(sys::CUgraphInstantiate_flags(0));
                self.failed.insert(self.key);
                self.warmed.remove(&self.key);
            }
            return Err(e);
        }
        match mode {
            Mode::Off => Ok(()),
            Mode::Eager => {
                if self.graphs_enabled {
                    if self.warmed.len() >= MAX_KEYS {
                        self.warmed.retain(|k, _| self.graphs.contains_key(k));
                    }
                    if self.failed.len() >= MAX_KEYS {
                        self.failed.clear();
                    }
                    self.warmed.insert(self.key, used);
                }
                Ok(())
            }
            Mode::Capture => {
                let graph = match stream.end_capture(sys::CUgraphInstantiate_flags(0)) {
                    Ok(Some(g)) => g,
                    other => {
                        // Something in the step cannot be recorded: keep this key eager. The
                        // step itself did not run.
                        self.failed.insert(self.key);
                        self.warmed.remove(&self.key);
                        return Err(dev_err(format!("stream capture failed: {:?}", other.err())));
                    }
                };
                if self.warmed.get(&self.key) != Some(&used) {
                    // Not the warm step's op sequence (the model's host code is deterministic
                    // per key, so this means a bug): the graph's staging copy and the logits
                    // tensor may not be where the ops put them. Keep the key eager.
                    self.failed.insert(self.key);
                    let warm = self.warmed.remove(&self.key);
                    return Err(dev_err(format!(
                        "captured decode step used {used:?}, its warm step {warm:?}"
                    )));
                }
                let mut graphs = pending;
                graphs.push(graph);
                for g in &graphs {
                    g.launch().map_err(dev_err)?;
                }
                self.captures += 1;
                if self.graphs.len() >= MAX_GRAPHS {
                    if let Some(&old) = self
                        .graphs
                        .iter()
                        .min_by_key(|(_, g)| g.last_use)
                        .map(|(k, _)| k)
                    {
                        self.graphs.remove(&old);
                    }
                }
                self.graphs.insert(
                    self.key,
                    Recorded {
                        graphs,
                        last_use: self.tick,
                    },
                );
                Ok(())
            }
            Mode::Replay => {
                let g = self
                    .graphs
                    .get(&self.key)
                    .ok_or_else(|| dev_err("replayed step has no graph"))?;
                if self.warmed.get(&self.key) != Some(&used) {
                    // A different op sequence under a known key: the host inputs did not land
                    // where the graph reads them. Drop it; the step's results are lost.
                    self.graphs.remove(&self.key);
                    let warm = self.warmed.remove(&self.key);
                    return Err(dev_err(format!(
                        "decode step differs from its recording (same key, other ops): \
                         replay used {used:?}, recording {warm:?}"
                    )));
                }
                // the segments not launched at their marks (the last one at least)
                for g in g.graphs.get(used.splits.len()..).unwrap_or_default() {
                    g.launch().map_err(dev_err)?;
                }
                self.replays += 1;
                Ok(())
            }
        }
    }

    /// Closes a failed step: a capture is ended and dropped, nothing is kept for the key.
    pub(super) fn abort(&mut self, stream: &Arc<CudaStream>) {
        let _ = self.join_side(stream);
        if self.mode == Mode::Capture {
            let _ = stream.end_capture(sys::CUgraphInstantiate_flags(0));
            // A failed capture fails again: keep this key eager.
            self.failed.insert(self.key);
        }
        self.warmed.remove(&self.key);
        self.graphs.remove(&self.key);
        self.pending.clear();
        self.seg_words.clear();
        self.mode = Mode::Off;
    }

    /// A step temporary of `bytes` (contents unspecified).
    pub(super) fn arena_alloc(&mut self, bytes: usize) -> Result<CUdeviceptr, BackendError> {
        self.arena.alloc(bytes)
    }

    /// Scratch of `n` f32 that one op uses and drops before the next op needs it again
    /// (attention partials): one arena block per step, grown when a later op needs more.
    pub(super) fn shared_scratch(&mut self, n: usize) -> Result<CUdeviceptr, BackendError> {
        match self.shared_scratch {
            Some((p, cap)) if cap >= n => Ok(p),
            _ => {
                let p = self.arena.alloc(n * 4)?;
                self.shared_scratch = Some((p, n));
                Ok(p)
            }
        }
    }

    /// Puts `words` into the next staging slot and returns the slot's device address; in an
    /// eager step also copies the slot to the device now (ordered before the next launch).
    pub(super) fn stage(
        &mut self,
        words: &[u32],
        stream: &Arc<CudaStream>,
    ) -> Result<CUdeviceptr, BackendError> {
        let mode = self.mode;
        let st = self.staging(stream)?;
        let start = st.used.div_ceil(ALIGN_BYTES / 4) * (ALIGN_BYTES / 4);
        let end = start + words.len().max(1);
        if end > STAGING_WORDS {
            return Err(BackendError::Alloc {
                what: "step staging",
                bytes: (end * 4) as u128,
            });
        }
        // SAFETY: [start, end) lies inside the pinned buffer; no copy reads it right now (the
        // stream was synchronized when the step opened and each slot is written once a step).
        let slot = unsafe { std::slice::from_raw_parts_mut(st.host.add(start), words.len()) };
        slot.copy_from_slice(words);
        st.used = end;
        let dst = dev_ptr(&st.dev, stream) + (start * 4) as u64;
        if mode == Mode::Eager && !words.is_empty() {
            // SAFETY: pinned source of words.len() words, device slot of the same size.
            unsafe { result::memcpy_htod_async(dst, &*slot, stream.cu_stream()) }
                .map_err(dev_err)?;
        }
        Ok(dst)
    }
}

/// The raw device address of a buffer (event tracking is off: nothing to wait for).
pub(super) fn dev_ptr<T>(s: &CudaSlice<T>, stream: &Arc<CudaStream>) -> CUdeviceptr {
    use cudarc::driver::DevicePtr;
    let (p, _sync) = s.device_ptr(stream);
    p
}

/// Whether each recorded-step opening prints its mode (eager, capture, replay) to stderr, a
/// diagnostic beside the scheduler's step lines (`REDLINE_STEP_LOG=1`).
fn step_log() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("REDLINE_STEP_LOG").as_deref() == Ok("1"))
}
