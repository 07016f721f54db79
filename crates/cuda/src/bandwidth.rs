//! Achievable device-memory read bandwidth, measured with kernels/bandwidth.cu: the roofline
//! that matvec speeds are reported against.

use crate::device::CudaDevice;
use crate::error::Result;
use crate::sources::Program;
use cudarc::driver::{sys::CUevent_flags, LaunchConfig, PushKernelArg};

/// Reads a `bytes`-sized buffer (filled with a non-zero pattern) `iters` times after a warm-up
/// and returns the median GB/s (1e9 bytes per second).
pub fn measure_read_bandwidth(dev: &CudaDevice, bytes: usize, iters: usize) -> Result<f64> {
    let n16 = bytes / 16;
    let stream = dev.stream();
    let mut buf = stream.alloc_zeros::<u8>(n16 * 16)?;
    // Fill with a pattern: upload one chunk, then device-to-device copies of it.
    let chunk = (64usize << 20).min(n16 * 16);
    let pattern: Vec<u8> = (0..chunk)
        .map(|i| (i as u32).wrapping_mul(2654435761).to_le_bytes()[3])
        .collect();
    let mut off = 0;
    while off < n16 * 16 {
        let len = chunk.min(n16 * 16 - off);
        stream.memcpy_htod(&pattern[..len], &mut buf.slice_mut(off..off + len))?;
        off += len;
    }
    let blocks = dev.info().sm_count.max(1) as u32 * 8;
    let mut out = stream.alloc_zeros::<u32>(blocks as usize)?;
    let f = dev.function(Program::Bandwidth, "bandwidth_read")?;
    let cfg = LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    let n = n16 as i64;
    let mut times = Vec::with_capacity(iters);
    for i in 0..iters + 2 {
        let start = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        let mut b = stream.launch_builder(&f);
        b.arg(&buf).arg(&n).arg(&mut out);
        // SAFETY: matches bandwidth_read(p, n16, out); buf holds n16 vectors, out `blocks` words.
        unsafe { b.launch(cfg) }?;
        let end = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        let ms = start.elapsed_ms(&end)? as f64;
        if i >= 2 {
            times.push(ms);
        }
    }
    times.sort_by(|a, b| a.total_cmp(b));
    let ms = times[times.len() / 2];
    Ok((n16 * 16) as f64 / (ms * 1e-3) / 1e9)
}
