//! GPU discovery and the per-device runtime: context, stream, NVRTC, kernel cache, modules.
//!
//! Everything is loaded at run time: the driver (libcuda) through cudarc's `dynamic-loading`,
//! NVRTC through [`crate::nvrtc`]. cudarc panics when libcuda cannot be found, so we ask
//! `is_culib_present()` first and wrap the first driver calls in `catch_unwind` (a missing
//! symbol also panics there): no CUDA is an error value, never a crash.

use crate::error::{CudaError, Result};
use crate::kernel_cache::{cache_key, default_cache_dir, KernelCache};
use crate::nvrtc::{Nvrtc, Target};
use crate::sources::Program;
use cudarc::driver::sys::CUdevice_attribute as Attr;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex, Once};

/// Weights loaded with ld.global.nc.L1::no_allocate: 2-8 % faster than plain loads on every
/// type and shape of the H200 sweep (BENCHMARKS.md, matvec v3).
pub const DEFAULT_MATVEC_LOAD_MODE: i32 = 2;

/// What the driver reports about one GPU.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    pub ordinal: usize,
    pub name: String,
    /// (major, minor), e.g. (9, 0) for H100/H200, (7, 0) for V100.
    pub compute_capability: (i32, i32),
    pub total_mem_bytes: usize,
    pub sm_count: i32,
    /// Peak memory clock (kHz) and bus width (bits): the datasheet bandwidth is
    /// 2 * clock * width / 8. The measured figure comes from `bandwidth::measure_read_bandwidth`.
    pub mem_clock_khz: i32,
    pub mem_bus_width_bits: i32,
}

impl DeviceInfo {
    /// `sm_XX` number, e.g. 90.
    pub fn arch(&self) -> u32 {
        (self.compute_capability.0 * 10 + self.compute_capability.1) as u32
    }

    /// Theoretical DRAM bandwidth in GB/s (double data rate).
    pub fn peak_bandwidth_gbs(&self) -> f64 {
        2.0 * self.mem_clock_khz as f64 * 1e3 * self.mem_bus_width_bits as f64 / 8.0 / 1e9
    }
}

/// Options for opening a device.
#[derive(Clone, Debug)]
pub struct CudaOptions {
    pub ordinal: usize,
    /// libnvrtc to use; `None` searches the usual places (see `nvrtc::candidate_paths`).
    pub nvrtc_path: Option<PathBuf>,
    /// Kernel cache directory; `None` uses `~/.cache/redline/kernels`.
    pub cache_dir: Option<PathBuf>,
    /// Run as on an older card: kernels compiled as PTX for `compute_XX` (the driver compiles
    /// that for the real card, keeping the older architecture's code paths) and every dispatch
    /// decided as on an `sm_XX` card (no int8 tensor-core products below 80, no PDL below 90).
    /// For checking the V100 (70) / Turing (75) paths on a newer card; slower. `None`: the
    /// card's own architecture. `Default` takes it from `REDLINE_CUDA_ARCH`, so every tool and
    /// test honours that variable.
    pub target_arch: Option<u32>,
}

impl Default for CudaOptions {
    fn default() -> Self {
        CudaOptions {
            ordinal: 0,
            nvrtc_path: None,
            cache_dir: None,
            target_arch: target_arch_from_env(),
        }
    }
}

/// `REDLINE_CUDA_ARCH` as a number (`70`, `sm_75` and `compute_75` are all read as such);
/// unset or empty: `None`. A value that is no number is kept as 0, which `open` refuses with
/// an error that names the variable.
fn target_arch_from_env() -> Option<u32> {
    parse_target_arch(&std::env::var("REDLINE_CUDA_ARCH").ok()?)
}

fn parse_target_arch(v: &str) -> Option<u32> {
    let v = v.trim();
    if v.is_empty() {
        return None;
    }
    let digits = v.trim_start_matches("compute_").trim_start_matches("sm_");
    Some(digits.parse().unwrap_or(0))
}

/// The architecture to compile for and whether as PTX: the card's own (or the newest NVRTC
/// has of its family) as a cubin, or `wanted` (older than the card) as PTX.
fn pick_target(
    device_arch: u32,
    wanted: Option<u32>,
    sup: &[u32],
    version: (i32, i32),
) -> Result<Target> {
    let Some(w) = wanted.filter(|&w| w != device_arch) else {
        return Ok(Target::Cubin(pick_arch(device_arch, sup, version)?));
    };
    if w < 70 || w > device_arch {
        return Err(CudaError::Options(format!(
            "REDLINE_CUDA_ARCH={w}: this card is sm_{device_arch}; give an architecture from 70 \
             up to {device_arch} (e.g. 75 for the pre-Ampere code paths), or unset it"
        )));
    }
    if !sup.is_empty() && !sup.contains(&w) {
        let (maj, min) = version;
        return Err(CudaError::Options(format!(
            "REDLINE_CUDA_ARCH={w}: NVRTC {maj}.{min} cannot compile for compute_{w} (it has \
             {sup:?}; CUDA 13 dropped sm_70, so use 75 for the same code paths, or load NVRTC \
             12.x)"
        )));
    }
    Ok(Target::Ptx(w))
}

