//! Model tooling: quantize a GGUF file (llama-quantize), importance matrices, and quality
//! measurement.

pub mod error;
pub mod imatrix;
pub mod quantize_file;

pub use error::ConvertError;
pub use imatrix::{load_imatrix, save_imatrix, ImatrixEntry};
pub use quantize_file::{plan_file, quantize_file, quantize_gguf, QuantizeOptions, QuantizeReport};
