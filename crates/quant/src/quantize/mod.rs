//! Quantization of f32 rows into ggml formats.
//!
//! Without an importance matrix every format does what `llama-quantize` does without
//! `--imatrix` (ggml's `quantize_q*` in ggml/src/ggml-quants.c: the `quantize_row_*_ref`
//! reference quantizers, and the ntry = 7 search for IQ4_NL / IQ4_XS); the 32-element
//! formats and F16 / BF16 are byte-identical to gguf-py. With one, the importance-weighted
//! searches (`quantize_row_*_impl`) are used.
//!
//! [`quantize_row`] / [`quantize_rows`] check every length; the `quantize_block_*` functions
//! expect slices of exactly one block (and of its importance weights).

mod iq4;
mod k_quants;
mod legacy;
mod legacy_weighted;
pub mod search;

pub use iq4::{quantize_block_iq4_nl, quantize_block_iq4_xs};
pub use k_quants::{
    quantize_block_q2_k, quantize_block_q2_k_weighted, quantize_block_q3_k,
    quantize_block_q3_k_weighted, quantize_block_q4_k, quantize_block_q5_k, quantize_block_q6_k,
};
pub use legacy::{
    f32_to_bf16_bits, quantize_block_q4_0, quantize_block_q4_1, quantize_block_q5_0,
    quantize_block_q5_1, quantize_block_q8_0,
};
pub use legacy_weighted::{
    quantize_block_q4_0_weighted, quantize_block_q4_1_weighted, quantize_block_q5_0_weighted,
    quantize_block_q5_1_weighted,
};

use bytemuck::Pod;
use gguf::GgmlType;

use crate::blocks::to_f16_le;
use crate::error::{check_row, QuantError};

/// Whether [`quantize_row`] supports `ty`.
pub fn has_quantizer(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(
        ty,
        F32 | F16
            | BF16
            | Q4_0
            | Q4_1
            | Q5_0
            | Q5_1
            | Q8_0
            | Q2K
            | Q3K
            | Q4K
            | Q5K
            | Q6K
            | IQ4NL
            | IQ4XS
    )
}

/// Quantizes one row: src: [n] f32 -> dst: exactly the bytes of n elements of `ty`.
pub fn quantize_row(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    quantize_row_with_imatrix(ty, src, dst, None)
}

