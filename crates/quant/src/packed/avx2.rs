//! AVX2 kernels over one 16-row interleaved group (layouts in `mod.rs`), for x86-64 CPUs
//! without AVX-512 VNNI. Same layout as the AVX-512 kernels; a ymm holds 4 weights of 8
//! rows, so each group is done as two halves of 8 rows (bytes 0..32 and 32..64 of every
//! 64-byte chunk). Without `vpdpbusd`, products are `vpmaddubsw` (u8 × i8 → i16 pairs,
//! which cannot saturate here: |pair| ≤ 2 · 63 · 128 = 16128) summed in i16 while they fit,
//! then widened by `vpmaddwd` — against ones, or against the sub-block scale, which
//! applies it for free.

use super::{Tok, MAX_T};
use gguf::GgmlType;
use std::arch::x86_64::*;

#[inline]
#[target_feature(enable = "avx2")]
unsafe fn bcast4(p: *const i8) -> __m256i {
    // SAFETY: the caller passes a pointer to 4 readable bytes.
    _mm256_set1_epi32(unsafe { p.cast::<i32>().read_unaligned() })
}

#[inline]
#[target_feature(enable = "avx2")]
unsafe fn ld(p: *const u8) -> __m256i {
    // SAFETY: the caller passes a pointer to 32 readable bytes.
    unsafe { _mm256_loadu_si256(p.cast()) }
}

#[inline]
#[target_feature(enable = "avx2")]
unsafe fn ld16(p: *const u8) -> __m128i {
    // SAFETY: the caller passes a pointer to 16 readable bytes.
    unsafe { _mm_loadu_si128(p.cast()) }
}

#[inline]
#[target_feature(enable = "avx2")]
unsafe fn ld8(p: *const u8) -> __m128i {
    // SAFETY: the caller passes a pointer to 8 readable bytes.
    _mm_cvtsi64_si128(unsafe { p.cast::<i64>().read_unaligned() })
}

/// 8 f16 at `p` as f32.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn ld_f16x8(p: *const u8) -> __m256 {
    // SAFETY: the caller passes a pointer to 16 readable bytes.
    _mm256_cvtph_ps(unsafe { ld16(p) })
}

/// As `avx512::group`, on AVX2 + FMA + F16C.
///
/// # Safety
/// AVX2, FMA and F16C present; otherwise as `avx512::group`.
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
                for half in 0..2 {
                    match nt {
                        1 => $k::<1>(w, nb, half, tok, out),
                        2 => $k::<2>(w, nb, half, tok, out),
                        3 => $k::<3>(w, nb, half, tok, out),
                        4 => $k::<4>(w, nb, half, tok, out),
                        5 => $k::<5>(w, nb, half, tok, out),
                        6 => $k::<6>(w, nb, half, tok, out),
                        7 => $k::<7>(w, nb, half, tok, out),
                        8 => $k::<8>(w, nb, half, tok, out),
                        _ => unreachable!("tile of {nt} tokens"),
                    }
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

/// Rows `8 half..8 half + 8` of a Q4_0 group · T Q8_0 rows.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_0<const T: usize>(
    w: *const u8,
    nb: usize,
    half: usize,
    tok: &[Tok; MAX_T],
    out: &[*mut f32; MAX_T],
) {
    let m4 = _mm256_set1_epi8(0x0f);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); T];
    // SAFETY (whole body): as `avx512::q4_0`, reading the half's 32 bytes of each chunk.
    unsafe {
        for b in 0..nb {
            // Blocks in pairs of 576 bytes: both scales, then both blocks' quants.
            let pair = w.add(576 * (b / 2));
            let q = pair.add(64 + 256 * (b % 2) + 32 * half);
            let raw: [__m256i; 4] = std::array::from_fn(|k| ld(q.add(64 * k)));
            let lo = raw.map(|c| _mm256_and_si256(c, m4));
            let hi = raw.map(|c| _mm256_and_si256(_mm256_srli_epi16::<4>(c), m4));
            let dw = ld_f16x8(pair.add(32 * (b % 2) + 16 * half));
            for t in 0..T {
                let a = tok[t].qs.add(32 * b);
                // 8 pair sums of ≤ 2 · 15 · 128 each: ≤ 30720, fits i16.
                let mut s16 = _mm256_setzero_si256();
                for k in 0..4 {
                    s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(lo[k], bcast4(a.add(4 * k))));
                    s16 = _mm256_add_epi16(
                        s16,
                        _mm256_maddubs_epi16(hi[k], bcast4(a.add(16 + 4 * k))),
                    );
                }
                let s = _mm256_add_epi32(
                    _mm256_madd_epi16(s16, ones),
                    _mm256_set1_epi32(*tok[t].sums.add(b)),
                );
                let dd = _mm256_mul_ps(dw, _mm256_set1_ps(*tok[t].d.add(b)));
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), dd, acc[t]);
            }
        }
        for t in 0..T {
            _mm256_storeu_ps(out[t].add(8 * half), acc[t]);
        }
    }
}

