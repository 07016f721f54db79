//! Shared by the GPU timing tests (gpu_matvec, gpu_mmq): event-timed launches.

use cudarc::driver::sys::CUevent_flags;

/// µs a launch of `run(i)`: one warm pass over the `copies` weight copies (so none is timed
/// cold from the first use), then `iters` launches cycling through them (past L2 when the
/// copies together are larger), timed by events on the device's stream.
pub fn time_us(
    dev: &cuda::CudaDevice,
    copies: usize,
    iters: usize,
    mut run: impl FnMut(usize) -> cuda::Result<()>,
) -> cuda::Result<f64> {
    for i in 0..copies {
        run(i)?;
    }
    let flags = Some(CUevent_flags::CU_EVENT_DEFAULT);
    let start = dev.stream().record_event(flags)?;
    for i in 0..iters {
        run(i % copies)?;
    }
    let end = dev.stream().record_event(flags)?;
    Ok(start.elapsed_ms(&end)? as f64 * 1e3 / iters as f64)
}
