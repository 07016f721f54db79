//! Block quantization formats: reference quantize / dequantize / dot, SIMD CPU kernels,
//! threaded CPU matvec.

pub mod blocks;
pub mod dequantize;
pub mod error;

pub use dequantize::{dequantize_row, has_dequantizer};
pub use error::QuantError;
