//! Prefill matrix products y = W x for many tokens on tensor cores, through cuBLAS.
//!
//! Why cuBLAS and this split: a matvec reads the weights once per (up to) 8 tokens, so at
//! n = 512 it re-reads them 64 times and is bound by memory and dp4a throughput. A GEMM on
//! tensor cores is compute-bound there, and cuBLAS has the best tuned kernels on every arch we
//! target (sm_70 Volta through sm_90 Hopper), where an own MMA kernel would need per-arch tiles.
//! So for n >= [`DEFAULT_GEMM_MIN_TOKENS`] tokens:
//! 1. the weight matrix is dequantized into an f16 scratch [rows, cols] (kernels/gemm.cu, one
//!    16-byte store per 8 weights; F16 weights are used in place, F32 weights go to a plain
//!    f32 SGEMM with no scratch, so f32 models keep f32 accuracy);
//! 2. x [n, cols] f32 is converted to f16 after scaling by a power of two 2^-e that puts
//!    max|x| in [2^14, 2^15) (f16 overflows at 65504; hidden states have outliers), and
//! 3. `cublasGemmEx` (f16 x f16, f32 accumulate, f32 out, alpha = 2^e read from the device)
//!    writes y [n, rows].
//!
//! `CudaBackend::matmul` calls it only outside recorded decode steps: with cuBLAS captured in
//! a CUDA graph, replayed steps gave wrong tokens on the H200 (not yet understood), so batched
//! decode of >= 12 sequences still takes the matvec there.
//!
//! The dequantized copy costs one write and one read of 2 bytes per weight; at n = 512 the
//! GEMM does 512 multiply-adds per weight, so that traffic is small next to the compute.
//!
//! Memory (for the planner): the weight scratch is 2 bytes x the largest matrix that takes the
//! GEMM path (rows x cols), capped at [`GEMM_MAX_SCRATCH_BYTES`] (larger matrices, e.g. an
//! output head, go in row chunks); plus x in f16 (2 x n_tokens x cols) and cuBLAS's workspace
//! [`CUBLAS_WORKSPACE_BYTES`]: see [`gemm_scratch_bytes`]. Reserve it at load with
//! [`CudaDevice::reserve_gemm`], or it is allocated (and grown) at the first prefill.
//!
//! cuBLAS is loaded at run time with our own `libloading` binding (like NVRTC, [`crate::nvrtc`]):
//! cudarc's cuBLAS looks only for sonames fixed at build time (its 12.x build never tries
//! `libcublas.so.13`) and panics when none loads. A missing cuBLAS is reported once and the
//! matvec path is used instead: never a panic.

use std::ffi::{c_int, c_void};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};
use gguf::GgmlType;

use crate::device::CudaDevice;
use crate::error::{CudaError, Result};
use crate::matvec::DeviceMatrix;
use crate::sources::Program;

/// Fewest tokens for which `try_matmul_gemm` takes the GEMM path (below it the matvec kernels,
/// which read the weights once per 8 tokens, win). H200 (BENCHMARKS.md, "prefill GEMM"): at
/// n = 8 the matvec is faster for every 32B matrix (39 vs 51 µs for 5120x5120 q4_K), at n = 12
/// the GEMM is for all but q6_K 5120x27648 (224 vs 236 µs), at 16 for all. Tunable per device
/// with `set_gemm_min_tokens`.
pub const DEFAULT_GEMM_MIN_TOKENS: usize = 12;
/// Largest f16 weight scratch. 512 MiB holds every matrix of a 70B-class layer (28672 x 8192 =
/// 448 MiB); bigger ones (output heads with all logits) are done in chunks of rows.
pub const GEMM_MAX_SCRATCH_BYTES: usize = 512 << 20;
/// Workspace handed to cuBLAS (its own default on Hopper is 32 MiB); ours so that nothing is
/// allocated inside a CUDA graph capture and the memory plan knows the size.
pub const CUBLAS_WORKSPACE_BYTES: usize = 32 << 20;

/// Device bytes the GEMM path needs for weight matrices of at most `max_weight_elems`
/// (rows x cols) elements, activations of at most `max_cols` columns and `max_tokens` tokens
/// per call (the micro-batch): f16 weight scratch + f16 x + cuBLAS workspace.
pub fn gemm_scratch_bytes(max_weight_elems: usize, max_cols: usize, max_tokens: usize) -> usize {
    (2 * max_weight_elems).min(GEMM_MAX_SCRATCH_BYTES)
        + 2 * max_cols * max_tokens
        + CUBLAS_WORKSPACE_BYTES
}

