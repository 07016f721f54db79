//! AVX-512 VNNI kernels over one 16-row interleaved group (layouts in `mod.rs`) and
//! 1..=[`MAX_T`] tokens.
//!
//! In every kernel a zmm of weights holds 4 consecutive unsigned weights of each of the 16
//! rows (row r in i32 lane r); `vpdpbusd` with the token's 4 activation bytes broadcast
//! adds their 4 products into lane r. The weights are unpacked to bytes once per block and
//! reused for all `T` tokens; the accumulators start at the token's precomputed offset sum
//! (−8 Σq for Q4_0, −32 Σq for Q6_K) so the offsets cost nothing per token. Block scales
//! of the 16 rows are one vector (`vcvtph2ps`), sub-block scales multiply the integer sums
//! (`vpmulld`), and the 16 results of a token are stored with one store.

use super::{Tok, MAX_T};
use gguf::GgmlType;
use std::arch::x86_64::*;

/// 4 activation bytes at `p` in every i32 lane.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn bcast4(p: *const i8) -> __m512i {
    // SAFETY: the caller passes a pointer to 4 readable bytes.
    _mm512_set1_epi32(unsafe { p.cast::<i32>().read_unaligned() })
}

#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn ld(p: *const u8) -> __m512i {
    // SAFETY: the caller passes a pointer to 64 readable bytes.
    unsafe { _mm512_loadu_si512(p.cast()) }
}

/// 16 f16 at `p` as f32.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn ld_f16x16(p: *const u8) -> __m512 {
    // SAFETY: the caller passes a pointer to 32 readable bytes.
    _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(p.cast()) })
}

/// Runs the kernel of `ty` on the group at `w` (`nb` blocks / super-blocks) for the
/// tokens `tok[..nt]`, storing 16 f32 at `out[i]` for token `i`.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI present; `w` points to one whole packed group of `nb` units;
/// each `tok[..nt]` points into activations prepared for `ty` with `nb * block_size`
/// columns; `1 <= nt <= MAX_T`; `out[..nt]` each valid for 16 f32 writes.
pub(super) unsafe fn group(
    ty: GgmlType,
    w: *const u8,
    nb: usize,
    tok: &[Tok; MAX_T],
    nt: usize,
    out: &[*mut f32; MAX_T],
) {
    macro_rules! go {
        ($k:ident) => {
            // SAFETY: forwarded from this function's contract.
            unsafe {
                match nt {
                    1 => $k::<1>(w, nb, tok, out),
                    2 => $k::<2>(w, nb, tok, out),
                    3 => $k::<3>(w, nb, tok, out),
                    4 => $k::<4>(w, nb, tok, out),
                    5 => $k::<5>(w, nb, tok, out),
                    6 => $k::<6>(w, nb, tok, out),
                    7 => $k::<7>(w, nb, tok, out),
                    8 => $k::<8>(w, nb, tok, out),
                    _ => unreachable!("tile of {nt} tokens"),
                }
            }
        };
    }
    match ty {
        GgmlType::Q4_0 => go!(q4_0),
        GgmlType::Q8_0 => go!(q8_0),
        GgmlType::Q4K => go!(q4_k),
        GgmlType::Q6K => go!(q6_k),
        _ => unreachable!("no packed kernel for {ty}"),
    }
}

/// Q4_0 group · T Q8_0 rows. Block b: f16 scales at `576 (b/2) + 32 (b%2)`, quants at
/// `576 (b/2) + 64 + 256 (b%2)` (chunk k: bytes 4k..4k+4 of each row, low nibbles =
/// elements 4k.., high = 16 + 4k..).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn q4_0<const T: usize>(
    w: *const u8,
    nb: usize,
    tok: &[Tok; MAX_T],
    out: &[*mut f32; MAX_T],
) {
    let m4 = _mm512_set1_epi8(0x0f);
    let mut acc = [_mm512_setzero_ps(); T];
    // SAFETY (whole body): offsets stay inside the group of nb × 288 bytes and inside each
    // token's nb × 32 activations, nb scales and nb sums (the caller's contract).
    unsafe {
        for b in 0..nb {
            // Blocks in pairs of 576 bytes: both scales, then both blocks' quants (one
            // sequential stream; separate scale and quant regions streamed ~2x slower).
            let pair = w.add(576 * (b / 2));
            let q = pair.add(64 + 256 * (b % 2));
            let raw: [__m512i; 4] = std::array::from_fn(|k| ld(q.add(64 * k)));
            let lo = raw.map(|c| _mm512_and_si512(c, m4));
            let hi = raw.map(|c| _mm512_and_si512(_mm512_srli_epi16::<4>(c), m4));
            let dw = ld_f16x16(pair.add(32 * (b % 2)));
            for t in 0..T {
                let a = tok[t].qs.add(32 * b);
                let mut s = _mm512_set1_epi32(*tok[t].sums.add(b));
                for k in 0..4 {
                    s = _mm512_dpbusd_epi32(s, lo[k], bcast4(a.add(4 * k)));
                    s = _mm512_dpbusd_epi32(s, hi[k], bcast4(a.add(16 + 4 * k)));
                }
                let dd = _mm512_mul_ps(dw, _mm512_set1_ps(*tok[t].d.add(b)));
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), dd, acc[t]);
            }
        }
        for t in 0..T {
            _mm512_storeu_ps(out[t], acc[t]);
        }
    }
}

