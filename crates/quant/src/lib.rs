//! Block quantization formats: reference quantize / dequantize / dot, SIMD CPU kernels,
//! threaded CPU matvec.

pub mod blocks;
pub mod dequantize;
pub mod error;
pub mod quantize;

pub use dequantize::{dequantize_row, has_dequantizer};
pub use error::QuantError;
pub use quantize::{has_quantizer, quantize_row, quantize_row_with_imatrix, quantize_rows};

// Activations, dot products and matvec (quant-kernels engineer).
pub mod activation;
pub mod dot;
pub mod matvec;
pub mod packed;
pub mod team;
pub mod vmath;

pub use activation::{activation_row_bytes, quantize_activations, vec_dot_type};
pub use dot::{vec_dot, Isa};
pub use matvec::{matmul, matmul_quantized, matvec, matvec_on, quantize_activation_rows};
pub use packed::{PackedActs, PackedMatrix};
pub use team::Team;