/// Kernel name of the dequantize-to-f16 kernel of `ty`; `None` for F16 (used in place), F32
/// (SGEMM) and unsupported types.
fn dequant_kernel(ty: GgmlType) -> Option<&'static str> {
    use GgmlType::*;
    Some(match ty {
        Q4_0 => "gemm_dequant_q4_0",
        Q4_1 => "gemm_dequant_q4_1",
        Q5_0 => "gemm_dequant_q5_0",
        Q5_1 => "gemm_dequant_q5_1",
        Q8_0 => "gemm_dequant_q8_0",
        IQ4NL => "gemm_dequant_iq4_nl",
        IQ4XS => "gemm_dequant_iq4_xs",
        Q2K => "gemm_dequant_q2_k",
        Q3K => "gemm_dequant_q3_k",
        Q4K => "gemm_dequant_q4_k",
        Q5K => "gemm_dequant_q5_k",
        Q6K => "gemm_dequant_q6_k",
        BF16 => "gemm_dequant_bf16",
        _ => return None,
    })
}

/// Weight types the GEMM path handles.
pub fn supports(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::F16 | GgmlType::F32) || dequant_kernel(ty).is_some()
}

// ---- cuBLAS binding ------------------------------------------------------------------------

type Handle = *mut c_void;
type Status = c_int;
const CUBLAS_OP_N: c_int = 0;
const CUBLAS_OP_T: c_int = 1;
const CUBLAS_POINTER_MODE_DEVICE: c_int = 1;
const CUDA_R_32F: c_int = 0;
const CUDA_R_16F: c_int = 2;
const CUBLAS_COMPUTE_32F: c_int = 68;
const CUBLAS_GEMM_DEFAULT: c_int = -1;

type GemmExFn = unsafe extern "C" fn(
    Handle,
    c_int,
    c_int,
    c_int,
    c_int,
    c_int,
    *const c_void,
    *const c_void,
    c_int,
    c_int,
    *const c_void,
    c_int,
    c_int,
    *const c_void,
    *mut c_void,
    c_int,
    c_int,
    c_int,
    c_int,
) -> Status;

/// Sonames tried, newest CUDA first; the API used (cublasCreate_v2 … cublasGemmEx with
/// cublasComputeType_t) is the same in cuBLAS 11, 12 and 13.
const SONAMES: &[(&str, &str)] = &[
    ("libcublas.so.13", "libcublasLt.so.13"),
    ("libcublas.so.12", "libcublasLt.so.12"),
    ("libcublas.so", "libcublasLt.so"),
];

/// The function table of one loaded libcublas.
pub struct CublasLibrary {
    path: PathBuf,
    create: unsafe extern "C" fn(*mut Handle) -> Status,
    destroy: unsafe extern "C" fn(Handle) -> Status,
    set_stream: unsafe extern "C" fn(Handle, *mut c_void) -> Status,
    set_pointer_mode: unsafe extern "C" fn(Handle, c_int) -> Status,
    set_workspace: Option<unsafe extern "C" fn(Handle, *mut c_void, usize) -> Status>,
    get_version: unsafe extern "C" fn(Handle, *mut c_int) -> Status,
    gemm_ex: GemmExFn,
    // Keep the function pointers valid; cublasLt first so cublas finds it by soname.
    _lt: Option<libloading::Library>,
    _lib: libloading::Library,
}

/// Directories where a CUDA toolkit or the NVIDIA PyPI wheels put libcublas, beside `near`
/// (the directory NVRTC was found in) first.
fn candidate_dirs(near: Option<&Path>) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(d) = near {
        dirs.push(d.to_path_buf());
        // cu12 wheels: nvidia/cuda_nvrtc/lib beside nvidia/cublas/lib
        dirs.push(d.join("../../cublas/lib"));
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(v) = std::env::var_os(var) {
            dirs.push(Path::new(&v).join("lib64"));
            dirs.push(Path::new(&v).join("lib"));
        }
    }
    dirs.push("/usr/local/cuda/lib64".into());
    dirs.extend(crate::nvrtc::glob_dirs("/usr/local", "cuda-", "lib64"));
    for sp in crate::nvrtc::site_packages_dirs() {
        dirs.push(sp.join("nvidia/cu13/lib"));
        dirs.push(sp.join("nvidia/cublas/lib"));
    }
    dirs
}