/// Rows `8 half..8 half + 8` of a Q8_0 group · T Q8_0 rows. Signed × signed through
/// `vpmaddubsw` as |w| × (a · sign w): pairs ≤ 2 · 128 · 127 = 32512, no saturation; the
/// token sums (for the AVX-512 kernel's +128) are not needed.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0<const T: usize>(
    w: *const u8,
    nb: usize,
    half: usize,
    tok: &[Tok; MAX_T],
    out: &[*mut f32; MAX_T],
) {
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); T];
    // SAFETY (whole body): as `avx512::q8_0`, reading the half's 32 bytes of each chunk.
    unsafe {
        for b in 0..nb {
            // Blocks in pairs of 1088 bytes: both scales, then both blocks' quants.
            let pair = w.add(1088 * (b / 2));
            let q = pair.add(64 + 512 * (b % 2) + 32 * half);
            let wk: [__m256i; 8] = std::array::from_fn(|k| ld(q.add(64 * k)));
            let wabs = wk.map(|v| _mm256_abs_epi8(v));
            let dw = ld_f16x8(pair.add(32 * (b % 2) + 16 * half));
            for t in 0..T {
                let a = tok[t].qs.add(32 * b);
                let mut s = _mm256_setzero_si256();
                for k in 0..8 {
                    let sa = _mm256_sign_epi8(bcast4(a.add(4 * k)), wk[k]);
                    let p = _mm256_madd_epi16(_mm256_maddubs_epi16(wabs[k], sa), ones);
                    s = _mm256_add_epi32(s, p);
                }
                let dd = _mm256_mul_ps(dw, _mm256_set1_ps(*tok[t].d.add(b)));
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), dd, acc[t]);
            }
        }
        for t in 0..T {
            _mm256_storeu_ps(out[t].add(8 * half), acc[t]);
        }
    }
}

/// i32 lanes `v` (each fitting i16) as i16 pairs `[v, v]`, for `vpmaddwd`.
#[inline]
#[target_feature(enable = "avx2")]
fn pair16(v: __m256i) -> __m256i {
    _mm256_or_si256(
        _mm256_and_si256(v, _mm256_set1_epi32(0xffff)),
        _mm256_slli_epi32::<16>(v),
    )
}

/// Rows `8 half..8 half + 8` of a Q4_K group · T Q8_K rows.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_k<const T: usize>(
    w: *const u8,
    nb: usize,
    half: usize,
    tok: &[Tok; MAX_T],
    out: &[*mut f32; MAX_T],
) {
    let m4 = _mm256_set1_epi8(0x0f);
    let mut acc = [_mm256_setzero_ps(); T];
    // SAFETY (whole body): as `avx512::q4_k`, reading the half's rows of each field.
    unsafe {
        for b in 0..nb {
            let u = w.add(2368 * b);
            let mut isum = [_mm256_setzero_si256(); T];
            for s in 0..8 {
                let sc = pair16(_mm256_cvtepu8_epi32(ld8(u.add(64 + 16 * s + 8 * half))));
                let chunks = u.add(320 + 64 * 8 * (s / 2) + 32 * half);
                let q: [__m256i; 8] = std::array::from_fn(|i| {
                    let raw = ld(chunks.add(64 * i));
                    if s % 2 == 0 {
                        _mm256_and_si256(raw, m4)
                    } else {
                        _mm256_and_si256(_mm256_srli_epi16::<4>(raw), m4)
                    }
                });
                for t in 0..T {
                    let a = tok[t].qs.add(256 * b + 32 * s);
                    let mut s16 = _mm256_setzero_si256();
                    for (i, qi) in q.iter().enumerate() {
                        s16 =
                            _mm256_add_epi16(s16, _mm256_maddubs_epi16(*qi, bcast4(a.add(4 * i))));
                    }
                    isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(s16, sc));
                }
            }
            let dw = ld_f16x8(u.add(16 * half));
            let dmin = ld_f16x8(u.add(32 + 16 * half));
            let mins: [__m256i; 4] = std::array::from_fn(|k| {
                _mm256_cvtepu8_epi16(ld16(u.add(192 + 32 * k + 16 * half)))
            });
            for t in 0..T {
                let sums = tok[t].sums.add(4 * b);
                let mut m = _mm256_setzero_si256();
                for (k, mk) in mins.iter().enumerate() {
                    m = _mm256_add_epi32(
                        m,
                        _mm256_madd_epi16(*mk, _mm256_set1_epi32(*sums.add(k))),
                    );
                }
                let dy = _mm256_set1_ps(*tok[t].d.add(b));
                acc[t] =
                    _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_mul_ps(dw, dy), acc[t]);
                acc[t] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(m), _mm256_mul_ps(dmin, dy), acc[t]);
            }
        }
        for t in 0..T {
            _mm256_storeu_ps(out[t].add(8 * half), acc[t]);
        }
    }
}