/// Runs `f` (first driver calls) turning a cudarc panic into an error.
fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T> + std::panic::UnwindSafe) -> Result<T> {
    match std::panic::catch_unwind(f) {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            Err(CudaError::NoDevice(format!("{what}: {msg}")))
        }
    }
}

/// True when a CUDA driver library can be loaded (cheap; loads nothing else).
pub fn driver_present() -> bool {
    // SAFETY: only tries dlopen of libcuda candidates and closes them again.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

fn device_info(ctx: &Arc<CudaContext>, ordinal: usize) -> Result<DeviceInfo> {
    Ok(DeviceInfo {
        ordinal,
        name: ctx.name()?,
        compute_capability: ctx.compute_capability()?,
        total_mem_bytes: ctx.total_mem()?,
        sm_count: ctx.attribute(Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
        mem_clock_khz: ctx.attribute(Attr::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE)?,
        mem_bus_width_bits: ctx.attribute(Attr::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH)?,
    })
}

/// Number of CUDA devices, or `NoDevice` (no driver, driver error, or zero devices).
pub fn device_count() -> Result<usize> {
    if !driver_present() {
        return Err(CudaError::NoDevice(
            "no CUDA driver library (libcuda.so) found".into(),
        ));
    }
    let n = guarded("cuInit", || {
        CudaContext::device_count().map_err(|e| CudaError::NoDevice(e.to_string()))
    })?;
    if n <= 0 {
        return Err(CudaError::NoDevice(
            "the CUDA driver reports no devices".into(),
        ));
    }
    Ok(n as usize)
}

/// All devices the driver sees (opens each device's primary context).
pub fn list_devices() -> Result<Vec<DeviceInfo>> {
    let n = device_count()?;
    (0..n)
        .map(|i| {
            let ctx = guarded("cuCtx", move || Ok(CudaContext::new(i)?))?;
            device_info(&ctx, i)
        })
        .collect()
}

/// One opened GPU with its stream and compiled kernels.
pub struct CudaDevice {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    info: DeviceInfo,
    arch: u32,
    /// What the kernels are compiled to: a cubin for `arch`, or PTX (`CudaOptions::target_arch`).
    target: Target,
    nvrtc: Nvrtc,
    cache: KernelCache,
    modules: Mutex<HashMap<Program, Arc<CudaModule>>>,
    functions: Mutex<HashMap<String, CudaFunction>>,
    /// How block-format matvec kernels load weights (see kernels/matvec_quant.cu
    /// `ld_weights`): 0 plain, 1 evict-first, 2 bypass L1. A tuning knob for benchmarks.
    matvec_load_mode: AtomicI32,
    /// Prefill GEMM: cuBLAS (loaded at first use) and its scratch (crate::gemm).
    pub(crate) gemm: crate::gemm::GemmState,
    /// The queue products' counters: [`crate::matvec::QUEUE_SLOTS`] slots of
    /// [`crate::matvec::QUEUE_SLOT_WORDS`] u32, zero
    /// between launches ([`Self::queue_slot`]).
    queue: CudaSlice<u32>,
    /// The next slot [`Self::queue_slot`] hands out.
    queue_next: std::sync::atomic::AtomicUsize,
}

impl CudaDevice {
    /// The address of the next queue slot (its counters at zero) for one launch of a queue
    /// product (kernels/matvec_direct.cu `mvd_groups`), slots in turn. A launch puts its slot
    /// back to zero before it ends, and draws from it only after its PDL wait, when every
    /// launch before it on the stream has ended: so a slot handed out again (after
    /// [`crate::matvec::QUEUE_SLOTS`] launches, or to another graph's launch) is at zero when
    /// drawn from.
    pub(crate) fn queue_slot(&self) -> u64 {
        let i = self
            .queue_next
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            % crate::matvec::QUEUE_SLOTS;
        self.device_address(&self.queue) + (4 * crate::matvec::QUEUE_SLOT_WORDS * i) as u64
    }

    /// Opens device `opts.ordinal` and loads NVRTC. Kernels compile lazily on first use.
    pub fn open(opts: &CudaOptions) -> Result<CudaDevice> {
        let n = device_count()?;
        if opts.ordinal >= n {
            return Err(CudaError::NoDevice(format!(
                "device {} requested, {n} present",
                opts.ordinal
            )));
        }
        let ordinal = opts.ordinal;
        let ctx = guarded("cuCtx", move || Ok(CudaContext::new(ordinal)?))?;
        let info = device_info(&ctx, ordinal)?;
        let nvrtc = Nvrtc::load(opts.nvrtc_path.as_deref())?;
        let target = pick_target(
            info.arch(),
            opts.target_arch,
            nvrtc.supported_archs(),
            nvrtc.version(),
        )?;
        let arch = target.arch();
        if let Target::Ptx(a) = target {
            eprintln!(
                "redline: running the {} (sm_{}) as an sm_{a} card: kernels compiled as compute_{a} \
                 PTX and dispatched as on that architecture (REDLINE_CUDA_ARCH; slower, for \
                 checking the older cards' code paths)",
                info.name,
                info.arch()
            );
        }
        // One explicit stream for everything: the legacy NULL stream cannot be captured into a
        // CUDA graph (crates/cuda/src/backend/step.rs). All work is ordered on this one stream,
        // so cudarc's per-buffer event tracking is not needed; it is switched off before any
        // buffer exists because events recorded outside a capture cannot be waited on inside.
        // SAFETY: no buffer of this context is used on another stream (see above).
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream()?;
        let cache = KernelCache::new(opts.cache_dir.clone().or_else(default_cache_dir));
        let queue = stream
            .alloc_zeros::<u32>(crate::matvec::QUEUE_SLOT_WORDS * crate::matvec::QUEUE_SLOTS)?;
        let dev = CudaDevice {
            ctx,
            stream,
            info,
            arch,
            target,
            nvrtc,
            cache,
            modules: Mutex::new(HashMap::new()),
            functions: Mutex::new(HashMap::new()),
            matvec_load_mode: AtomicI32::new(DEFAULT_MATVEC_LOAD_MODE),
            gemm: crate::gemm::GemmState::default(),
            queue,
            queue_next: std::sync::atomic::AtomicUsize::new(0),
        };
        if crate::trace::config().is_some() && crate::trace::buffer().is_none() {
            // the block-timeline probe's buffer (crate::trace), kept for the process
            let buf = dev.stream.alloc_zeros::<u8>(crate::trace::buffer_bytes())?;
            crate::trace::set_buffer(dev.device_address(&buf));
            std::mem::forget(buf);
        }
        Ok(dev)
    }

    /// Sets how block-format matvecs load weights: 0 plain, 1 evict-first, 2 bypass L1.
    pub fn set_matvec_load_mode(&self, mode: i32) {
        self.matvec_load_mode
            .store(mode.clamp(0, 2), Ordering::Relaxed);
    }

    pub fn matvec_load_mode(&self) -> i32 {
        self.matvec_load_mode.load(Ordering::Relaxed)
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// The `sm_XX` the kernels are compiled and dispatched for: the card's, or the older one
    /// of `CudaOptions::target_arch`.
    pub fn arch(&self) -> u32 {
        self.arch
    }

    /// What the kernels are compiled to (a cubin, or PTX when running as an older card).
    pub fn target(&self) -> Target {
        self.target
    }

    pub fn nvrtc(&self) -> &Nvrtc {
        &self.nvrtc
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    pub fn synchronize(&self) -> Result<()> {
        Ok(self.stream.synchronize()?)
    }

    /// The module of `program`, compiled (or read from the disk cache) and loaded on first use.
    pub fn module(&self, program: Program) -> Result<Arc<CudaModule>> {
        let mut modules = self.modules.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = modules.get(&program) {
            return Ok(m.clone());
        }
        let src = program.program_source();
        let options: [&str; 0] = [];
        let key = cache_key(&src, self.target, self.nvrtc.version(), &options);
        let load = |cubin: Vec<u8>| self.ctx.load_module(cudarc::nvrtc::Ptx::from_binary(cubin));
        let module = match self.cache.get(&key).map(load) {
            Some(Ok(m)) => m,
            _ => {
                // Not cached, or a stale/corrupt entry: compile and replace it. A large program
                // takes a minute or more, so say what is happening (once per program and card).
                let (maj, min) = self.nvrtc.version();
                eprintln!(
                    "redline: compiling CUDA kernels {} for {} with NVRTC {maj}.{min} (first use \
                     on this card and version; cached{})",
                    program.file_name(),
                    self.target,
                    match self.cache.dir() {
                        Some(d) => format!(" in {}", d.display()),
                        None => " nowhere: set XDG_CACHE_HOME or HOME".to_string(),
                    }
                );
                let t0 = std::time::Instant::now();
                let compiled = self.nvrtc.compile_for(&src, self.target, &options)?;
                eprintln!(
                    "redline: compiled {} in {:.1} s",
                    program.file_name(),
                    t0.elapsed().as_secs_f64()
                );
                let m = load(compiled.image.clone())?;
                // A cache we cannot write is not fatal: we just compile again next run.
                let _ = self.cache.put(&key, &compiled.image);
                m
            }
        };
        if let Some(buf) = crate::trace::buffer() {
            // the probe's buffer into this module's redline_trace_ptr (common.cuh)
            let mut g = module.get_global("redline_trace_ptr", &self.stream)?;
            self.stream.memcpy_htod(&buf.to_le_bytes(), &mut g)?;
        }
        modules.insert(program, module.clone());
        Ok(module)
    }

    /// A kernel by name from `program`.
    pub fn function(&self, program: Program, name: &str) -> Result<CudaFunction> {
        if let Some(f) = self
            .functions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
        {
            return Ok(f.clone());
        }
        let f = self.module(program)?.load_function(name)?;
        self.functions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_string(), f.clone());
        Ok(f)
    }
}

/// The device's own arch if NVRTC supports it, else the newest supported one of the same major
/// (cubins run on later minors of their major).
fn pick_arch(device_arch: u32, sup: &[u32], version: (i32, i32)) -> Result<u32> {
    if sup.is_empty() || sup.contains(&device_arch) {
        return Ok(device_arch);
    }
    sup.iter()
        .copied()
        .filter(|&a| a / 10 == device_arch / 10 && a <= device_arch)
        .max()
        .ok_or_else(|| CudaError::ArchUnsupported {
            version: format!("{}.{}", version.0, version.1),
            arch: device_arch,
            supported: sup.to_vec(),
        })
}

static CPU_FALLBACK_NOTICE: Once = Once::new();

/// Opens the GPU, or says once on stderr "no CUDA device found; running on the CPU" (with the
/// reason) and returns `None`.
pub fn open_or_cpu(opts: &CudaOptions) -> Option<CudaDevice> {
    match CudaDevice::open(opts) {
        Ok(d) => Some(d),
        Err(e) => {
            CPU_FALLBACK_NOTICE
                .call_once(|| eprintln!("no CUDA device found; running on the CPU ({e})"));
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NVRTC13: [u32; 9] = [75, 80, 86, 87, 89, 90, 100, 110, 120];

    #[test]
    fn target_arch_spellings() {
        assert_eq!(parse_target_arch("75"), Some(75));
        assert_eq!(parse_target_arch(" sm_70 "), Some(70));
        assert_eq!(parse_target_arch("compute_80"), Some(80));
        assert_eq!(parse_target_arch(""), None);
        // kept as 0 so that opening the device says what is wrong
        assert_eq!(parse_target_arch("volta"), Some(0));
    }

    #[test]
    fn the_cards_own_arch_is_a_cubin() {
        assert_eq!(
            pick_target(90, None, &NVRTC13, (13, 0)).unwrap(),
            Target::Cubin(90)
        );
        assert_eq!(
            pick_target(90, Some(90), &NVRTC13, (13, 0)).unwrap(),
            Target::Cubin(90)
        );
        // no cubin for sm_91: the newest of its major that NVRTC has
        assert_eq!(
            pick_target(91, None, &NVRTC13, (13, 0)).unwrap(),
            Target::Cubin(90)
        );
        assert!(pick_target(70, None, &NVRTC13, (13, 0)).is_err());
    }

    #[test]
    fn an_older_arch_is_ptx_and_checked() {
        assert_eq!(
            pick_target(90, Some(75), &NVRTC13, (13, 0)).unwrap(),
            Target::Ptx(75)
        );
        assert_eq!(
            pick_target(90, Some(70), &[70, 75, 80, 90], (12, 9)).unwrap(),
            Target::Ptx(70)
        );
        // NVRTC 13 has no compute_70: the message says what to do instead
        let e = pick_target(90, Some(70), &NVRTC13, (13, 0))
            .unwrap_err()
            .to_string();
        assert!(e.contains("use 75"), "{e}");
        // newer than the card, or nonsense
        let e = pick_target(80, Some(90), &NVRTC13, (13, 0))
            .unwrap_err()
            .to_string();
        assert!(e.contains("from 70 up to 80"), "{e}");
        assert!(pick_target(90, Some(0), &NVRTC13, (13, 0)).is_err());
    }
}
