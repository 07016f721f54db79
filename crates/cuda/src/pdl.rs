//! Programmatic dependent launch (PDL, sm_90+) for the fused decode kernels: on by default
//! where the driver can record it into graphs (CUDA >= 12.3), `REDLINE_PDL=0` off,
//! `REDLINE_PDL=1` on regardless of the driver version. H200, session 7: tg128 +1.3–2.0 % (32B
//! Q4_K_M) and +2.1 % (27B); the whole `gpu_decode` suite, `backend_models` and serve under
//! load (1 and 8 streams) verified with it on.
//!
//! A kernel launched with the programmatic-stream-serialization attribute may be scheduled
//! while the previous kernel in the stream is still draining; it calls `pdl_wait()`
//! (`griddepcontrol.wait`) before it touches activations. The fused matvecs issue their first
//! group of weight loads before that wait, so a 15–80 MB launch's ramp overlaps the previous
//! kernel's tail (BENCHMARKS.md, matvec v3: launches of that size reach 44–83 % of bandwidth
//! mostly for lack of overlap). The small decode kernels load their weights (norm weights, conv
//! taps, gate biases, f32 rows) before the wait for the same reason: those loads miss L2 (the
//! weight stream evicts them) and cost a DRAM round trip each (session 8: 32B tg128 +5.9 %,
//! 27B +7.7 %). Only kernels whose source has the wait may be launched this way: `mvm_*`,
//! `quantize_q8_1_pdl`, the `mo_*_q8` / `mo_rope_qk` / `mo_matvec_f32_rows` /
//! `mo_group_rms_norm` / `mo_delta_gates` / `mo_kv_store2` / `mo_conv1d_qkv` kernels,
//! `dn_conv1d_*`, `dn_recurrent` (it loads its recurrent state before the wait), and the
//! flash-decode kernels (`fa_decode_d*`, `fa_decode_fused_*`) with their merges.
//! Stream capture records the programmatic edges into the decode-step graph (CUDA >= 12.3).

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};

use cudarc::driver::{sys, CudaFunction, CudaStream, DriverError, LaunchConfig};

static ON: AtomicBool = AtomicBool::new(false);

/// Turns PDL launches of the fused kernels on or off for every device of this process
/// (`CudaBackend` sets it from [`default_on`]); devices below sm_90 never use it.
pub fn set_enabled(on: bool) {
    ON.store(on, Ordering::Relaxed);
}

/// The process default: `REDLINE_PDL` (0 off, 1 on), else on when the CUDA driver is 12.3
/// or newer (stream capture of programmatic edges), off before (or when it cannot say).
pub fn default_on() -> bool {
    match std::env::var("REDLINE_PDL").as_deref() {
        Ok("0") => false,
        Ok("1") => true,
        _ => driver_version().is_some_and(|v| v >= 12030),
    }
}

/// The CUDA driver's version as 1000 * major + 10 * minor (12030 = 12.3), if it says.
fn driver_version() -> Option<i32> {
    let mut v: std::ffi::c_int = 0;
    // SAFETY: called after the driver library was loaded (a device is open); writes one int.
    let r = unsafe { sys::cuDriverGetVersion(&mut v) };
    (r == sys::CUresult::CUDA_SUCCESS).then_some(v)
}

/// Whether launches on a device of compute capability `arch` (e.g. 90) use PDL.
pub fn enabled(arch: u32) -> bool {
    arch >= 90 && ON.load(Ordering::Relaxed)
}