/// Rows `8 half..8 half + 8` of a Q6_K group · T Q8_K rows (layout as `avx512::q6_k`).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6_k<const T: usize>(
    w: *const u8,
    nb: usize,
    half: usize,
    tok: &[Tok; MAX_T],
    out: &[*mut f32; MAX_T],
) {
    let m4 = _mm256_set1_epi8(0x0f);
    let m30 = _mm256_set1_epi8(0x30);
    let mut acc = [_mm256_setzero_ps(); T];
    // SAFETY (whole body): as `avx512::q6_k`, reading the half's rows of each field.
    unsafe {
        for b in 0..nb {
            let u = w.add(3392 * b);
            let mut isum = [_mm256_setzero_si256(); T];
            for q in 0..4 {
                let (h, lh) = (q / 2, q % 2);
                let base = u.add(320 + 768 * q + 32 * half);
                let ra: [__m256i; 4] = std::array::from_fn(|i| ld(base.add(64 * i)));
                let rb: [__m256i; 4] = std::array::from_fn(|i| ld(base.add(256 + 64 * i)));
                let rh: [__m256i; 4] = std::array::from_fn(|i| ld(base.add(512 + 64 * i)));
                for m in 0..4 {
                    let s = 8 * h + 2 * m + lh;
                    let sc32 = _mm256_cvtepi8_epi32(ld8(u.add(64 + 16 * s + 8 * half)));
                    let sc = pair16(sc32);
                    let qv: [__m256i; 4] = std::array::from_fn(|i| {
                        let ql = if m & 1 == 0 { ra[i] } else { rb[i] };
                        let lo = if m >= 2 {
                            _mm256_srli_epi16::<4>(ql)
                        } else {
                            ql
                        };
                        let hi = match m {
                            0 => _mm256_slli_epi16::<4>(rh[i]),
                            1 => _mm256_slli_epi16::<2>(rh[i]),
                            2 => rh[i],
                            _ => _mm256_srli_epi16::<2>(rh[i]),
                        };
                        _mm256_or_si256(_mm256_and_si256(lo, m4), _mm256_and_si256(hi, m30))
                    });
                    for t in 0..T {
                        let a = tok[t].qs.add(256 * b + 16 * s);
                        // Two pair sums of ≤ 16128 each per i16 lane: ≤ 32256, fits.
                        let p01 = _mm256_add_epi16(
                            _mm256_maddubs_epi16(qv[0], bcast4(a)),
                            _mm256_maddubs_epi16(qv[1], bcast4(a.add(4))),
                        );
                        let p23 = _mm256_add_epi16(
                            _mm256_maddubs_epi16(qv[2], bcast4(a.add(8))),
                            _mm256_maddubs_epi16(qv[3], bcast4(a.add(12))),
                        );
                        let scaled = _mm256_add_epi32(
                            _mm256_madd_epi16(p01, sc),
                            _mm256_madd_epi16(p23, sc),
                        );
                        // The −32 offset: scale · (−32 Σq), precomputed per sub-block.
                        let off = _mm256_mullo_epi32(
                            sc32,
                            _mm256_set1_epi32(*tok[t].sums.add(16 * b + s)),
                        );
                        isum[t] = _mm256_add_epi32(isum[t], _mm256_add_epi32(scaled, off));
                    }
                }
            }
            let dw = ld_f16x8(u.add(16 * half));
            for t in 0..T {
                let dd = _mm256_mul_ps(dw, _mm256_set1_ps(*tok[t].d.add(b)));
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), dd, acc[t]);
            }
        }
        for t in 0..T {
            _mm256_storeu_ps(out[t].add(8 * half), acc[t]);
        }
    }
}