impl CublasLibrary {
    /// Loads cuBLAS: `explicit` if given, else by soname through the system loader, else from
    /// the toolkit and wheel directories (NVRTC's directory `near` first). Never panics.
    pub fn load(explicit: Option<&Path>, near: Option<&Path>) -> Result<CublasLibrary> {
        if let Some(p) = explicit {
            return CublasLibrary::load_path(p, None);
        }
        let mut tried = Vec::new();
        for (so, lt) in SONAMES {
            match CublasLibrary::load_path(Path::new(so), Some(Path::new(lt))) {
                Ok(l) => return Ok(l),
                Err(e) => tried.push(format!("{so} ({e})")),
            }
        }
        for d in candidate_dirs(near) {
            for (so, lt) in SONAMES {
                let p = d.join(so);
                if !p.exists() {
                    continue;
                }
                match CublasLibrary::load_path(&p, Some(&d.join(lt))) {
                    Ok(l) => return Ok(l),
                    Err(e) => tried.push(format!("{} ({e})", p.display())),
                }
            }
        }
        Err(CudaError::Cublas(format!(
            "cuBLAS library not found (tried: {})",
            tried.join("; ")
        )))
    }

    /// Loads the library at `path`, with cublasLt from `lt` loaded first when it exists (so a
    /// libcublas outside the loader's path finds its companion by soname).
    pub fn load_path(path: &Path, lt: Option<&Path>) -> Result<CublasLibrary> {
        let err = |e: libloading::Error| CudaError::Cublas(format!("{}: {e}", path.display()));
        // SAFETY: loading cuBLAS runs its initializers, which have no preconditions.
        let lt = lt.and_then(|p| unsafe { libloading::Library::new(p) }.ok());
        // SAFETY: as above.
        let lib = unsafe { libloading::Library::new(path) }.map_err(err)?;
        // SAFETY: each symbol is looked up with the C signature cublas_api.h declares for it,
        // and the pointers are kept only while `lib` lives (it is stored beside them).
        unsafe {
            Ok(CublasLibrary {
                path: path.to_path_buf(),
                create: *lib.get(b"cublasCreate_v2\0").map_err(err)?,
                destroy: *lib.get(b"cublasDestroy_v2\0").map_err(err)?,
                set_stream: *lib.get(b"cublasSetStream_v2\0").map_err(err)?,
                set_pointer_mode: *lib.get(b"cublasSetPointerMode_v2\0").map_err(err)?,
                set_workspace: lib.get(b"cublasSetWorkspace_v2\0").ok().map(|s| *s),
                get_version: *lib.get(b"cublasGetVersion_v2\0").map_err(err)?,
                gemm_ex: *lib.get(b"cublasGemmEx\0").map_err(err)?,
                _lt: lt,
                _lib: lib,
            })
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

fn check(call: &str, s: Status) -> Result<()> {
    if s == 0 {
        Ok(())
    } else {
        Err(CudaError::Cublas(format!("{call} returned status {s}")))
    }
}

/// One cuBLAS handle bound to the device's stream, in device pointer mode (alpha and beta are
/// read from device memory, so the activation scale never comes back to the host).
struct Cublas {
    lib: CublasLibrary,
    handle: Handle,
    version: i32,
    _workspace: Option<CudaSlice<u8>>,
}

// SAFETY: the handle is used only under `GemmState`'s mutex, on the device's one stream, and
// cuBLAS handles may move between threads (cuBLAS docs: a handle is not thread-safe to share
// concurrently, which the mutex prevents).
unsafe impl Send for Cublas {}

impl Cublas {
    fn new(dev: &CudaDevice) -> Result<Cublas> {
        let near = dev.nvrtc().path().parent().map(Path::to_path_buf);
        let lib = CublasLibrary::load(None, near.as_deref())?;
        dev.context().bind_to_thread()?;
        let mut handle: Handle = std::ptr::null_mut();
        // SAFETY: cublasCreate_v2 writes a handle for the current context (bound above).
        check("cublasCreate", unsafe { (lib.create)(&mut handle) })?;
        let mut blas = Cublas {
            lib,
            handle,
            version: 0,
            _workspace: None,
        };
        // SAFETY: valid handle; the stream belongs to the bound context and outlives the handle
        // (both are owned by the device, the handle is dropped first).
        check("cublasSetStream", unsafe {
            (blas.lib.set_stream)(handle, dev.stream().cu_stream() as *mut c_void)
        })?;
        // SAFETY: valid handle.
        check("cublasSetPointerMode", unsafe {
            (blas.lib.set_pointer_mode)(handle, CUBLAS_POINTER_MODE_DEVICE)
        })?;
        if let Some(set_ws) = blas.lib.set_workspace {
            let mut ws = dev.stream().alloc_zeros::<u8>(CUBLAS_WORKSPACE_BYTES)?;
            let (p, _g) = ws.device_ptr_mut(dev.stream());
            // SAFETY: `ws` is a device allocation of CUBLAS_WORKSPACE_BYTES kept alive in
            // `_workspace` as long as the handle.
            check("cublasSetWorkspace", unsafe {
                set_ws(handle, p as *mut c_void, CUBLAS_WORKSPACE_BYTES)
            })?;
            drop(_g);
            blas._workspace = Some(ws);
        }
        let mut v: c_int = 0;
        // SAFETY: valid handle, v is a valid out pointer.
        check("cublasGetVersion", unsafe {
            (blas.lib.get_version)(handle, &mut v)
        })?;
        blas.version = v;
        Ok(blas)
    }
}

impl Drop for Cublas {
    fn drop(&mut self) {
        // SAFETY: the handle was created by cublasCreate_v2 and is destroyed once.
        unsafe { (self.lib.destroy)(self.handle) };
    }
}

// ---- per-device state -------------------------------------------------------------------------

enum BlasState {
    Untried,
    Ready(Box<Cublas>),
    Unavailable(String),
}

struct Buffers {
    blas: BlasState,
    /// f16 weights [chunk rows, cols] (as u16 bits).
    w16: Option<CudaSlice<u16>>,
    /// f16 activations [n, cols].
    x16: Option<CudaSlice<u16>>,
    /// [alpha of the last x conversion, 1.0, 0.0, 0.0]: cuBLAS's alpha/beta in device memory.
    scalars: Option<CudaSlice<f32>>,
    /// max|x| slots of gemm_absmax / gemm_convert_x (see kernels/gemm.cu), and the one in use.
    amax: Option<CudaSlice<u32>>,
    slot: i32,
}

/// The GEMM path's state of one device: cuBLAS (loaded at first use) and its scratch buffers.
pub struct GemmState {
    min_tokens: AtomicUsize,
    inner: Mutex<Buffers>,
}

impl Default for GemmState {
    fn default() -> Self {
        GemmState {
            min_tokens: AtomicUsize::new(DEFAULT_GEMM_MIN_TOKENS),
            inner: Mutex::new(Buffers {
                blas: BlasState::Untried,
                w16: None,
                x16: None,
                scalars: None,
                amax: None,
                slot: 0,
            }),
        }
    }
}

/// A buffer of at least `n` elements in `slot` (reallocated, not grown in place, when short).
fn ensure<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    dev: &CudaDevice,
    slot: &mut Option<CudaSlice<T>>,
    n: usize,
) -> Result<()> {
    if slot.as_ref().is_none_or(|s| s.len() < n) {
        *slot = None; // free first: the old and new buffer need not fit together
        *slot = Some(dev.stream().alloc_zeros::<T>(n.max(1))?);
    }
    Ok(())
}

/// Rows per chunk for a [rows, cols] matrix: all of them when the f16 copy fits the scratch cap,
/// else the most that fit, a multiple of 128 (cuBLAS tile edge).
fn chunk_rows(rows: usize, cols: usize) -> usize {
    let cap = GEMM_MAX_SCRATCH_BYTES / 2 / cols.max(1);
    if rows <= cap {
        rows
    } else {
        (cap / 128 * 128).max(128).min(rows)
    }
}

impl CudaDevice {
    fn gemm_state(&self) -> &GemmState {
        &self.gemm
    }

    /// Fewest tokens for which [`CudaDevice::try_matmul_gemm`] uses the GEMM path.
    pub fn gemm_min_tokens(&self) -> usize {
        self.gemm_state().min_tokens.load(Ordering::Relaxed)
    }

    /// Sets the GEMM threshold (`usize::MAX` turns the GEMM path off; 1 forces it).
    pub fn set_gemm_min_tokens(&self, n: usize) {
        self.gemm_state()
            .min_tokens
            .store(n.max(1), Ordering::Relaxed);
    }

    /// Loads cuBLAS if not yet tried; `Ok(version)` (e.g. 130000) or why it is unavailable.
    pub fn gemm_backend(&self) -> Result<i32> {
        let mut b = self
            .gemm_state()
            .inner
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        self.blas_ready(&mut b).map(|c| c.version)
    }

    fn blas_ready<'a>(&self, b: &'a mut Buffers) -> Result<&'a Cublas> {
        if matches!(b.blas, BlasState::Untried) {
            b.blas = match Cublas::new(self) {
                Ok(c) => BlasState::Ready(Box::new(c)),
                Err(e) => BlasState::Unavailable(e.to_string()),
            };
        }
        match &b.blas {
            BlasState::Ready(c) => Ok(c),
            BlasState::Unavailable(m) => Err(CudaError::Cublas(m.clone())),
            BlasState::Untried => unreachable!("set above"),
        }
    }

