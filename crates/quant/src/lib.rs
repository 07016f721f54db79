//! Block quantization formats: reference quantize / dequantize / dot, SIMD CPU kernels,
//! threaded CPU matvec.

pub mod blocks;
