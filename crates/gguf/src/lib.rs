//! GGUF file format: reader, writer, typed metadata and tensor types.
//!
//! This crate knows the file format only; nothing about compute or models.

pub mod error;
pub mod file;
pub mod file_type;
pub mod metadata;
pub mod reader;
pub mod tensor;
pub mod types;
pub mod value;
pub mod writer;

pub use error::GgufError;
pub use file::GgufFile;
pub use file_type::file_type_name;
pub use metadata::Metadata;
pub use reader::{DEFAULT_ALIGNMENT, GGUF_MAGIC, KEY_ALIGNMENT, MAX_ARRAY_DEPTH};
pub use tensor::{TensorInfo, MAX_DIMS};
pub use types::{GgmlType, QK_K};
pub use value::{Array, Value, ValueType};
pub use writer::{GgufWriter, WRITE_VERSION};
