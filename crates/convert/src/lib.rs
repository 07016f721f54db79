//! Model tooling: quantize a GGUF file (llama-quantize), convert Hugging Face checkpoints
//! (convert_hf_to_gguf), importance matrices, and quality measurement.

pub mod error;
pub mod hf_convert;
pub mod hf_tokenizer;
pub mod imatrix;
pub mod imatrix_collect;
pub mod perplexity;
pub mod quantize_file;
pub mod safetensors;

pub use error::ConvertError;
pub use hf_convert::{convert_hf, convert_hf_chunked, ConvertReport, OutType};
pub use imatrix::{load_imatrix, save_imatrix, ImatrixEntry};
pub use imatrix_collect::collect_imatrix;
pub use perplexity::{evaluate, make_chunks, KlMode, Scores};
pub use quantize_file::{plan_file, quantize_file, quantize_gguf, QuantizeOptions, QuantizeReport};