    /// Allocates the GEMM scratch now (see [`gemm_scratch_bytes`]) so VRAM use after load
    /// matches the plan, and loads cuBLAS. Errors if cuBLAS is unavailable.
    pub fn reserve_gemm(
        &self,
        max_weight_elems: usize,
        max_cols: usize,
        max_tokens: usize,
    ) -> Result<()> {
        let mut b = self
            .gemm_state()
            .inner
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        self.blas_ready(&mut b)?;
        let w_elems = max_weight_elems.min(GEMM_MAX_SCRATCH_BYTES / 2);
        ensure(self, &mut b.w16, w_elems)?;
        ensure(self, &mut b.x16, max_cols * max_tokens)?;
        Ok(())
    }

    /// y = W x through the GEMM path when it applies: `n_tokens` >= the threshold, a supported
    /// weight type, and cuBLAS present. Returns `Ok(false)` (nothing done) otherwise, so the
    /// caller uses the matvec; a missing cuBLAS is reported once on stderr.
    /// x: [n_tokens, w.n_cols] f32, y: [n_tokens, w.n_rows] f32. Asynchronous.
    pub fn try_matmul_gemm(
        &self,
        w: &DeviceMatrix,
        x: &CudaSlice<f32>,
        n_tokens: usize,
        y: &mut CudaSlice<f32>,
    ) -> Result<bool> {
        // cols % 32: the kernels convert x 4 and dequantize 8 values at a time (every block
        // format has it; an odd-width F32/F16 matrix stays on the matvec).
        if n_tokens < self.gemm_min_tokens() || !supports(w.ty) || !w.n_cols.is_multiple_of(32) {
            return Ok(false);
        }
        {
            let mut b = self
                .gemm_state()
                .inner
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if let Err(e) = self.blas_ready(&mut b) {
                static NOTICE: std::sync::Once = std::sync::Once::new();
                NOTICE.call_once(|| {
                    eprintln!("prefill GEMM unavailable, using the matvec kernels instead: {e}")
                });
                return Ok(false);
            }
        }
        self.matmul_gemm(w, x, n_tokens, y).map(|()| true)
    }