/// Q8_0 group · T Q8_0 rows. Block b: f16 scales at `1088 (b/2) + 32 (b%2)`, quants at
/// `1088 (b/2) + 64 + 512 (b%2)` (chunk k: bytes 4k..4k+4 of each row). The weights are made unsigned (w + 128, by
/// flipping the sign bit) for `vpdpbusd`; the token's sum −128 Σa takes the 128 off.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn q8_0<const T: usize>(
    w: *const u8,
    nb: usize,
    tok: &[Tok; MAX_T],
    out: &[*mut f32; MAX_T],
) {
    let flip = _mm512_set1_epi8(i8::MIN);
    let mut acc = [_mm512_setzero_ps(); T];
    // SAFETY (whole body): offsets stay inside the group of nb × 544 bytes and inside each
    // token's nb × 32 activations, nb scales and nb sums.
    unsafe {
        for b in 0..nb {
            // Blocks in pairs of 1088 bytes: both scales, then both blocks' quants.
            let pair = w.add(1088 * (b / 2));
            let q = pair.add(64 + 512 * (b % 2));
            let wu: [__m512i; 8] =
                std::array::from_fn(|k| _mm512_xor_si512(ld(q.add(64 * k)), flip));
            let dw = ld_f16x16(pair.add(32 * (b % 2)));
            for t in 0..T {
                let a = tok[t].qs.add(32 * b);
                let mut s = _mm512_set1_epi32(*tok[t].sums.add(b));
                for (k, wk) in wu.iter().enumerate() {
                    s = _mm512_dpbusd_epi32(s, *wk, bcast4(a.add(4 * k)));
                }
                let dd = _mm512_mul_ps(dw, _mm512_set1_ps(*tok[t].d.add(b)));
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), dd, acc[t]);
            }
        }
        for t in 0..T {
            _mm512_storeu_ps(out[t], acc[t]);
        }
    }
}

/// Q4_K group · T Q8_K rows. Super-block b at `2368 b`: d, dmin (16 f16 each), scales
/// `[8][16]` u8 at 64, mins `[4][16][2]` u8 at 192, quant chunks at 320 (chunk j = bytes
/// 4j..4j+4 of each row's qs: low nibbles in sub-block 2(j/8), high in 2(j/8)+1).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn q4_k<const T: usize>(
    w: *const u8,
    nb: usize,
    tok: &[Tok; MAX_T],
    out: &[*mut f32; MAX_T],
) {
    let m4 = _mm512_set1_epi8(0x0f);
    let mut acc = [_mm512_setzero_ps(); T];
    // SAFETY (whole body): offsets stay inside the group's nb super-blocks and each
    // token's nb × 256 activations, nb scales and 4 nb sums.
    unsafe {
        for b in 0..nb {
            let u = w.add(2368 * b);
            // Per token: Σ_s scale_s · dot_s in f32 (scaled in the FP pipes: vpmulld is
            // 2 µops on Zen 4; terms ≤ 63 · 61k, exact in f32).
            let mut fsum = [_mm512_setzero_ps(); T];
            for s in 0..8 {
                let sc = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(
                    u.add(64 + 16 * s).cast(),
                )));
                let chunks = u.add(320 + 64 * 8 * (s / 2));
                let q: [__m512i; 8] = std::array::from_fn(|i| {
                    let raw = ld(chunks.add(64 * i));
                    if s % 2 == 0 {
                        _mm512_and_si512(raw, m4)
                    } else {
                        _mm512_and_si512(_mm512_srli_epi16::<4>(raw), m4)
                    }
                });
                for t in 0..T {
                    let a = tok[t].qs.add(256 * b + 32 * s);
                    let mut p = _mm512_setzero_si512();
                    for (i, qi) in q.iter().enumerate() {
                        p = _mm512_dpbusd_epi32(p, *qi, bcast4(a.add(4 * i)));
                    }
                    fsum[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), sc, fsum[t]);
                }
            }
            let dw = ld_f16x16(u);
            let dmin = ld_f16x16(u.add(32));
            let mins: [__m512i; 4] = std::array::from_fn(|k| {
                _mm512_cvtepu8_epi16(_mm256_loadu_si256(u.add(192 + 32 * k).cast()))
            });
            for t in 0..T {
                let sums = tok[t].sums.add(4 * b);
                let mut m = _mm512_setzero_si512();
                for (k, mk) in mins.iter().enumerate() {
                    m = _mm512_dpwssd_epi32(m, *mk, _mm512_set1_epi32(*sums.add(k)));
                }
                let dy = _mm512_set1_ps(*tok[t].d.add(b));
                acc[t] = _mm512_fmadd_ps(fsum[t], _mm512_mul_ps(dw, dy), acc[t]);
                acc[t] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(m), _mm512_mul_ps(dmin, dy), acc[t]);
            }
        }
        for t in 0..T {
            _mm512_storeu_ps(out[t], acc[t]);
        }
    }
}

