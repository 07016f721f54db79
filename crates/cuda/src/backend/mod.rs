//! `CudaBackend`: the `backend::Backend` op set on one GPU, so `model::ModelOn<CudaBackend>`
//! runs a whole forward pass on the device.
//!
//! Weights are uploaded once at load: matrices byte-for-byte in their GGUF layout (read by the
//! quantized/float matvec kernels of [`crate::matvec`]), vectors and small tensors also as f32.
//! Activations are device-resident f32 tensors; KV caches and recurrent states live on the
//! device ([`sequence`]). Everything runs on the device's one stream, in order; only `download`
//! waits for it. The remaining ops are simple kernels in kernels/model_ops.cu.
//!
//! Decode steps (`Backend::begin_step` .. `end_step`, opened by the model for batches of one
//! token per sequence) take their temporaries from an arena and their host inputs from pinned
//! staging, and are recorded once as a CUDA graph and replayed ([`step`]; off with
//! `REDLINE_CUDA_GRAPHS=0` or [`CudaBackend::set_graphs_enabled`]). A step must not overlap ops
//! of another thread on the same backend: a capture records everything on the stream.

mod dense;
mod fused;
mod prefetch;
mod profile;
mod recurrent;
mod sequence;
mod step;

use std::collections::HashMap;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex, MutexGuard};

use backend::{BackendError, GgufFile};
use cudarc::driver::{CudaSlice, LaunchConfig};
use gguf::GgmlType;

use crate::device::{CudaDevice, CudaOptions};
use crate::matvec::{self, DeviceMatrix, MatvecScratch};
use step::{Mode, StepCtl};

pub use fused::{set_conv_gates, set_norm_split};
pub use profile::{op_profile_enabled, op_profile_report, op_profile_reset};
pub use recurrent::{Conv1dForm, DeltaRuleForm, CHUNKED_MIN_RUN};
pub use sequence::{set_rope_cache, CudaKvCache, CudaRecurrentState};

/// Tensors of at most this many elements are also kept as f32 on the device (norm weights,
/// biases, conv taps, small test matrices), like the CPU backend's small-tensor copies.
const SMALL_TENSOR_ELEMENTS: usize = 1 << 18;

/// f32 activations `[rows, cols]`, row-major, on the device. The buffer may be longer than
/// `rows * cols` (an empty tensor still owns one element: the driver allocates no 0 bytes).
/// Inside a decode step the buffer is borrowed from the step arena (see [`step`]) and is not
/// freed with the tensor.
pub struct CudaTensor {
    pub(crate) data: ManuallyDrop<CudaSlice<f32>>,
    rows: usize,
    cols: usize,
    /// The buffer belongs to the step arena.
    borrowed: bool,
}

impl Drop for CudaTensor {
    fn drop(&mut self) {
        // SAFETY: `data` is taken exactly once, here.
        let data = unsafe { ManuallyDrop::take(&mut self.data) };
        if self.borrowed {
            // The arena owns the memory: release the handle without freeing it.
            data.leak();
        }
    }
}

impl CudaTensor {
    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    fn len(&self) -> usize {
        self.rows * self.cols
    }

    fn owned(data: CudaSlice<f32>, rows: usize, cols: usize) -> CudaTensor {
        CudaTensor {
            data: ManuallyDrop::new(data),
            rows,
            cols,
            borrowed: false,
        }
    }
}

/// A weight on the device: `[rows, cols]` of GGUF type `ty`.
pub struct CudaWeight {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    /// The GGUF bytes, for matrices the matvec kernels take.
    matrix: Option<DeviceMatrix>,
    /// Dequantized f32 values, for vectors and small tensors.
    dense: Option<CudaSlice<f32>>,
}

/// Quantized-activation scratch of the matvec, grown to the largest `n_tokens * cols` seen.
struct Scratch {
    buf: Option<MatvecScratch>,
    /// Elements of x it can hold (tokens × columns rounded up to 32).
    capacity: usize,
    /// The tensor whose q8_1 copy `buf` holds, for reuse by the fused paths ([`fused`]).
    holds: Option<fused::Holds>,
}

/// The GPU backend. Cheap to share: ops take `&self`; the matvec scratch and the decode-step
/// machinery are behind mutexes.
pub struct CudaBackend {
    dev: CudaDevice,
    scratch: Mutex<Scratch>,
    step: Mutex<StepCtl>,
    /// Per-op device timing (`REDLINE_PROFILE_OPS=1`, see [`profile`]).
    profile: Option<Mutex<profile::OpProfile>>,
    /// Fused decode paths on ([`fused`]; default on since the H200 run of session 4;
    /// `REDLINE_FUSED=0` for the unfused ops).
    fused: AtomicBool,
    /// Backend ops run so far: the fused paths reuse a q8_1 copy only from the op before.
    ops: AtomicU64,
    /// `attention_block` calls that took the fused decode chain (tests check it ran).
    fused_attention: AtomicU64,
    /// `conv1d_qkv` calls that took the one-launch chain.
    fused_conv: AtomicU64,
    /// [`StagedFusions`] as bits (see [`StagedFusions::bits`]).
    staged: std::sync::atomic::AtomicU8,
    /// `delta_rule_gated` calls that computed the gates inside `dn_recurrent`.
    fused_gates: AtomicU64,
    /// `gated_rms_norm` calls that also wrote the q8_1 copy.
    norm_q8: AtomicU64,
    /// Fused `attention_block` calls that also wrote the q8_1 copy of their output.
    attn_q8: AtomicU64,
    /// Launches that wrote a q8_K copy beside the q8_1 one (the staged `q8k`).
    q8k: AtomicU64,
    /// `attention_block` calls whose query / key preparation took one launch (the staged
    /// `attn_rows`).
    attn_rows: AtomicU64,
    /// Page-locked host memory the logits come down to ([`Backend::download_cols`]), grown to
    /// the largest download of at most [`PINNED_MAX_FLOATS`].
    pinned: Mutex<Option<cudarc::driver::PinnedHostSlice<f32>>>,
    /// Bytes one [`backend::Backend::prefetch`] hint moves toward L2 (0: off; [`prefetch`]).
    l2pf_budget: AtomicUsize,
    /// The hint waiting for the next op.
    l2pf: Mutex<prefetch::Pending>,
    /// The last-block counters of `dn_recurrent`'s gated-norm tail (the staged `dn_norm`),
    /// one per (sequence, value head), zero between launches; made at first use outside a
    /// capture.
    dn_counters: Mutex<Option<CudaSlice<u32>>>,
    /// `delta_rule_gated_norm` calls that took the one-launch rule and norm.
    dn_norm: AtomicU64,
    /// `in_proj_conv1d_qkv` calls whose f32 products rode in the conv's launch.
    conv_gates: AtomicU64,
    /// The fused attention's RoPE angle caches, one per set of RoPE parameters (base, scale,
    /// rotated dims, factors as bits), made at first use outside a capture.
    #[allow(clippy::type_complexity)]
    rope_caches: Mutex<HashMap<(u32, u32, usize, Option<Vec<u32>>), CudaSlice<f32>>>,
}