    /// y = W x on tensor cores for any number of tokens (see the module doc).
    /// x: [n_tokens, w.n_cols] f32, y: [n_tokens, w.n_rows] f32. Asynchronous.
    pub fn matmul_gemm(
        &self,
        w: &DeviceMatrix,
        x: &CudaSlice<f32>,
        n_tokens: usize,
        y: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let (rows, cols) = (w.n_rows, w.n_cols);
        if !supports(w.ty) {
            return Err(CudaError::UnsupportedType(w.ty.name()));
        }
        if x.len() < n_tokens * cols || y.len() < n_tokens * rows || !cols.is_multiple_of(32) {
            return Err(CudaError::Shape(format!(
                "gemm: x {} / y {} for {n_tokens} tokens of {rows}x{cols} (cols % 32 == 0)",
                x.len(),
                y.len()
            )));
        }
        let lim = i32::MAX as usize;
        if rows > lim || cols > lim || n_tokens > lim || n_tokens * cols > lim.min(usize::MAX / 2) {
            return Err(CudaError::Shape("gemm: dimension exceeds i32".into()));
        }
        if n_tokens == 0 || rows == 0 {
            return Ok(());
        }
        let mut guard = self
            .gemm_state()
            .inner
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let b = &mut *guard;
        self.blas_ready(b)?;
        if b.scalars.is_none() {
            b.scalars = Some(self.stream().clone_htod(&[0.0f32, 1.0, 0.0, 0.0])?);
            b.amax = Some(self.stream().alloc_zeros::<u32>(2)?);
        }
        self.context().bind_to_thread()?;
        let stream = self.stream();
        let (sc_ptr, _sg) = b.scalars.as_ref().expect("set above").device_ptr(stream);
        let (alpha_x, one, zero) = (sc_ptr, sc_ptr + 4, sc_ptr + 8);
        let (y_ptr, _yg) = y.device_ptr_mut(stream);
        let BlasState::Ready(blas) = &b.blas else {
            unreachable!("blas_ready succeeded")
        };
        let gemm = |m: usize, a: u64, a_ty: c_int, bm: u64, b_ty: c_int, alpha: u64, c: u64| {
            // SAFETY: column-major view of row-major data: A = W chunk [m rows, cols] read as
            // cols x m (lda = cols) transposed, B = x [n, cols] read as cols x n (ldb = cols),
            // C = y [n, rows] read as rows x n (ldc = rows) starting at the chunk's first row.
            // All buffers hold these extents (checked above); alpha/beta are device scalars.
            check("cublasGemmEx", unsafe {
                (blas.lib.gemm_ex)(
                    blas.handle,
                    CUBLAS_OP_T,
                    CUBLAS_OP_N,
                    m as c_int,
                    n_tokens as c_int,
                    cols as c_int,
                    alpha as *const c_void,
                    a as *const c_void,
                    a_ty,
                    cols as c_int,
                    bm as *const c_void,
                    b_ty,
                    cols as c_int,
                    zero as *const c_void,
                    c as *mut c_void,
                    CUDA_R_32F,
                    rows as c_int,
                    CUBLAS_COMPUTE_32F,
                    CUBLAS_GEMM_DEFAULT,
                )
            })
        };
        let (w_ptr, _wg) = w.data.device_ptr(stream);
        if w.ty == GgmlType::F32 {
            // Exact f32 SGEMM on the weights in place (no TF32: default math mode).
            let (x_ptr, _xg) = x.device_ptr(stream);
            return gemm(rows, w_ptr, CUDA_R_32F, x_ptr, CUDA_R_32F, one, y_ptr);
        }
        // x -> f16 scaled by 2^-e; alpha_x = 2^e.
        ensure(self, &mut b.x16, n_tokens * cols)?;
        let slot = b.slot;
        b.slot ^= 1;
        self.convert_x_f16(
            x,
            n_tokens * cols,
            b.x16.as_mut().expect("ensured"),
            b.amax.as_mut().expect("set above"),
            slot,
            b.scalars.as_ref().expect("set above"),
        )?;
        let (x16_ptr, _x16g) = b.x16.as_ref().expect("ensured").device_ptr(stream);
        let Some(kernel) = dequant_kernel(w.ty) else {
            // F16 weights: used in place.
            return gemm(rows, w_ptr, CUDA_R_16F, x16_ptr, CUDA_R_16F, alpha_x, y_ptr);
        };
        let chunk = chunk_rows(rows, cols);
        ensure(self, &mut b.w16, chunk * cols)?;
        let mut r0 = 0;
        while r0 < rows {
            let m = chunk.min(rows - r0);
            let w16 = b.w16.as_mut().expect("ensured");
            self.launch_dequant(w, kernel, r0, m, w16)?;
            let (w16_ptr, _g) = w16.device_ptr(stream);
            gemm(
                m,
                w16_ptr,
                CUDA_R_16F,
                x16_ptr,
                CUDA_R_16F,
                alpha_x,
                y_ptr + (r0 * 4) as u64,
            )?;
            r0 += m;
        }
        Ok(())
    }

