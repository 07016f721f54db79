//! The one error type of the `gguf` crate.
//!
//! Every variant names what was wrong and where (byte offset, metadata key or tensor name), so
//! a user holding a broken or hostile file can tell which part is at fault.

use crate::types::GgmlType;

/// Everything that can go wrong reading or writing a GGUF file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GgufError {
    // The io::Error is shown in the message, not chained as a source, so that printing the
    // error chain does not repeat it.
    #[error("I/O error on {path}: {error}")]
    Io { path: String, error: std::io::Error },
    #[error("I/O error while writing GGUF: {0}")]
    Write(std::io::Error),
    #[error("not a GGUF file: magic bytes are {found:02x?}, expected \"GGUF\"")]
    BadMagic { found: [u8; 4] },
    #[error(
        "big-endian GGUF file (version field reads {raw:#010x}); only little-endian files are \
         supported — re-convert the model on a little-endian machine"
    )]
    BigEndian { raw: u32 },
    #[error(
        "GGUF version {0} is not supported (only versions 2 and 3); version 1 files are from \
         2023 — re-convert the model with a current llama.cpp"
    )]
    UnsupportedVersion(u32),
    #[error("file truncated: needed {needed} bytes at offset {offset} for {what}, but the file is {file_len} bytes")]
    Truncated {
        what: String,
        offset: u64,
        needed: u64,
        file_len: u64,
    },
    #[error("{what} at offset {offset}: count {count} cannot fit in the {remaining} bytes left in the file")]
    CountTooLarge {
        what: String,
        offset: u64,
        count: u64,
        remaining: u64,
    },
    #[error("string at offset {offset} ({what}) is not valid UTF-8")]
    InvalidUtf8 { what: String, offset: u64 },
    #[error("metadata key {key:?} at offset {offset}: unknown value type id {type_id}")]
    UnknownValueType {
        key: String,
        offset: u64,
        type_id: u32,
    },
    #[error("metadata key {key:?}: arrays nested deeper than {max_depth} levels")]
    ArrayTooDeep { key: String, max_depth: usize },
    #[error("duplicate metadata key {key:?} at offset {offset}")]
    DuplicateKey { key: String, offset: u64 },
    #[error("metadata key {key:?} has type {found}, expected {expected}")]
    WrongValueType {
        key: String,
        expected: &'static str,
        found: &'static str,
    },
    #[error("general.alignment is {0}; it must be a non-zero power of two")]
    BadAlignment(u64),
    #[error("duplicate tensor name {name:?} (tensor #{index})")]
    DuplicateTensor { name: String, index: usize },
    #[error("tensor {name:?}: {n_dims} dimensions, at most {max} are allowed")]
    TooManyDims {
        name: String,
        n_dims: u32,
        max: usize,
    },
    #[error("tensor {name:?}: dimension {index} is {value} (must be between 1 and 2^63-1)")]
    BadDim {
        name: String,
        index: usize,
        value: u64,
    },
    #[error("tensor {name:?}: element count of shape {dims:?} overflows")]
    ElementCountOverflow { name: String, dims: Vec<u64> },
    #[error("tensor {name:?}: unknown ggml type id {type_id}")]
    UnknownTensorType { name: String, type_id: u32 },
    #[error(
        "tensor {name:?}: row length {row_len} is not a multiple of the {ty} block size {block_size}"
    )]
    NotBlockAligned {
        name: String,
        ty: GgmlType,
        row_len: u64,
        block_size: usize,
    },
    #[error(
        "tensor {name:?}: data offset {offset} is not a multiple of the alignment {alignment}"
    )]
    MisalignedTensor {
        name: String,
        offset: u64,
        alignment: u64,
    },
    #[error(
        "tensor {name:?}: data [{start}, {end}) lies outside the file ({file_len} bytes); the file is \
         truncated or corrupt"
    )]
    TensorOutOfBounds {
        name: String,
        start: u64,
        end: u64,
        file_len: u64,
    },
    #[error("tensors {first:?} and {second:?} overlap in the data section")]
    OverlappingTensors { first: String, second: String },
    #[error("tensor {name:?}: fill wrote {written} bytes, expected {expected}")]
    WrongTensorSize {
        name: String,
        written: u64,
        expected: u64,
    },
}