/// As [`quantize_row`], weighting each element's squared error by `imatrix` (one weight per
/// element of the row: the mean squared activation of that input column, as llama.cpp's
/// imatrix files hold). Q8_0, F16, BF16 and F32 ignore it. `src` must be one whole tensor
/// row: the Q4_0 / Q4_1 / Q5_0 / Q5_1 weighting uses the row's mean square.
pub fn quantize_row_with_imatrix(
    ty: GgmlType,
    src: &[f32],
    dst: &mut [u8],
    imatrix: Option<&[f32]>,
) -> Result<(), QuantError> {
    if !has_quantizer(ty) {
        return Err(QuantError::UnsupportedQuantize(ty));
    }
    check_row(ty, src.len(), dst.len())?;
    if let Some(w) = imatrix {
        if w.len() != src.len() {
            return Err(QuantError::ImatrixLength {
                expected: src.len(),
                got: w.len(),
            });
        }
    }
    match ty {
        GgmlType::F32 => {
            for (b, &v) in dst.chunks_exact_mut(4).zip(src) {
                b.copy_from_slice(&v.to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for (b, &v) in dst.chunks_exact_mut(2).zip(src) {
                b.copy_from_slice(&to_f16_le(v));
            }
        }
        GgmlType::BF16 => {
            for (b, &v) in dst.chunks_exact_mut(2).zip(src) {
                b.copy_from_slice(&f32_to_bf16_bits(v).to_le_bytes());
            }
        }
        GgmlType::Q8_0 => each_block(ty, src, dst, quantize_block_q8_0)?,
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 => match imatrix {
            None => match ty {
                GgmlType::Q4_0 => each_block(ty, src, dst, quantize_block_q4_0)?,
                GgmlType::Q4_1 => each_block(ty, src, dst, quantize_block_q4_1)?,
                GgmlType::Q5_0 => each_block(ty, src, dst, quantize_block_q5_0)?,
                _ => each_block(ty, src, dst, quantize_block_q5_1)?,
            },
            Some(qw) => {
                let s2 = legacy_weighted::row_sigma2(src);
                match ty {
                    GgmlType::Q4_0 => each_block_weighted(ty, src, dst, qw, |x, w, b| {
                        quantize_block_q4_0_weighted(x, w, s2, b)
                    })?,
                    GgmlType::Q4_1 => each_block_weighted(ty, src, dst, qw, |x, w, b| {
                        quantize_block_q4_1_weighted(x, w, s2, b)
                    })?,
                    GgmlType::Q5_0 => each_block_weighted(ty, src, dst, qw, |x, w, b| {
                        quantize_block_q5_0_weighted(x, w, s2, b)
                    })?,
                    _ => each_block_weighted(ty, src, dst, qw, |x, w, b| {
                        quantize_block_q5_1_weighted(x, w, s2, b)
                    })?,
                }
            }
        },
        GgmlType::Q2K => match imatrix {
            None => each_block(ty, src, dst, quantize_block_q2_k)?,
            Some(qw) => each_block_weighted(ty, src, dst, qw, quantize_block_q2_k_weighted)?,
        },
        GgmlType::Q3K => match imatrix {
            None => each_block(ty, src, dst, quantize_block_q3_k)?,
            Some(qw) => each_block_weighted(ty, src, dst, qw, quantize_block_q3_k_weighted)?,
        },
        GgmlType::Q4K => each_block_opt(ty, src, dst, imatrix, quantize_block_q4_k)?,
        GgmlType::Q5K => each_block_opt(ty, src, dst, imatrix, quantize_block_q5_k)?,
        GgmlType::Q6K => each_block_opt(ty, src, dst, imatrix, quantize_block_q6_k)?,
        GgmlType::IQ4NL => each_block_opt(ty, src, dst, imatrix, quantize_block_iq4_nl)?,
        GgmlType::IQ4XS => each_block_opt(ty, src, dst, imatrix, quantize_block_iq4_xs)?,
        _ => return Err(QuantError::UnsupportedQuantize(ty)),
    }
    Ok(())
}

/// Views `dst` as blocks of `B` and quantizes each block of `src` into one.
fn each_block<B: Pod>(
    ty: GgmlType,
    src: &[f32],
    dst: &mut [u8],
    mut f: impl FnMut(&[f32], &mut B),
) -> Result<(), QuantError> {
    let n_bytes = dst.len();
    let blocks: &mut [B] =
        bytemuck::try_cast_slice_mut(dst).map_err(|_| QuantError::ByteLength {
            ty,
            n_elements: src.len(),
            expected: src.len() / ty.block_size() * ty.type_size(),
            got: n_bytes,
        })?;
    for (x, b) in src.chunks_exact(ty.block_size()).zip(blocks.iter_mut()) {
        f(x, b);
    }
    Ok(())
}

/// Quantizes a matrix row by row across the rayon pool: src: [n_rows, n_per_row] f32 ->
/// dst: n_rows rows of `ty`. `imatrix`: [n_per_row], shared by every row (llama.cpp's
/// per-column importance). Same bytes as calling [`quantize_row_with_imatrix`] per row.
pub fn quantize_rows(
    ty: GgmlType,
    src: &[f32],
    n_per_row: usize,
    dst: &mut [u8],
    imatrix: Option<&[f32]>,
) -> Result<(), QuantError> {
    use rayon::prelude::*;
    if !has_quantizer(ty) {
        return Err(QuantError::UnsupportedQuantize(ty));
    }
    if n_per_row == 0 || !src.len().is_multiple_of(n_per_row) {
        // src is not a whole number of rows
        return Err(QuantError::NotBlockMultiple {
            ty,
            n_elements: src.len(),
            block_size: n_per_row,
        });
    }
    let Some(row_bytes) = ty.bytes_for(n_per_row as u64).map(|b| b as usize) else {
        return Err(QuantError::NotBlockMultiple {
            ty,
            n_elements: n_per_row,
            block_size: ty.block_size(),
        });
    };
    let n_rows = src.len() / n_per_row;
    if dst.len() != n_rows * row_bytes {
        return Err(QuantError::ByteLength {
            ty,
            n_elements: src.len(),
            expected: n_rows * row_bytes,
            got: dst.len(),
        });
    }
    src.par_chunks(n_per_row)
        .zip(dst.par_chunks_mut(row_bytes))
        .try_for_each(|(x, q)| quantize_row_with_imatrix(ty, x, q, imatrix))
}

/// As `each_block`, passing each block its slice of the importance weights.
fn each_block_weighted<B: Pod>(
    ty: GgmlType,
    src: &[f32],
    dst: &mut [u8],
    qw: &[f32],
    f: impl Fn(&[f32], &[f32], &mut B),
) -> Result<(), QuantError> {
    let n = ty.block_size();
    let mut blocks = qw.chunks_exact(n);
    each_block(ty, src, dst, |x, b: &mut B| {
        // qw.len() == src.len() was checked, so there is one weight chunk per block
        if let Some(w) = blocks.next() {
            f(x, w, b)
        }
    })
}

/// As `each_block` for quantizers taking optional importance weights.
fn each_block_opt<B: Pod>(
    ty: GgmlType,
    src: &[f32],
    dst: &mut [u8],
    qw: Option<&[f32]>,
    f: impl Fn(&[f32], Option<&[f32]>, &mut B),
) -> Result<(), QuantError> {
    match qw {
        None => each_block(ty, src, dst, |x, b: &mut B| f(x, None, b)),
        Some(qw) => each_block_weighted(ty, src, dst, qw, |x, w, b| f(x, Some(w), b)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_lengths_are_errors() {
        let x = [0.5f32; 64];
        let mut out = [0u8; 36];
        assert!(quantize_row(GgmlType::Q4_0, &x, &mut out).is_ok());
        assert!(matches!(
            quantize_row(GgmlType::Q4_0, &x[..63], &mut out),
            Err(QuantError::NotBlockMultiple { .. })
        ));
        assert!(matches!(
            quantize_row(GgmlType::Q4_0, &x, &mut out[..35]),
            Err(QuantError::ByteLength { .. })
        ));
        assert!(matches!(
            quantize_row_with_imatrix(GgmlType::Q4_0, &x, &mut out, Some(&[1.0; 32])),
            Err(QuantError::ImatrixLength { .. })
        ));
        assert!(matches!(
            quantize_row(GgmlType::IQ2XXS, &[0.0; 256], &mut [0u8; 66]),
            Err(QuantError::UnsupportedQuantize(GgmlType::IQ2XXS))
        ));
    }

    #[test]
    fn quantize_rows_matches_per_row() {
        let n_per_row = 512;
        let x: Vec<f32> = (0..4 * n_per_row)
            .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
            .collect();
        let w: Vec<f32> = (0..n_per_row).map(|i| 1.0 + (i % 5) as f32).collect();
        for ty in [GgmlType::Q4K, GgmlType::Q4_0, GgmlType::IQ4NL] {
            let row_bytes = ty.bytes_for(n_per_row as u64).unwrap() as usize;
            let mut all = vec![0u8; 4 * row_bytes];
            quantize_rows(ty, &x, n_per_row, &mut all, Some(&w)).unwrap();
            for r in 0..4 {
                let mut one = vec![0u8; row_bytes];
                let xr = &x[r * n_per_row..(r + 1) * n_per_row];
                quantize_row_with_imatrix(ty, xr, &mut one, Some(&w)).unwrap();
                assert_eq!(one, all[r * row_bytes..(r + 1) * row_bytes]);
            }
            assert!(quantize_rows(ty, &x, n_per_row, &mut all[1..], None).is_err());
            assert!(quantize_rows(ty, &x[1..], n_per_row, &mut all, None).is_err());
        }
    }

    #[test]
    fn bf16_rounding() {
        assert_eq!(f32_to_bf16_bits(1.0), 0x3F80);
        // exactly halfway between 0x3F80 and 0x3F81: ties to even
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3F80_8000)), 0x3F80);
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3F81_8000)), 0x3F82);
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x7F80_0001)), 0x7FC0);
    }
}
