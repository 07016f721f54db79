//! The tensor table entry of a GGUF file.

use crate::types::GgmlType;

/// Most dimensions a ggml tensor has (`GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;

/// One tensor as described in the file header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: `dims[0]` is the contiguous row length (ne0), `dims[1]` the rows, …
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Byte offset relative to the start of the data section.
    pub offset: u64,
    /// Bytes of tensor data (whole blocks of `ty`).
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Total number of elements (product of `dims`).
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().fold(1u64, |acc, &d| acc.saturating_mul(d))
    }

    /// Number of rows: the product of `dims[1..]` (1 for a vector).
    pub fn n_rows(&self) -> u64 {
        self.dims
            .iter()
            .skip(1)
            .fold(1u64, |acc, &d| acc.saturating_mul(d))
    }

    /// Length of one row in elements (`dims[0]`, 1 for a scalar).
    pub fn row_len(&self) -> u64 {
        self.dims.first().copied().unwrap_or(1)
    }
}
