//! The next products' weights toward L2 while a layer's dependent small ops run (issue #4).
//!
//! Between a layer's in-projection and its out-projection the DRAM idles: the conv, the delta
//! rule and the gated norm (or the attention chain) are short dependent launches that read
//! little. The model names the weights the coming products read ([`backend::Backend::prefetch`]);
//! when the next op is one that takes the hint (the fused conv chain, the fused one-row
//! attention chain, the layer's first norm), it forks a side stream right before its own
//! launch and runs `mo_l2_prefetch` there: sm_90 bulk L2 prefetches of the first bytes of those
//! weights, spread over many blocks. Nothing in the step waits for the side stream (it is
//! joined when a recorded segment or the step ends), so the chain runs on while the bytes move,
//! and the out-projection (and the start of gate/up) reads from L2. A hint no op takes is
//! dropped: the op right after it must take it.
//!
//! Session 34 first issued the prefetches from the chain's own kernels: a grid is done only
//! once its bulk prefetches have landed, and one SM's engine moves a few hundred GB/s, so the
//! chain waited for them (27B −9 %, BENCHMARKS.md). Hence the side stream.
//!
//! `REDLINE_L2_PREFETCH=MiB` sets the most bytes a hint moves (`1`: 24 MiB, `0` or unset:
//! off); sm_90 only (the instruction; the V100's 6 MB L2 would not hold an out-projection).
//! Only inside a decode step (eager or recorded), never in a replay (the graph has it).

use std::sync::atomic::Ordering;

use backend::BackendError;

use cudarc::driver::LaunchConfig;

use super::step::{dev_ptr, Mode};
use super::{dev_err, CudaBackend, CudaWeight};
use crate::pdl;

/// Up to two byte ranges to prefetch (kernel arguments p0, n0, p1, n1; zero lengths: none).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct PfRanges {
    pub p0: u64,
    pub n0: u64,
    pub p1: u64,
    pub n1: u64,
}

/// A hint waiting for the op after it: the op count when it was given, its ranges.
#[derive(Debug, Default)]
pub(super) struct Pending {
    at_op: u64,
    ranges: PfRanges,
}

/// Bytes of one bulk prefetch (kernels/common.cuh `l2_prefetch2`).
const PIECE: u64 = 32768;

/// MiB a hint moves with `REDLINE_L2_PREFETCH=1`.
const DEFAULT_MIB: usize = 24;

/// The byte budget of one hint from `REDLINE_L2_PREFETCH` on an `arch` card: 0 is off.
pub(super) fn budget_from_env(arch: u32) -> usize {
    let mib = match std::env::var("REDLINE_L2_PREFETCH").as_deref() {
        Ok("1") => DEFAULT_MIB,
        Ok(v) => v.trim().parse().unwrap_or(0),
        Err(_) => 0,
    };
    if arch >= 90 {
        mib.saturating_mul(1 << 20)
    } else {
        0
    }
}

/// The first `budget` bytes of the `(address, length)` ranges in order, as at most two
/// ranges of whole 16-byte units (the bulk prefetch's size rule).
pub(super) fn plan(ranges: &[(u64, u64)], budget: u64) -> PfRanges {
    let mut out = [(0u64, 0u64); 2];
    let mut left = budget;
    for (slot, &(p, n)) in out.iter_mut().zip(ranges) {
        let take = n.min(left) & !15;
        if take == 0 || p % 16 != 0 {
            break;
        }
        *slot = (p, take);
        left -= take;
    }
    PfRanges {
        p0: out[0].0,
        n0: out[0].1,
        p1: out[1].0,
        n1: out[1].1,
    }
}

impl CudaBackend {
    /// Sets the bytes one prefetch hint moves toward L2 (0: off; what `REDLINE_L2_PREFETCH`
    /// sets at open). Below sm_90 it stays off.
    pub fn set_l2_prefetch(&self, bytes: usize) {
        let on = if self.dev.arch() >= 90 { bytes } else { 0 };
        self.l2pf_budget.store(on, Ordering::Relaxed);
    }

    fn l2pf_budget(&self) -> usize {
        self.l2pf_budget.load(Ordering::Relaxed)
    }