/// Largest download (f32 values) that goes through the page-locked buffer: 32 rows of a 248k
/// vocabulary (32 MiB of host memory, in the memory plan as `Ledger::logits_download`, whose
/// `model::plan::LOGITS_DOWNLOAD_MAX_FLOATS` must equal this: tests/no_gpu.rs); larger ones
/// (all-logits prefills) take the plain copy.
pub const PINNED_MAX_FLOATS: usize = 8 << 20;

/// Decode-step fusions written in session 14 without a card, then measured on the H200
/// (BENCHMARKS.md); each gives the separate launches' bits (their GPU tests check it).
/// On by default, `=0` turns one off: `REDLINE_DN_PDL`: `dn_recurrent` launched with PDL, its
/// recurrent state loaded before the wait. `REDLINE_FUSED_GATES`: the delta-rule gates computed
/// inside `dn_recurrent` (no `mo_delta_gates` launch). `REDLINE_FUSED_NORM_Q8`: Qwen3.5's gated
/// group norm also writes the q8_1 copy the out-projection reads (no quantize launch).
/// `REDLINE_FUSED_ATTN_Q8`: the fused one-row attention chain writes the q8_1 copy of its
/// output for the o-projection (no quantize launch; every attention layer). Together: 27B
/// tg128 +2.0–2.4 %, 32B +0.2–0.8 % (three windows).
/// Off by default, `=1` turns it on (measured slower or not faster):
/// `REDLINE_FUSED_DN_NORM` (session 36): Qwen3.5's gated output norm and its q8_1 copy as the
/// tail of `dn_recurrent`'s launch (the last of each head's blocks normalizes the head; the
/// same bits as the separate norm): one launch fewer a DeltaNet layer, but on an H100 the 27B
/// lost 0.5–0.8 % (two rounds, beside the persistent products; the tail's reads wait behind
/// the staged out-projection's copies as the separate norm's did).
/// `REDLINE_FUSED_Q8K`: for 3..8 rows (decode streams,
/// verify passes), whose Q4_K / Q6_K products take the mmv2 kernels on q8_K activations, the
/// norm and SwiGLU kernels write the q8_K copy too, and an x no kernel quantized gets its q8_1
/// and q8_K copies in one launch. Measured slower (the norm's block-wide q8_K reductions cost
/// more than the launches they save; 8 streams far slower, not yet understood).
/// Session 17 and 18's, on by default (`=0` turns one off): `REDLINE_FUSED_CONV_ROWS`: Gated
/// DeltaNet's conv1d / silu / L2 norm / split chain in one
/// launch (`mo_conv1d_qkv_rows`) for up to 8 rows per sequence too (verify passes), where the
/// separate ops cost five launches (H200, session 17: +1.0 ms of a 27B verify pass of 2 rows
/// against its one-token step's fused launch). H100, session 18: 27B verify k = 2 -0.12 ms,
/// k = 3 -0.15..-0.29 ms.
/// `REDLINE_FUSED_ATTN_ROWS`: an attention block the fused one-row chain does not take (several
/// rows: verify passes, batched decode) gets its query / key preparation — query and gate heads
/// copied out of the strided q, the q and k norms, RoPE, five launches — as one
/// (`mo_attn_prep_rows`). H100, session 18, with the tiled q8_1 layout, three rounds: these
/// two and the layout together take a 27B verify pass of 2 rows from 11.21 to 10.54 ms (3 and 4
/// rows −0.3 ms), one row +0.6–1.2 %, the 27B at 8 streams +1.3 %.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StagedFusions {
    pub dn_pdl: bool,
    pub gates: bool,
    pub norm_q8: bool,
    pub attn_q8: bool,
    pub q8k: bool,
    pub conv_rows: bool,
    pub attn_rows: bool,
    pub dn_norm: bool,
}

impl StagedFusions {
    /// Every staged fusion on.
    pub const ALL: StagedFusions = StagedFusions {
        dn_pdl: true,
        gates: true,
        norm_q8: true,
        attn_q8: true,
        q8k: true,
        conv_rows: true,
        attn_rows: true,
        dn_norm: true,
    };