/// Q6_K group · T Q8_K rows. Super-block b at `3392 b`: 16 f16 d at 0, scales `[16][16]`
/// i8 at 64, then for each quarter q = 2h + lh (h = half of ggml's loop, lh = which 16 of
/// its 32 l) 12 chunks at `320 + 768 q`: 4 of `ql` for the even quarters m (low nibbles for
/// m = 0, high for m = 2), 4 for the odd ones, 4 of `qh` (bits 2m..2m+2 for each m).
/// Sub-block s = 8h + 2m + lh covers elements 16s..16s+16. Each quarter's 12 lines are
/// loaded once, in address order, and serve 4 sub-blocks (reading them once per sub-block
/// in ggml's order streamed at half the speed from L3/DRAM).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn q6_k<const T: usize>(
    w: *const u8,
    nb: usize,
    tok: &[Tok; MAX_T],
    out: &[*mut f32; MAX_T],
) {
    let m4 = _mm512_set1_epi8(0x0f);
    let m30 = _mm512_set1_epi8(0x30);
    let mut acc = [_mm512_setzero_ps(); T];
    // SAFETY (whole body): offsets stay inside the group's nb super-blocks and each
    // token's nb × 256 activations, nb scales and 16 nb sums.
    unsafe {
        for b in 0..nb {
            let u = w.add(3392 * b);
            // Per token: Σ_s scale_s · (dot_s − 32 Σa_s), in f32 (exact below 2^24 per
            // term; |term| ≤ 128 · 200k).
            let mut fsum = [_mm512_setzero_ps(); T];
            for q in 0..4 {
                let (h, lh) = (q / 2, q % 2);
                let base = u.add(320 + 768 * q);
                let ra: [__m512i; 4] = std::array::from_fn(|i| ld(base.add(64 * i)));
                let rb: [__m512i; 4] = std::array::from_fn(|i| ld(base.add(256 + 64 * i)));
                let rh: [__m512i; 4] = std::array::from_fn(|i| ld(base.add(512 + 64 * i)));
                for m in 0..4 {
                    let s = 8 * h + 2 * m + lh;
                    // vpmulld is slow (Zen 4: 2 µops); the scale is applied in the FP pipes.
                    let sc = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
                        u.add(64 + 16 * s).cast(),
                    )));
                    let qv: [__m512i; 4] = std::array::from_fn(|i| {
                        let ql = if m & 1 == 0 { ra[i] } else { rb[i] };
                        let lo = if m >= 2 {
                            _mm512_srli_epi16::<4>(ql)
                        } else {
                            ql
                        };
                        // Bits 2m, 2m+1 of qh to bits 4, 5.
                        let hi = match m {
                            0 => _mm512_slli_epi16::<4>(rh[i]),
                            1 => _mm512_slli_epi16::<2>(rh[i]),
                            2 => rh[i],
                            _ => _mm512_srli_epi16::<2>(rh[i]),
                        };
                        // (lo & 0x0f) | (hi & 0x30)
                        _mm512_ternarylogic_epi32::<0xEA>(lo, m4, _mm512_and_si512(hi, m30))
                    });
                    for t in 0..T {
                        let a = tok[t].qs.add(256 * b + 16 * s);
                        let mut p = _mm512_set1_epi32(*tok[t].sums.add(16 * b + s));
                        for (i, qi) in qv.iter().enumerate() {
                            p = _mm512_dpbusd_epi32(p, *qi, bcast4(a.add(4 * i)));
                        }
                        fsum[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), sc, fsum[t]);
                    }
                }
            }
            let dw = ld_f16x16(u);
            for t in 0..T {
                let dd = _mm512_mul_ps(dw, _mm512_set1_ps(*tok[t].d.add(b)));
                acc[t] = _mm512_fmadd_ps(fsum[t], dd, acc[t]);
            }
        }
        for t in 0..T {
            _mm512_storeu_ps(out[t], acc[t]);
        }
    }
}