    /// [`backend::Backend::prefetch`]: remembers the ranges for the next op.
    pub(super) fn prefetch_hint(&self, weights: &[&CudaWeight]) -> Result<(), BackendError> {
        if self.l2pf_budget() == 0 || self.replaying() {
            return Ok(());
        }
        let stream = self.dev.stream();
        let ranges: Vec<(u64, u64)> = weights
            .iter()
            .map_while(|w| w.matrix.as_ref())
            .map(|m| (dev_ptr(&m.data, stream), m.data.len() as u64))
            .collect();
        let mut p = self.l2pf.lock().unwrap_or_else(|e| e.into_inner());
        *p = Pending {
            at_op: self.ops.load(Ordering::Relaxed),
            ranges: plan(&ranges, self.l2pf_budget() as u64),
        };
        Ok(())
    }

    /// The ranges of a hint given right before the running op (none otherwise), cut to their
    /// first `cap` bytes (an op with a short gap after it); taken once.
    fn take_prefetch(&self, cap: u64) -> PfRanges {
        if self.l2pf_budget() == 0 {
            return PfRanges::default();
        }
        let mut p = self.l2pf.lock().unwrap_or_else(|e| e.into_inner());
        if p.at_op + 1 != self.ops.load(Ordering::Relaxed) {
            return PfRanges::default();
        }
        let r = std::mem::take(&mut p.ranges);
        plan(&[(r.p0, r.n0), (r.p1, r.n1)], cap)
    }

    /// Moves a hint given right before the running op on to the op after it: for a call that
    /// runs another op before the hinted one (`in_proj_conv1d_qkv`'s products before its conv).
    pub(super) fn pass_prefetch_on(&self) {
        if self.l2pf_budget() == 0 {
            return;
        }
        let ops = self.ops.load(Ordering::Relaxed);
        let mut p = self.l2pf.lock().unwrap_or_else(|e| e.into_inner());
        if p.at_op + 1 == ops {
            p.at_op = ops;
        }
    }

    /// Runs a hint given right before the running op (cut to `cap` bytes) on the side stream,
    /// forked here: call it right before the op's own launch, after the replay check.
    pub(super) fn issue_prefetch(&self, cap: u64) -> Result<(), BackendError> {
        let pf = self.take_prefetch(cap);
        if pf.n0 == 0 || !matches!(self.mode(), Mode::Eager | Mode::Capture) {
            return Ok(());
        }
        let f = self.function("mo_l2_prefetch")?;
        let pieces = (pf.n0.div_ceil(PIECE) + pf.n1.div_ceil(PIECE)) as u32;
        let sms = self.dev.info().sm_count.max(1) as u32;
        let cfg = LaunchConfig {
            grid_dim: (pieces.min(2 * sms), 1, 1),
            block_dim: (32, 1, 1),
            shared_mem_bytes: 0,
        };
        let stream = self.dev.stream();
        let side = self.step_ctl().fork_side(stream)?;
        let mut a = pdl::Args::new();
        a.push(pf.p0).push(pf.n0).push(pf.p1).push(pf.n1);
        // SAFETY: matches mo_l2_prefetch(p0, n0, p1, n1): device weights (plan: 16-byte
        // aligned starts, whole 16-byte units) or empty ranges; it only issues prefetches.
        unsafe { a.launch(&side, &f, cfg, false) }.map_err(dev_err)
    }

    /// Bytes the first norm of a layer moves toward L2 of the layer's first product
    /// (`REDLINE_L2_PREFETCH_NORM=MiB`, default 0: the norm is a ~2 µs gap, and the product's
    /// own kernel starts its loads before its wait).
    pub(super) fn norm_prefetch_cap(&self) -> u64 {
        static MIB: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
        *MIB.get_or_init(|| {
            std::env::var("REDLINE_L2_PREFETCH_NORM")
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0u64)
                .saturating_mul(1 << 20)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_takes_the_budget_in_order_in_16_byte_units() {
        let r = plan(&[(4096, 1000), (8192, 100_000)], 5000);
        assert_eq!(
            r,
            PfRanges {
                p0: 4096,
                n0: 992,
                p1: 8192,
                n1: 4000
            }
        );
        // the first range alone fills the budget
        let r = plan(&[(4096, 1 << 20), (8192, 1 << 20)], 4096);
        assert_eq!((r.n0, r.p1, r.n1), (4096, 0, 0));
        // an unaligned start stops the plan
        let r = plan(&[(4100, 1 << 20)], 4096);
        assert_eq!(r, PfRanges::default());
        assert_eq!(plan(&[], 1 << 20), PfRanges::default());
    }
}
