//! A validated GGUF file whose tensor data is read in place (memory-mapped or owned bytes).

use std::path::Path;

use crate::error::GgufError;
use crate::metadata::Metadata;
use crate::reader::{parse_header, Header};
use crate::tensor::TensorInfo;

/// The bytes of a whole GGUF file.
enum Storage {
    Mmap(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            Storage::Mmap(m) => m,
            Storage::Owned(v) => v,
        }
    }
}

/// An open GGUF file. Everything (metadata, tensor shapes, types, offsets and bounds) is
/// validated when it is opened, so tensor data access cannot fail afterwards.
pub struct GgufFile {
    storage: Storage,
    header: Header,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.header.version)
            .field("n_metadata", &self.header.metadata.len())
            .field("n_tensors", &self.header.tensors.len())
            .field("len", &self.storage.bytes().len())
            .finish()
    }
}

impl GgufFile {
    /// Memory-maps and validates the file at `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        let path = path.as_ref();
        let io_err = |error| GgufError::Io {
            path: path.display().to_string(),
            error,
        };
        let file = std::fs::File::open(path).map_err(io_err)?;
        let meta = file.metadata().map_err(io_err)?;
        if meta.is_dir() {
            return Err(io_err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "is a directory, not a GGUF file (a Hugging Face folder converts with `redline convert`)",
            )));
        }
        let len = meta.len();
        let storage = if len == 0 {
            // Some platforms refuse to map an empty file; parsing reports the truncation.
            Storage::Owned(Vec::new())
        } else {
            // SAFETY: the map is read-only. Like every mmap-based model loader (llama.cpp
            // included) we rely on the file not being truncated or rewritten while open;
            // doing so is outside what we can defend against.
            Storage::Mmap(unsafe { memmap2::Mmap::map(&file) }.map_err(io_err)?)
        };
        GgufFile::from_storage(storage)
    }

    /// Validates a file held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        GgufFile::from_storage(Storage::Owned(bytes))
    }

    fn from_storage(storage: Storage) -> Result<GgufFile, GgufError> {
        let header = parse_header(storage.bytes())?;
        Ok(GgufFile { storage, header })
    }

    /// Format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.header.version
    }

    pub fn metadata(&self) -> &Metadata {
        &self.header.metadata
    }

    /// `general.architecture` (`llama`, `qwen2` …).
    pub fn architecture(&self) -> Option<&str> {
        self.header.metadata.get_str("general.architecture")
    }

    /// Tensors in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.header.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.header
            .tensor_index
            .get(name)
            .map(|&i| &self.header.tensors[i])
    }

    /// The data of `t` in place (`t.n_bytes` bytes). `t` must come from this file's
    /// [`tensors`](Self::tensors); for a foreign `TensorInfo` reaching outside the file the
    /// slice is empty.
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let bytes = self.storage.bytes();
        let start = self.header.data_offset.saturating_add(t.offset);
        let end = start.saturating_add(t.n_bytes);
        usize::try_from(start)
            .ok()
            .zip(usize::try_from(end).ok())
            .and_then(|(s, e)| bytes.get(s..e))
            .unwrap_or(&[])
    }

    /// Alignment of the data section and of every tensor offset, in bytes.
    pub fn alignment(&self) -> u64 {
        self.header.alignment
    }

    /// Absolute file offset of the data section.
    pub fn data_offset(&self) -> u64 {
        self.header.data_offset
    }

    /// Size of the whole file in bytes.
    pub fn file_len(&self) -> u64 {
        self.storage.bytes().len() as u64
    }

    /// The whole file's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        self.storage.bytes()
    }
}