/// Launches `f` on `stream` with `params` (one pointer per kernel parameter, each pointing at
/// the parameter's value), with the programmatic-serialization attribute when `pdl`.
///
/// # Safety
/// `params` must match the kernel's parameter list exactly (count, order, sizes) and every
/// device address in it must be valid for what the kernel reads and writes; with `pdl`, the
/// kernel must call `griddepcontrol.wait` before touching memory that earlier work writes.
pub(crate) unsafe fn launch(
    stream: &CudaStream,
    f: &CudaFunction,
    cfg: LaunchConfig,
    params: &mut [*mut c_void],
    pdl: bool,
) -> Result<(), DriverError> {
    stream.context().bind_to_thread()?;
    // SAFETY: a zeroed attribute is a valid C struct (IGNORE id); the id and value set next.
    let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    let config = sys::CUlaunchConfig {
        gridDimX: cfg.grid_dim.0,
        gridDimY: cfg.grid_dim.1,
        gridDimZ: cfg.grid_dim.2,
        blockDimX: cfg.block_dim.0,
        blockDimY: cfg.block_dim.1,
        blockDimZ: cfg.block_dim.2,
        sharedMemBytes: cfg.shared_mem_bytes,
        hStream: stream.cu_stream(),
        attrs: &mut attr,
        numAttrs: u32::from(pdl),
    };
    // SAFETY: config and attr outlive the call; the caller vouches for f and params.
    unsafe {
        sys::cuLaunchKernelEx(
            &config,
            f.cu_function(),
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    }
    .result()
}

/// A kernel parameter's address as the launch wants it.
pub(crate) fn arg<T>(v: &mut T) -> *mut c_void {
    v as *mut T as *mut c_void
}

/// Kernel parameters by value for a [`launch`]: each scalar or device address is copied into
/// its own 8-byte slot (little-endian, so a 4-byte parameter is the slot's first 4 bytes), a
/// struct into as many 8-byte words as it takes, and a call site lists its arguments once, in
/// the kernel's order.
#[derive(Default)]
pub(crate) struct Args {
    slots: Vec<Box<[u64]>>,
}

impl Args {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Appends one parameter of at most 8 bytes (`i32`, `i64`, `f32`, a device address).
    pub(crate) fn push<T: Copy>(&mut self, v: T) -> &mut Self {
        const { assert!(std::mem::size_of::<T>() <= 8) };
        self.push_struct(v)
    }

    /// Appends one parameter of any size (a `repr(C)` struct of the kernel's layout, aligned
    /// to at most 8 bytes), zero-padded to whole 8-byte words.
    pub(crate) fn push_struct<T: Copy>(&mut self, v: T) -> &mut Self {
        const { assert!(std::mem::align_of::<T>() <= 8) };
        let size = std::mem::size_of::<T>();
        let mut slot = vec![0u64; size.div_ceil(8).max(1)].into_boxed_slice();
        // SAFETY: copies size_of::<T>() bytes of a Copy value into a zeroed buffer of at least
        // that many bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(
                &v as *const T as *const u8,
                slot.as_mut_ptr() as *mut u8,
                size,
            )
        };
        self.slots.push(slot);
        self
    }

    /// Launches `f` with these parameters ([`launch`]).
    ///
    /// # Safety
    /// As [`launch`]: the pushed values must match the kernel's parameter list exactly
    /// (count, order, sizes) and every device address must be valid for what the kernel does.
    pub(crate) unsafe fn launch(
        &mut self,
        stream: &CudaStream,
        f: &CudaFunction,
        cfg: LaunchConfig,
        pdl: bool,
    ) -> Result<(), DriverError> {
        let mut params: Vec<*mut c_void> = self
            .slots
            .iter_mut()
            .map(|s| s.as_mut_ptr() as *mut c_void)
            .collect();
        // SAFETY: the caller's contract; the slots outlive the call.
        unsafe { launch(stream, f, cfg, &mut params, pdl) }
    }
}

#[cfg(test)]
mod tests {
    use super::Args;

    #[test]
    fn args_put_each_value_at_the_start_of_its_slot() {
        let mut a = Args::new();
        a.push(-2i32)
            .push(1.5f32)
            .push(0x1122_3344_5566_7788u64)
            .push(-3i64);
        assert_eq!(a.slots.len(), 4);
        assert_eq!(a.slots[0][0] as u32 as i32, -2);
        assert_eq!(a.slots[0][0] >> 32, 0);
        assert_eq!(f32::from_bits(a.slots[1][0] as u32), 1.5);
        assert_eq!(a.slots[2][..], [0x1122_3344_5566_7788]);
        assert_eq!(a.slots[3][0] as i64, -3);
    }

    #[test]
    fn args_copy_a_struct_into_whole_words() {
        // (no padding: a struct's padding bytes are copied as they are, never read here)
        #[repr(C)]
        #[derive(Clone, Copy)]
        struct S {
            a: u64,
            b: i32,
            c: i32,
            d: u32,
            e: u32,
        }
        let mut a = Args::new();
        a.push_struct(S {
            a: 7,
            b: -1,
            c: 2,
            d: 3,
            e: 4,
        })
        .push(5i32);
        assert_eq!(a.slots.len(), 2);
        assert_eq!(a.slots[0].len(), 3);
        assert_eq!(a.slots[0][0], 7);
        assert_eq!(a.slots[0][1] as u32 as i32, -1);
        assert_eq!((a.slots[0][1] >> 32) as i32, 2);
        assert_eq!(a.slots[0][2], 4 << 32 | 3);
        assert_eq!(a.slots[1][..], [5]);
    }
}
