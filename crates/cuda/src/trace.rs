//! Block timeline of one recorded decode step (`REDLINE_TRACE=FILE`, a kernel developer's
//! knob; `REDLINE_TRACE_STEP=N` picks the replay, default 16).
//!
//! Why: the step's gaps (launch ramps, dependent round trips, what a kernel's pre-wait work
//! overlaps) are not visible in per-op event timings, which serialize the ops, nor in ncu, which
//! replays each kernel alone; and this workplace's machines have no Nsight Systems. So the
//! kernels carry their own probe: with the variable set, every program is compiled with
//! `#define REDLINE_TRACE` (kernels/common.cuh: thread 0 of each block of the instrumented
//! kernels writes its start, the return of its PDL wait and its end, in `%globaltimer`
//! nanoseconds, into a per-multiprocessor region of one device buffer). The buffer is
//! allocated when the device opens; each loaded module gets its address in
//! `redline_trace_ptr`; the step controller zeroes the counters before the chosen replay and
//! writes the records to FILE after it (`scripts/trace-summary.py` reads them).
//!
//! File layout (little-endian): `b"RLTRACE1"`, u32 SMs, u32 records per SM, then per SM a u32
//! count and `min(count, cap)` records of two u64: the time, and `tag | event << 8 | block << 16
//! | grid << 40` (tags and events: common.cuh `TRACE_*`).

use std::path::PathBuf;
use std::sync::OnceLock;

/// Must match common.cuh (`TRACE_SMS`, `TRACE_CAP`, `TRACE_HEADER_WORDS`).
pub const SMS: usize = 256;
pub const CAP: usize = 32768;
pub const HEADER_WORDS: usize = 128;

/// Bytes of the device buffer: the counters, then `SMS * CAP` records of 16 bytes.
pub fn buffer_bytes() -> usize {
    HEADER_WORDS * 8 + SMS * CAP * 16
}

pub struct TraceConfig {
    pub path: PathBuf,
    /// Which replay (counted from 1) is traced.
    pub step: u64,
}

/// The trace request from the environment, read once.
pub fn config() -> Option<&'static TraceConfig> {
    static CFG: OnceLock<Option<TraceConfig>> = OnceLock::new();
    CFG.get_or_init(|| {
        let path = PathBuf::from(std::env::var_os("REDLINE_TRACE").filter(|v| !v.is_empty())?);
        let step = std::env::var("REDLINE_TRACE_STEP")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(16)
            .max(1);
        eprintln!(
            "REDLINE_TRACE={}: kernels compiled with the block-timeline probe; replay {step} is \
             written there",
            path.display()
        );
        Some(TraceConfig { path, step })
    })
    .as_ref()
}

/// The device buffer's address (0: none), set once by the device that allocated it.
static BUFFER: OnceLock<u64> = OnceLock::new();

pub(crate) fn set_buffer(ptr: u64) {
    let _ = BUFFER.set(ptr);
}

pub(crate) fn buffer() -> Option<u64> {
    BUFFER.get().copied().filter(|&p| p != 0)
}

/// Reads the records of the traced step (the stream has finished it) and writes the file.
pub(crate) fn dump(buf: u64) -> std::io::Result<usize> {
    let Some(cfg) = config() else { return Ok(0) };
    let mut counts = vec![0u32; SMS];
    let err = |e: cudarc::driver::DriverError| std::io::Error::other(format!("{e:?}"));
    // SAFETY: buf is the live device buffer of buffer_bytes() bytes (set_buffer), and the
    // stream that wrote it has been synchronized.
    unsafe { cudarc::driver::result::memcpy_dtoh_sync(&mut counts, buf) }.map_err(err)?;
    let mut out = Vec::with_capacity(16 + 4 * SMS);
    out.extend_from_slice(b"RLTRACE1");
    out.extend_from_slice(&(SMS as u32).to_le_bytes());
    out.extend_from_slice(&(CAP as u32).to_le_bytes());
    let mut total = 0;
    for (sm, &c) in counts.iter().enumerate() {
        out.extend_from_slice(&c.to_le_bytes());
        let n = (c as usize).min(CAP);
        if n == 0 {
            continue;
        }
        let mut recs = vec![0u64; 2 * n];
        let at = buf + (HEADER_WORDS * 8 + sm * CAP * 16) as u64;
        // SAFETY: as above; the range lies inside SM `sm`'s region.
        unsafe { cudarc::driver::result::memcpy_dtoh_sync(&mut recs, at) }.map_err(err)?;
        for r in recs {
            out.extend_from_slice(&r.to_le_bytes());
        }
        total += n;
    }
    std::fs::write(&cfg.path, out)?;
    Ok(total)
}
