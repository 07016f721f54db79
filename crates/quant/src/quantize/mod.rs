//! Quantization of f32 rows into ggml formats.
//!
//! Without an importance matrix every format uses ggml's deterministic reference quantizer
//! (`quantize_row_*_ref` in ggml/src/ggml-quants.c), as `llama-quantize` does without
//! `--imatrix`; the 32-element formats and F16 / BF16 are byte-identical to gguf-py.

mod legacy;

pub use legacy::{
    f32_to_bf16_bits, quantize_block_q4_0, quantize_block_q4_1, quantize_block_q5_0,
    quantize_block_q5_1, quantize_block_q8_0,
};

use bytemuck::Pod;
use gguf::GgmlType;

use crate::blocks::to_f16_le;
use crate::error::{check_row, QuantError};

/// Whether [`quantize_row`] supports `ty`.
pub fn has_quantizer(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(ty, F32 | F16 | BF16 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0)
}

/// Quantizes one row: src: [n] f32 -> dst: exactly the bytes of n elements of `ty`.
pub fn quantize_row(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    quantize_row_with_imatrix(ty, src, dst, None)
}

/// As [`quantize_row`], weighting each element's squared error by `imatrix` (one weight per
/// element of the row, e.g. the mean squared activation of that input column) where the
/// format's search uses weights. Formats without a weighted search ignore it.
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
        GgmlType::Q4_0 => each_block(ty, src, dst, quantize_block_q4_0)?,
        GgmlType::Q4_1 => each_block(ty, src, dst, quantize_block_q4_1)?,
        GgmlType::Q5_0 => each_block(ty, src, dst, quantize_block_q5_0)?,
        GgmlType::Q5_1 => each_block(ty, src, dst, quantize_block_q5_1)?,
        GgmlType::Q8_0 => each_block(ty, src, dst, quantize_block_q8_0)?,
        _ => return Err(QuantError::UnsupportedQuantize(ty)),
    }
    Ok(())
}

/// Views `dst` as blocks of `B` and quantizes each block of `src` into one.
fn each_block<B: Pod>(
    ty: GgmlType,
    src: &[f32],
    dst: &mut [u8],
    f: impl Fn(&[f32], &mut B),
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
    fn bf16_rounding() {
        assert_eq!(f32_to_bf16_bits(1.0), 0x3F80);
        // exactly halfway between 0x3F80 and 0x3F81: ties to even
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3F80_8000)), 0x3F80);
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3F81_8000)), 0x3F82);
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x7F80_0001)), 0x7FC0);
    }
}
