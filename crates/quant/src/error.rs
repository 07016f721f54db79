//! Errors of the quant crate.

use gguf::GgmlType;

/// Why a row could not be (de)quantized. Lengths come from untrusted files, so every
/// mismatch is an error, never a panic.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantError {
    /// The element count is not a whole number of blocks.
    #[error("{ty}: {n_elements} elements is not a multiple of the block size {block_size}")]
    NotBlockMultiple {
        ty: GgmlType,
        n_elements: usize,
        block_size: usize,
    },
    /// The quantized buffer has the wrong byte length for the element count.
    #[error("{ty}: {n_elements} elements need {expected} bytes, buffer has {got}")]
    ByteLength {
        ty: GgmlType,
        n_elements: usize,
        expected: usize,
        got: usize,
    },
    /// An importance matrix must hold one weight per element of the row.
    #[error("imatrix has {got} weights, the row has {expected} elements")]
    ImatrixLength { expected: usize, got: usize },
    /// This type has no dequantizer here.
    #[error("dequantization of {0} is not supported")]
    UnsupportedDequantize(GgmlType),
    /// This type has no quantizer here.
    #[error("quantization to {0} is not supported")]
    UnsupportedQuantize(GgmlType),
}

/// Checks that `n_bytes` holds exactly `n_elements` elements of `ty`.
pub(crate) fn check_row(ty: GgmlType, n_elements: usize, n_bytes: usize) -> Result<(), QuantError> {
    let block_size = ty.block_size();
    if !n_elements.is_multiple_of(block_size) {
        return Err(QuantError::NotBlockMultiple {
            ty,
            n_elements,
            block_size,
        });
    }
    let expected = (n_elements / block_size)
        .checked_mul(ty.type_size())
        .ok_or(QuantError::ByteLength {
            ty,
            n_elements,
            expected: usize::MAX,
            got: n_bytes,
        })?;
    if expected != n_bytes {
        return Err(QuantError::ByteLength {
            ty,
            n_elements,
            expected,
            got: n_bytes,
        });
    }
    Ok(())
}