    /// The process default: the measured wins (all but `q8k`) on unless their variable is
    /// `0`, `q8k` only when `REDLINE_FUSED_Q8K=1`.
    pub fn from_env() -> StagedFusions {
        let var = |k: &str| std::env::var(k).ok();
        let unless_0 = |k: &str| var(k).as_deref() != Some("0");
        StagedFusions {
            dn_pdl: unless_0("REDLINE_DN_PDL"),
            gates: unless_0("REDLINE_FUSED_GATES"),
            norm_q8: unless_0("REDLINE_FUSED_NORM_Q8"),
            attn_q8: unless_0("REDLINE_FUSED_ATTN_Q8"),
            q8k: var("REDLINE_FUSED_Q8K").as_deref() == Some("1"),
            conv_rows: unless_0("REDLINE_FUSED_CONV_ROWS"),
            attn_rows: unless_0("REDLINE_FUSED_ATTN_ROWS"),
            dn_norm: var("REDLINE_FUSED_DN_NORM").as_deref() == Some("1"),
        }
    }

    fn bits(self) -> u8 {
        self.dn_pdl as u8
            | (self.gates as u8) << 1
            | (self.norm_q8 as u8) << 2
            | (self.attn_q8 as u8) << 3
            | (self.q8k as u8) << 4
            | (self.conv_rows as u8) << 5
            | (self.attn_rows as u8) << 6
            | (self.dn_norm as u8) << 7
    }

    fn from_bits(b: u8) -> StagedFusions {
        StagedFusions {
            dn_pdl: b & 1 != 0,
            gates: b & 2 != 0,
            norm_q8: b & 4 != 0,
            attn_q8: b & 8 != 0,
            q8k: b & 16 != 0,
            conv_rows: b & 32 != 0,
            attn_rows: b & 64 != 0,
            dn_norm: b & 128 != 0,
        }
    }
}

/// Host integers on the device for one launch: a staging slot inside a step, else a buffer
/// of their own (kept alive until the launch is queued).
pub(crate) struct HostInts {
    ptr: u64,
    _own: Option<CudaSlice<i32>>,
}

/// Every device failure becomes `BackendError::Device`.
pub(crate) fn dev_err(e: impl std::fmt::Display) -> BackendError {
    BackendError::Device(e.to_string())
}

pub(crate) fn shape_err(op: &'static str, detail: String) -> BackendError {
    BackendError::Shape { op, detail }
}

