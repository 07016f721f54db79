//! GGUF file format: reader, writer, typed metadata and tensor types.
//!
//! This crate knows the file format only; nothing about compute or models.

pub mod types;

pub use types::{GgmlType, QK_K};
