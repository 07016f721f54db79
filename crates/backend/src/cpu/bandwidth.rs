//! Achievable host-memory read bandwidth with the backend's thread count: the CPU roofline
//! that `redline bench` reports decode speeds against (the GPU's is `cuda::bandwidth`).
//!
//! Each of `n_threads` threads sums its own contiguous share of a buffer several times the
//! size of the last-level cache, the way a decode step streams its weights: one pass over
//! memory no cache can hold. The first pass (page faults, first touch) is not timed.

use std::time::Instant;

/// Sums `words` in eight independent lanes so the loop is a stream of wide loads, not a chain
/// of dependent adds (the compiler vectorizes it).
fn sum_words(words: &[u64]) -> u64 {
    let mut lanes = [0u64; 8];
    let mut chunks = words.chunks_exact(8);
    for c in &mut chunks {
        for (l, w) in lanes.iter_mut().zip(c) {
            *l = l.wrapping_add(*w);
        }
    }
    let tail = chunks
        .remainder()
        .iter()
        .fold(0u64, |a, w| a.wrapping_add(*w));
    lanes.iter().fold(tail, |a, l| a.wrapping_add(*l))
}

/// Reads a `bytes`-sized buffer with `n_threads` threads (0: one per core) `passes` times after
/// a warm-up pass and returns the median GB/s (1e9 bytes per second).
pub fn measure_read_bandwidth(n_threads: usize, bytes: usize, passes: usize) -> f64 {
    let n_threads = match n_threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    let per_thread = (bytes / 8).div_ceil(n_threads).max(8);
    // Each thread fills its own share, so first-touch places its pages where it runs.
    let mut buf = vec![0u64; per_thread * n_threads];
    std::thread::scope(|s| {
        for (i, part) in buf.chunks_mut(per_thread).enumerate() {
            s.spawn(move || {
                for (j, w) in part.iter_mut().enumerate() {
                    *w = ((i * per_thread + j) as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                }
            });
        }
    });
    let mut times = Vec::with_capacity(passes);
    let mut check = 0u64;
    for pass in 0..=passes.max(1) {
        let t = Instant::now();
        let sums: Vec<u64> = std::thread::scope(|s| {
            let handles: Vec<_> = buf
                .chunks(per_thread)
                .map(|part| s.spawn(move || sum_words(part)))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap_or(0)).collect()
        });
        let secs = t.elapsed().as_secs_f64();
        check = sums.iter().fold(check, |a, x| a.wrapping_add(*x));
        if pass > 0 {
            times.push(secs);
        }
    }
    // Keep the sums observable so the reads cannot be optimized away.
    std::hint::black_box(check);
    times.sort_by(|a, b| a.total_cmp(b));
    let secs = times[times.len() / 2].max(1e-9);
    (buf.len() * 8) as f64 / secs / 1e9
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_every_word() {
        let words: Vec<u64> = (1..=21).collect();
        assert_eq!(sum_words(&words), 21 * 22 / 2);
        assert_eq!(sum_words(&[]), 0);
        assert_eq!(sum_words(&[u64::MAX, 2]), 1);
    }

    #[test]
    fn measures_a_positive_finite_rate() {
        let gbs = measure_read_bandwidth(2, 4 << 20, 3);
        assert!(gbs.is_finite() && gbs > 0.0, "{gbs}");
    }
}