/// One thread per element in blocks of 256, capped so huge tensors loop (grid-stride kernels).
pub(crate) fn elems_cfg(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(256).clamp(1, 65535) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl CudaBackend {
    /// Opens GPU `opts.ordinal`. Fails cleanly (`CudaError::NoDevice`, …) where there is none.
    pub fn new(opts: &CudaOptions) -> crate::Result<CudaBackend> {
        Ok(CudaBackend::from_device(CudaDevice::open(opts)?))
    }

    pub fn from_device(dev: CudaDevice) -> CudaBackend {
        let mut b = CudaBackend {
            dev,
            scratch: Mutex::new(Scratch {
                buf: None,
                capacity: 0,
                holds: None,
            }),
            step: Mutex::new(StepCtl::new()),
            profile: None,
            fused: AtomicBool::new(std::env::var("REDLINE_FUSED").map_or(true, |v| v != "0")),
            ops: AtomicU64::new(0),
            fused_attention: AtomicU64::new(0),
            fused_conv: AtomicU64::new(0),
            staged: std::sync::atomic::AtomicU8::new(StagedFusions::from_env().bits()),
            fused_gates: AtomicU64::new(0),
            norm_q8: AtomicU64::new(0),
            attn_q8: AtomicU64::new(0),
            q8k: AtomicU64::new(0),
            attn_rows: AtomicU64::new(0),
            pinned: Mutex::new(None),
            l2pf_budget: AtomicUsize::new(0),
            l2pf: Mutex::new(prefetch::Pending::default()),
            dn_counters: Mutex::new(None),
            dn_norm: AtomicU64::new(0),
            conv_gates: AtomicU64::new(0),
            rope_caches: Mutex::new(HashMap::new()),
        };
        b.set_l2_prefetch(prefetch::budget_from_env(b.dev.arch()));
        crate::pdl::set_enabled(crate::pdl::default_on());
        if profile::op_profile_enabled() {
            // Timed ops run eagerly: a graph replay has no per-op boundaries.
            b.set_graphs_enabled(false);
            b.profile = Some(Mutex::new(profile::OpProfile::new()));
        }
        b
    }

    /// Turns CUDA-graph recording of decode steps on or off (default on unless
    /// `REDLINE_CUDA_GRAPHS=0`); off, steps still use the arena and staging.
    pub fn set_graphs_enabled(&self, on: bool) {
        let mut st = self.step_ctl();
        st.forget_graphs();
        st.set_graphs_enabled(on);
    }

    /// `attention_block` calls so far that took the fused decode chain (one launch).
    pub fn fused_attention_calls(&self) -> u64 {
        self.fused_attention
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// `conv1d_qkv` calls so far that took the one-launch chain.
    pub fn fused_conv1d_qkv_calls(&self) -> u64 {
        self.fused_conv.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// `delta_rule_gated` calls so far that computed the gates inside the rule's kernel.
    pub fn fused_gates_calls(&self) -> u64 {
        self.fused_gates.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// `gated_rms_norm` calls so far that also wrote the q8_1 copy.
    pub fn norm_q8_calls(&self) -> u64 {
        self.norm_q8.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Fused `attention_block` calls so far that also wrote the q8_1 copy of their output.
    pub fn attn_q8_calls(&self) -> u64 {
        self.attn_q8.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Launches so far that wrote a q8_K copy beside the q8_1 one (the staged `q8k`).
    pub fn q8k_calls(&self) -> u64 {
        self.q8k.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// `delta_rule_gated_norm` calls so far that took the one-launch rule and gated norm.
    pub fn dn_norm_calls(&self) -> u64 {
        self.dn_norm.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// `in_proj_conv1d_qkv` calls so far whose f32 products rode in the conv's launch.
    pub fn conv_gates_calls(&self) -> u64 {
        self.conv_gates.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// `attention_block` calls so far whose query / key preparation took one launch.
    pub fn attn_rows_calls(&self) -> u64 {
        self.attn_rows.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The staged fusions in use.
    pub fn staged(&self) -> StagedFusions {
        StagedFusions::from_bits(self.staged.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Turns the staged fusions on or off; recorded steps are dropped (their op sequence
    /// changes).
    pub fn set_staged(&self, s: StagedFusions) {
        self.staged
            .store(s.bits(), std::sync::atomic::Ordering::Relaxed);
        self.step_ctl().forget_graphs();
        self.forget_q8();
    }

    /// `(captured, replayed)` decode steps so far.
    pub fn graph_counts(&self) -> (u64, u64) {
        let st = self.step_ctl();
        (st.captures, st.replays)
    }

    fn step_ctl(&self) -> MutexGuard<'_, StepCtl> {
        self.step.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The current step mode.
    fn mode(&self) -> Mode {
        self.step_ctl().mode
    }

    /// True while replaying a recorded step: ops only stage their host inputs.
    fn replaying(&self) -> bool {
        self.mode() == Mode::Replay
    }

    /// A tensor `[rows, cols]` whose contents every caller overwrites: from the step arena
    /// inside a step (no allocation, stable addresses for graphs), else zeroed device memory.
    fn scratch_tensor(&self, rows: usize, cols: usize) -> Result<CudaTensor, BackendError> {
        let n = rows * cols;
        let mut st = self.step_ctl();
        if st.mode == Mode::Off {
            drop(st);
            return Ok(CudaTensor::owned(self.alloc_f32(n)?, rows, cols));
        }
        let ptr = st.arena_alloc(n.max(1) * 4)?;
        // SAFETY: ptr is an arena block of n.max(1) f32 that outlives every step tensor (chunks
        // are never freed while the backend lives); the handle is leaked, not freed, on drop.
        let data = unsafe { self.dev.stream().upgrade_device_ptr::<f32>(ptr, n.max(1)) };
        Ok(CudaTensor {
            data: ManuallyDrop::new(data),
            rows,
            cols,
            borrowed: true,
        })
    }

    /// Host integers for a launch: staged inside a step, uploaded otherwise.
    fn host_ints(&self, v: &[i32]) -> Result<HostInts, BackendError> {
        let mut st = self.step_ctl();
        if st.mode == Mode::Off {
            drop(st);
            let own = self.upload_i32(v)?;
            let ptr = step::dev_ptr(&own, self.dev.stream());
            return Ok(HostInts {
                ptr,
                _own: Some(own),
            });
        }
        let words: &[u32] = bytemuck_i32(v);
        let ptr = st.stage(words, self.dev.stream())?;
        Ok(HostInts { ptr, _own: None })
    }

    /// Host f32 values for a launch, like [`CudaBackend::host_ints`].
    fn host_floats(&self, v: &[f32]) -> Result<HostInts, BackendError> {
        let bits: Vec<i32> = v.iter().map(|x| x.to_bits() as i32).collect();
        self.host_ints(&bits)
    }

    /// The host inputs of a RoPE launch, staged in this order: the positions, then the
    /// frequency factors when there are any.
    fn rope_host_inputs(
        &self,
        positions: &[u32],
        p: &backend::RopeParams,
    ) -> Result<(HostInts, Option<HostInts>), BackendError> {
        let pos: Vec<i32> = positions.iter().map(|&v| v as i32).collect();
        let pos = self.host_ints(&pos)?;
        let factors = match &p.freq_factors {
            Some(f) => Some(self.host_floats(f)?),
            None => None,
        };
        Ok((pos, factors))
    }

    pub fn device(&self) -> &CudaDevice {
        &self.dev
    }

    /// A device buffer of `n` f32 zeros (at least one element).
    fn alloc_f32(&self, n: usize) -> Result<CudaSlice<f32>, BackendError> {
        self.dev
            .stream()
            .alloc_zeros::<f32>(n.max(1))
            .map_err(|_| BackendError::Alloc {
                what: "tensor",
                bytes: (n as u128) * 4,
            })
    }

    /// Host integers to the device (row indices, positions, token ids).
    fn upload_i32(&self, v: &[i32]) -> Result<CudaSlice<i32>, BackendError> {
        if v.is_empty() {
            return self.dev.stream().alloc_zeros::<i32>(1).map_err(dev_err);
        }
        self.dev.stream().clone_htod(v).map_err(dev_err)
    }

    fn upload_f32(&self, v: &[f32]) -> Result<CudaSlice<f32>, BackendError> {
        if v.is_empty() {
            return self.alloc_f32(0);
        }
        self.dev.stream().clone_htod(v).map_err(dev_err)
    }

    fn function(&self, name: &str) -> Result<cudarc::driver::CudaFunction, BackendError> {
        self.dev
            .function(crate::sources::Program::ModelOps, name)
            .map_err(dev_err)
    }

    /// Runs `f` with a matvec scratch that holds x of `n_tokens × cols`.
    fn with_scratch<T>(
        &self,
        n_tokens: usize,
        cols: usize,
        f: impl FnOnce(&mut MatvecScratch) -> Result<T, BackendError>,
    ) -> Result<T, BackendError> {
        let mut s = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        // `f` quantizes some x into the buffer: it no longer holds what the fused paths noted.
        s.holds = None;
        let need = n_tokens.max(1) * cols.div_ceil(32) * 32;
        if s.buf.is_none() || s.capacity < need {
            // Recorded steps point at the old scratch.
            self.step_ctl().forget_graphs();
            s.buf = Some(
                self.dev
                    .matvec_scratch(n_tokens.max(1), cols)
                    .map_err(dev_err)?,
            );
            s.capacity = need;
        }
        f(s.buf.as_mut().expect("scratch allocated above"))
    }
}

/// `i32` words as `u32` (same bits).
fn bytemuck_i32(v: &[i32]) -> &[u32] {
    // SAFETY: i32 and u32 have the same size, alignment and every bit pattern is valid.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u32, v.len()) }
}

/// Ops without host inputs do nothing while a recorded step replays.
/// The RoPE kernels' pairing flag: NeoX pairs (i, i + n_rot / 2), else (2i, 2i + 1).
/// Multimodal RoPE on text: every section carries the same position, so NeoX pairing.
fn rope_neox(mode: &backend::RopeMode) -> bool {
    !matches!(mode, backend::RopeMode::Normal)
}

macro_rules! skip_in_replay {
    ($self:ident) => {
        if $self.replaying() {
            return Ok(());
        }
    };
}

impl backend::Backend for CudaBackend {
    type Tensor = CudaTensor;
    type Weight = CudaWeight;
    type KvCache = CudaKvCache;
    type RecurrentState = CudaRecurrentState;
    const RESTORE_KEEPS_BUFFERS: bool = true;

    fn name(&self) -> String {
        format!("cuda:{}", self.dev.info().ordinal)
    }

    fn load_weight(&self, file: &Arc<GgufFile>, name: &str) -> Result<CudaWeight, BackendError> {
        let info = file
            .tensors()
            .iter()
            .find(|t| t.name == name)
            .ok_or_else(|| BackendError::MissingTensor(name.to_owned()))?;
        let cols = info.dims.first().copied().unwrap_or(1) as usize;
        let rows = info.n_rows() as usize;
        let n = rows
            .checked_mul(cols)
            .ok_or_else(|| shape_err("load_weight", format!("{name}: size overflows")))?;
        let bytes = file.tensor_data(info);
        let dense = if rows == 1 || n <= SMALL_TENSOR_ELEMENTS {
            let mut v = vec![0.0f32; n];
            quant::dequantize_row(info.ty, bytes, &mut v)
                .map_err(|e| BackendError::Quant(format!("{name}: {e}")))?;
            Some(self.upload_f32(&v)?)
        } else {
            None
        };
        let matrix = if rows > 1
            && matvec::supports(info.ty)
            && cols.is_multiple_of(info.ty.block_size())
            && (!matvec::quantizes_activations(info.ty) || cols.is_multiple_of(32))
        {
            Some(
                self.dev
                    .upload_matrix(info.ty, rows, cols, bytes)
                    .map_err(dev_err)?,
            )
        } else {
            None
        };
        if dense.is_none() && matrix.is_none() {
            return Err(BackendError::UnsupportedType {
                op: "load_weight",
                ty: info.ty,
            });
        }
        Ok(CudaWeight {
            ty: info.ty,
            rows,
            cols,
            matrix,
            dense,
        })
    }

    fn weight_shape(&self, w: &CudaWeight) -> (usize, usize) {
        (w.rows, w.cols)
    }

    fn zeros(&self, rows: usize, cols: usize) -> CudaTensor {
        // The trait's `zeros` cannot fail; running out of device memory here is fatal. Inside
        // a decode step the tensor comes from the arena uninitialized: every op overwrites
        // its whole output, and the model only hands fresh tensors to ops as outputs.
        let t = self
            .scratch_tensor(rows, cols)
            .unwrap_or_else(|e| panic!("cuda zeros [{rows}, {cols}]: {e}"));
        self.forget_q8_at(&t);
        t
    }

    fn begin_step(&self, key: u64) -> backend::StepMode {
        self.forget_q8();
        let mode = self.step_ctl().begin(key, self.dev.stream());
        if let Err(e) = self.profile_begin_step() {
            eprintln!("cuda: op profile: {e}");
        }
        mode
    }

    fn end_step(&self) -> Result<(), BackendError> {
        self.forget_q8();
        self.step_ctl().end(self.dev.stream())?;
        self.profile_end_step()
    }

    fn step_mark(&self) -> Result<(), BackendError> {
        self.step_ctl().mark(self.dev.stream())
    }

    fn abort_step(&self) {
        self.forget_q8();
        self.step_ctl().abort(self.dev.stream())
    }

    fn upload(&self, data: &[f32], rows: usize, cols: usize) -> Result<CudaTensor, BackendError> {
        if data.len() != rows * cols {
            return Err(shape_err(
                "upload",
                format!("{} values for [{rows}, {cols}]", data.len()),
            ));
        }
        let t = CudaTensor::owned(self.upload_f32(data)?, rows, cols);
        self.forget_q8_at(&t);
        Ok(t)
    }

    fn download(&self, t: &CudaTensor) -> Vec<f32> {
        // The trait's `download` cannot fail; a lost device here is fatal.
        let mut v = self
            .dev
            .stream()
            .clone_dtoh(&*t.data)
            .unwrap_or_else(|e| panic!("cuda download: {e}"));
        v.truncate(t.len());
        v
    }

    fn download_cols(&self, t: &CudaTensor, cols: usize) -> Vec<f32> {
        let (rows, n) = (t.rows, t.cols);
        let cols = cols.min(n);
        if rows * n == 0 || rows * n > PINNED_MAX_FLOATS {
            let mut v = self.download(t);
            backend::cut_rows_in_place(&mut v, n, cols);
            return v;
        }
        // The device copies into page-locked memory at the link's speed (a pageable
        // destination goes through the driver's own staging at a fraction of it: 0.66 ms for
        // 8 rows of a 152k vocabulary on an H100 host, plus the cut's pass over them); the
        // rows' heads then go to the vector on several threads.
        let mut guard = self.pinned.lock().unwrap_or_else(|e| e.into_inner());
        let r = self.pinned_download(&mut guard, t);
        let src = match r {
            Ok(src) => src,
            // The trait's `download` cannot fail; a lost device here is fatal.
            Err(e) => panic!("cuda download: {e}"),
        };
        let mut v: Vec<f32> = Vec::with_capacity(rows * cols);
        {
            use rayon::prelude::*;
            let dst = &mut v.spare_capacity_mut()[..rows * cols];
            let copy = |(d, s): (&mut [std::mem::MaybeUninit<f32>], &[f32])| {
                for (d, &s) in d.iter_mut().zip(&s[..cols]) {
                    d.write(s);
                }
            };
            if rows > 1 {
                dst.par_chunks_mut(cols)
                    .zip(src[..rows * n].par_chunks(n))
                    .for_each(copy);
            } else {
                copy((dst, &src[..n]));
            }
        }
        // SAFETY: every one of the rows * cols values was written above.
        unsafe { v.set_len(rows * cols) };
        v
    }

    fn argmax_cols(&self, t: &CudaTensor, cols: usize) -> Vec<Option<u32>> {
        // The trait's `download` cannot fail; a lost device here is fatal.
        self.dev
            .argmax_rows(&t.data, t.rows, t.cols, cols)
            .unwrap_or_else(|e| panic!("cuda argmax: {e}"))
    }

    fn top_k_cols(&self, t: &CudaTensor, cols: usize, k: usize) -> Vec<Vec<(u32, f32)>> {
        match self
            .dev
            .top_k_rows(&t.data, t.rows, t.cols, cols, k.min(crate::ops::TOP_K_MAX))
        {
            Ok(v) => v,
            // rows longer than the merge takes: on the host
            Err(crate::error::CudaError::Shape(_)) => {
                let cols = cols.min(t.cols).max(1);
                self.download_cols(t, cols)
                    .chunks(cols)
                    .map(|r| backend::top_k_row(r, k))
                    .collect()
            }
            // The trait's `download` cannot fail; a lost device here is fatal.
            Err(e) => panic!("cuda top-k: {e}"),
        }
    }

    fn shape(&self, t: &CudaTensor) -> (usize, usize) {
        (t.rows, t.cols)
    }

    fn embed(
        &self,
        table: &CudaWeight,
        tokens: &[u32],
        out: &mut CudaTensor,
    ) -> Result<(), BackendError> {
        self.timed(
            || "embed".to_string(),
            || self.embed_impl(table, tokens, out),
        )
    }

    fn matmul(
        &self,
        w: &CudaWeight,
        x: &CudaTensor,
        out: &mut CudaTensor,
    ) -> Result<(), BackendError> {
        skip_in_replay!(self);
        self.timed(
            || format!("matmul {} {}x{} n={}", w.ty.name(), w.rows, w.cols, x.rows),
            || {
                if self.fused() {
                    self.matmul_fused_impl(w, x, out)
                } else {
                    self.matmul_impl(w, x, out)
                }
            },
        )
    }

    fn matmul_many(
        &self,
        ws: &[&CudaWeight],
        biases: &[Option<&CudaWeight>],
        x: &CudaTensor,
        outs: &mut [&mut CudaTensor],
    ) -> Result<(), BackendError> {
        if !self.fused() {
            return backend::matmul_many_each(self, ws, biases, x, outs);
        }
        skip_in_replay!(self);
        self.timed(
            || {
                let mut l = format!("matmul_many n={}", x.rows);
                for w in ws {
                    l.push_str(&format!(" {}:{}x{}", w.ty.name(), w.rows, w.cols));
                }
                l
            },
            || self.matmul_many_impl(ws, biases, x, outs),
        )
    }

    fn matmul_add(
        &self,
        w: &CudaWeight,
        x: &CudaTensor,
        out: &mut CudaTensor,
    ) -> Result<(), BackendError> {
        if !self.fused() {
            return backend::matmul_add_via_temp(self, w, x, out);
        }
        if self.replaying() {
            // The recorded step took an arena block for the temporary of the unfused case
            // (several tokens, float weights): a replay must take the same one, or the step's
            // arena use differs from its recording and the replay is refused.
            if self.matmul_add_uses_temp(w, x, out) {
                self.scratch_tensor(out.rows, out.cols)?;
            }
            return Ok(());
        }
        self.timed(
            || {
                format!(
                    "matmul_add {} {}x{} n={}",
                    w.ty.name(),
                    w.rows,
                    w.cols,
                    x.rows
                )
            },
            || self.matmul_add_impl(w, x, out),
        )
    }

    fn rope_qk(
        &self,
        q: &mut CudaTensor,
        k: &mut CudaTensor,
        positions: &[u32],
        head_dim: usize,
        p: &backend::RopeParams,
    ) -> Result<(), BackendError> {
        if !self.fused() {
            self.rope(q, positions, head_dim, p)?;
            return self.rope(k, positions, head_dim, p);
        }
        self.timed(
            || "rope_qk".to_string(),
            || self.rope_qk_impl(q, k, positions, head_dim, p),
        )
    }

    fn add_bias(&self, x: &mut CudaTensor, bias: &CudaWeight) -> Result<(), BackendError> {
        skip_in_replay!(self);
        self.timed(|| "add_bias".to_string(), || self.add_bias_impl(x, bias))
    }

    fn add(&self, x: &mut CudaTensor, y: &CudaTensor) -> Result<(), BackendError> {
        skip_in_replay!(self);
        self.timed(|| "add".to_string(), || self.add_impl(x, y))
    }

    fn prefetch(&self, weights: &[&CudaWeight]) -> Result<(), BackendError> {
        self.prefetch_hint(weights)
    }

    fn rms_norm(
        &self,
        x: &CudaTensor,
        w: &CudaWeight,
        eps: f32,
        out: &mut CudaTensor,
    ) -> Result<(), BackendError> {
        skip_in_replay!(self);
        self.timed(
            || "rms_norm".to_string(),
            || {
                if self.fused() && self.rms_norm_q8_impl(x, w, eps, out)? {
                    return Ok(());
                }
                self.rms_norm_impl(Some(x), w, None, eps, out)
            },
        )
    }

    fn rms_norm_inplace(
        &self,
        x: &mut CudaTensor,
        w: &CudaWeight,
        eps: f32,
    ) -> Result<(), BackendError> {
        skip_in_replay!(self);
        self.timed(
            || "rms_norm_inplace".to_string(),
            || self.rms_norm_impl(None, w, None, eps, x),
        )
    }

    fn l2_norm(
        &self,
        x: &mut CudaTensor,
        col0: usize,
        len: usize,
        group: usize,
        eps: f32,
    ) -> Result<(), BackendError> {
        skip_in_replay!(self);
        self.timed(
            || "l2_norm".to_string(),
            || self.l2_norm_impl(x, col0, len, group, eps),
        )
    }

    fn rope(
        &self,
        x: &mut CudaTensor,
        positions: &[u32],
        head_dim: usize,
        p: &backend::RopeParams,
    ) -> Result<(), BackendError> {
        self.timed(
            || "rope".to_string(),
            || self.rope_impl(x, positions, head_dim, p),
        )
    }

    fn swiglu(
        &self,
        gate: &CudaTensor,
        up: &CudaTensor,
        out: &mut CudaTensor,
    ) -> Result<(), BackendError> {
        skip_in_replay!(self);
        self.timed(
            || "swiglu".to_string(),
            || {
                if self.fused() && self.swiglu_q8_impl(gate, up, out)? {
                    return Ok(());
                }
                self.swiglu_impl(gate, up, out)
            },
        )
    }

    fn silu(&self, x: &mut CudaTensor) -> Result<(), BackendError> {
        skip_in_replay!(self);
        self.timed(|| "silu".to_string(), || self.unary_impl("mo_silu", x))
    }

    fn mul_sigmoid(&self, x: &mut CudaTensor, gate: &CudaTensor) -> Result<(), BackendError> {
        skip_in_replay!(self);
        self.timed(
            || "mul_sigmoid".to_string(),
            || self.mul_sigmoid_impl(x, gate),
        )
    }

    fn gated_rms_norm(
        &self,
        x: &mut CudaTensor,
        w: &CudaWeight,
        z: &CudaTensor,
        eps: f32,
    ) -> Result<(), BackendError> {
        skip_in_replay!(self);
        self.timed(
            || "gated_rms_norm".to_string(),
            || {
                if self.fused() && self.staged().norm_q8 && self.group_norm_q8_impl(w, z, eps, x)? {
                    return Ok(());
                }
                self.rms_norm_impl(None, w, Some(z), eps, x)
            },
        )
    }

    fn copy_cols(
        &self,
        src: &CudaTensor,
        dst: &mut CudaTensor,
        c: &backend::ColumnCopy,
    ) -> Result<(), BackendError> {
        skip_in_replay!(self);
        self.timed(
            || "copy_cols".to_string(),
            || self.copy_cols_impl(src, dst, c),
        )
    }

    fn split_cols(
        &self,
        src: &CudaTensor,
        offsets: &[usize],
        dsts: &mut [&mut CudaTensor],
    ) -> Result<(), BackendError> {
        if !self.fused() {
            return backend::split_cols_each(self, src, offsets, dsts);
        }
        skip_in_replay!(self);
        let done = self.timed(
            || "split_cols".to_string(),
            || self.split_cols_impl(src, offsets, dsts),
        )?;
        if done {
            return Ok(());
        }
        backend::split_cols_each(self, src, offsets, dsts)
    }

    fn get_rows(
        &self,
        x: &CudaTensor,
        rows: &[usize],
        out: &mut CudaTensor,
    ) -> Result<(), BackendError> {
        self.timed(
            || "get_rows".to_string(),
            || self.get_rows_impl(x, rows, out),
        )
    }

    fn new_kv_cache(
        &self,
        n_ctx: usize,
        n_kv_head: usize,
        head_dim_k: usize,
        head_dim_v: usize,
        kv_type: backend::KvType,
    ) -> Result<CudaKvCache, BackendError> {
        self.new_kv_cache_impl(n_ctx, n_kv_head, head_dim_k, head_dim_v, kv_type)
    }

    fn kv_cache_bytes(&self, cache: &CudaKvCache) -> usize {
        cache.bytes()
    }

    fn attention_block(
        &self,
        a: backend::AttnBlock<'_, Self>,
        rows: &[backend::Row],
        caches: &mut [&mut CudaKvCache],
        p: &backend::AttentionParams,
        out: &mut CudaTensor,
    ) -> Result<(), BackendError> {
        // timed inside: the fallback's ops time themselves
        self.attention_block_impl(a, rows, caches, p, out)
    }

    fn attention(
        &self,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        rows: &[backend::Row],
        caches: &mut [&mut CudaKvCache],
        p: &backend::AttentionParams,
        out: &mut CudaTensor,
    ) -> Result<(), BackendError> {
        self.timed(
            || "attention".to_string(),
            || self.attention_impl(q, k, v, rows, caches, p, out),
        )
    }

    fn new_recurrent_state(
        &self,
        shape: &backend::RecurrentShape,
    ) -> Result<CudaRecurrentState, BackendError> {
        self.new_recurrent_state_impl(shape)
    }

    fn recurrent_state_bytes(&self, s: &CudaRecurrentState) -> usize {
        s.bytes()
    }

    fn reset_recurrent_state(&self, s: &mut CudaRecurrentState) {
        self.reset_recurrent_state_impl(s)
    }

    fn conv1d(
        &self,
        x: &CudaTensor,
        w: &CudaWeight,
        rows: &[backend::Row],
        states: &mut [&mut CudaRecurrentState],
        out: &mut CudaTensor,
    ) -> Result<(), BackendError> {
        self.timed(
            || "conv1d".to_string(),
            || self.conv1d_impl(x, w, rows, states, out),
        )
    }

    fn conv1d_qkv(
        &self,
        x: &CudaTensor,
        w: &CudaWeight,
        rows: &[backend::Row],
        states: &mut [&mut CudaRecurrentState],
        norm: (usize, usize, f32),
        offsets: &[usize],
        outs: &mut [&mut CudaTensor],
    ) -> Result<(), BackendError> {
        // timed inside: the fallback's ops time themselves
        self.conv1d_qkv_rec(x, w, rows, states, norm, offsets, outs)
    }

    fn in_proj_conv1d_qkv(
        &self,
        h: &CudaTensor,
        ws: &[&CudaWeight],
        projs: &mut [&mut CudaTensor],
        w: &CudaWeight,
        rows: &[backend::Row],
        states: &mut [&mut CudaRecurrentState],
        norm: (usize, usize, f32),
        offsets: &[usize],
        outs: &mut [&mut CudaTensor],
    ) -> Result<(), BackendError> {
        // timed inside: each launch as its own op
        self.in_proj_conv_rec(h, ws, projs, w, rows, states, norm, offsets, outs)
    }

    fn delta_rule_gates(
        &self,
        alpha: &mut CudaTensor,
        beta: &mut CudaTensor,
        dt_bias: &CudaWeight,
        a: &CudaWeight,
    ) -> Result<(), BackendError> {
        skip_in_replay!(self);
        self.timed(
            || "delta_rule_gates".to_string(),
            || self.delta_rule_gates_impl(alpha, beta, dt_bias, a),
        )
    }

    fn delta_rule(
        &self,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        g: &CudaTensor,
        beta: &CudaTensor,
        rows: &[backend::Row],
        states: &mut [&mut CudaRecurrentState],
        out: &mut CudaTensor,
    ) -> Result<(), BackendError> {
        self.timed(
            || "delta_rule".to_string(),
            || self.delta_rule_impl(q, k, v, g, beta, rows, states, out),
        )
    }

    fn delta_rule_gated(
        &self,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        alpha: &mut CudaTensor,
        beta: &mut CudaTensor,
        gates: (&CudaWeight, &CudaWeight),
        rows: &[backend::Row],
        states: &mut [&mut CudaRecurrentState],
        out: &mut CudaTensor,
    ) -> Result<(), BackendError> {
        // timed inside: the fallback's ops time themselves
        self.delta_rule_gated_rec(q, k, v, alpha, beta, gates, rows, states, out)
    }

    fn delta_rule_gated_norm(
        &self,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        alpha: &mut CudaTensor,
        beta: &mut CudaTensor,
        gates: (&CudaWeight, &CudaWeight),
        rows: &[backend::Row],
        states: &mut [&mut CudaRecurrentState],
        out: &mut CudaTensor,
        norm: (&CudaWeight, &CudaTensor, f32),
    ) -> Result<(), BackendError> {
        if self.delta_rule_gated_norm_rec(q, k, v, alpha, beta, gates, rows, states, out, norm)? {
            return Ok(());
        }
        self.delta_rule_gated_rec(q, k, v, alpha, beta, gates, rows, states, out)?;
        backend::Backend::gated_rms_norm(self, out, norm.0, norm.1, norm.2)
    }
}

impl CudaBackend {
    /// Copies `t` into the page-locked buffer (grown as needed) and waits for it: the buffer's
    /// first `t.len()` values.
    fn pinned_download<'a>(
        &self,
        buf: &'a mut Option<cudarc::driver::PinnedHostSlice<f32>>,
        t: &CudaTensor,
    ) -> Result<&'a [f32], cudarc::driver::DriverError> {
        let len = t.len();
        if buf.as_ref().is_none_or(|b| b.len() < len) {
            *buf = None;
            // SAFETY: the values are written by the copy below before anything reads them.
            // Flags 0: cached host memory (the default write-combined kind is slow to read).
            *buf = Some(unsafe {
                self.dev.context().alloc_pinned_with_flags::<f32>(
                    len.next_power_of_two().min(PINNED_MAX_FLOATS),
                    0,
                )
            }?);
        }
        let b = buf.as_mut().expect("allocated above");
        let stream = self.dev.stream();
        let src = self.dev.device_address(&*t.data);
        // (not `memcpy_dtoh`: it copies the whole destination, here larger than t)
        // SAFETY: the buffer holds at least len f32 and nothing else uses it while the lock is
        // held; t.data starts at t's first of len values; the copy is ordered after the
        // kernels that wrote t on the backend's stream, and waited for before the read below.
        let dst = unsafe { std::slice::from_raw_parts_mut(b.as_mut_ptr()?, len) };
        unsafe { cudarc::driver::result::memcpy_dtoh_async(dst, src, stream.cu_stream()) }?;
        stream.synchronize()?;
        Ok(&b.as_slice()?[..len])
    }
}