    /// Dequantizes rows r0..r0+m of `w` into `out` f16 [m, cols] (gemm_dequant_<fmt>).
    fn launch_dequant(
        &self,
        w: &DeviceMatrix,
        kernel: &str,
        r0: usize,
        m: usize,
        out: &mut CudaSlice<u16>,
    ) -> Result<()> {
        let cols = w.n_cols;
        if r0 + m > w.n_rows || out.len() < m * cols || !cols.is_multiple_of(32) {
            return Err(CudaError::Shape(format!(
                "dequantize rows {r0}..+{m} of {}x{cols} into {} f16",
                w.n_rows,
                out.len()
            )));
        }
        if m == 0 {
            return Ok(());
        }
        let f = self.function(Program::Gemm, kernel)?;
        let row_bytes = w.row_bytes();
        let n_groups = (m * cols / 8) as i64;
        let cfg = LaunchConfig {
            grid_dim: ((m * cols / 8).div_ceil(256).min(1 << 20) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let (cols_i, rb) = (cols as i32, row_bytes as i64);
        let src = w.data.slice(r0 * row_bytes..);
        let mut lb = self.stream().launch_builder(&f);
        lb.arg(&src)
            .arg(&mut *out)
            .arg(&n_groups)
            .arg(&cols_i)
            .arg(&rb);
        // SAFETY: matches gemm_dequant_<fmt>(w, out, n_groups, cols, row_bytes): src holds m
        // rows of row_bytes, out holds m * cols f16 (checked); cols % 32 == 0 so groups of 8
        // never straddle a block.
        unsafe { lb.launch(cfg) }?;
        Ok(())
    }

    /// Dequantizes the whole of `w` (any type but F16/F32) into `out` f16 [rows, cols], as the
    /// GEMM path does (for tests and benchmarks). Asynchronous.
    pub fn dequantize_to_f16(&self, w: &DeviceMatrix, out: &mut CudaSlice<u16>) -> Result<()> {
        let kernel = dequant_kernel(w.ty).ok_or(CudaError::UnsupportedType(w.ty.name()))?;
        self.launch_dequant(w, kernel, 0, w.n_rows, out)
    }

    /// xh = f16(x * 2^-e) and scalars[0] = 2^e, e from max|x| (kernels/gemm.cu).
    fn convert_x_f16(
        &self,
        x: &CudaSlice<f32>,
        n: usize,
        xh: &mut CudaSlice<u16>,
        amax: &mut CudaSlice<u32>,
        slot: i32,
        scalars: &CudaSlice<f32>,
    ) -> Result<()> {
        let blocks = |n: usize| {
            (n.div_ceil(256)
                .min(self.info().sm_count.max(1) as usize * 8)) as u32
        };
        let n_i = n as i64;
        let f = self.function(Program::Gemm, "gemm_absmax")?;
        let mut lb = self.stream().launch_builder(&f);
        lb.arg(x).arg(&n_i).arg(&mut *amax).arg(&slot);
        let cfg = LaunchConfig {
            grid_dim: (blocks(n), 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: matches gemm_absmax(x, n, slots, slot): x holds n floats, slots 2, slot 0|1.
        unsafe { lb.launch(cfg) }?;
        let n4 = (n / 4) as i64;
        let f = self.function(Program::Gemm, "gemm_convert_x")?;
        let mut lb = self.stream().launch_builder(&f);
        lb.arg(x)
            .arg(&mut *xh)
            .arg(&n4)
            .arg(&mut *amax)
            .arg(&slot)
            .arg(scalars);
        let cfg = LaunchConfig {
            grid_dim: (blocks(n / 4), 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: matches gemm_convert_x(x, xh, n4, slots, slot, alpha): n % 4 == 0 (cols % 32),
        // xh holds n f16, alpha points at scalars[0].
        unsafe { lb.launch(cfg) }?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_cublas_is_an_error_not_a_panic() {
        let r = CublasLibrary::load(Some(Path::new("/nonexistent/libcublas.so.12")), None);
        assert!(matches!(r, Err(CudaError::Cublas(_))));
    }

    #[test]
    fn chunks_cover_big_matrices_in_multiples_of_128_rows() {
        assert_eq!(chunk_rows(27648, 5120), 27648); // 283 MB f16: one piece
        let c = chunk_rows(152064, 5120); // an output head: 1.56 GB f16
        assert_eq!(c % 128, 0);
        assert!(
            c * 5120 * 2 <= GEMM_MAX_SCRATCH_BYTES && (c + 128) * 5120 * 2 > GEMM_MAX_SCRATCH_BYTES
        );
        assert_eq!(
            gemm_scratch_bytes(27648 * 5120, 27648, 512),
            27648 * 5120 * 2 + 27648 * 512 * 2 + CUBLAS_WORKSPACE_BYTES
        );
    }

    #[test]
    fn every_matvec_type_has_a_gemm_path() {
        use GgmlType::*;
        for ty in [
            F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4NL, IQ4XS, Q2K, Q3K, Q4K, Q5K, Q6K,
        ] {
            assert!(supports(ty), "{}", ty.name());
        }
    }
}
