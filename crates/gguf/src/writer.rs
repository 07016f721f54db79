//! Writing GGUF version 3 files, streaming tensor data so a large model never sits in memory.
//!
//! The layout matches gguf-py's `GGUFWriter` (gguf-py/gguf/gguf_writer.py) byte for byte:
//! header, metadata in insertion order, tensor infos with offsets assigned in declaration
//! order, zero padding to the alignment after the tensor infos and after every tensor.

use std::collections::HashSet;
use std::io::Write;

use crate::error::GgufError;
use crate::metadata::Metadata;
use crate::reader::{DEFAULT_ALIGNMENT, GGUF_MAGIC, KEY_ALIGNMENT};
use crate::tensor::{TensorInfo, MAX_DIMS};
use crate::types::GgmlType;
use crate::value::{Array, Value};

/// Version written by [`GgufWriter`].
pub const WRITE_VERSION: u32 = 3;

/// Builds a GGUF file: declare metadata and tensors, then [`write`](GgufWriter::write) it,
/// supplying each tensor's bytes through a callback.
#[derive(Debug, Default)]
pub struct GgufWriter {
    metadata: Metadata,
    tensors: Vec<TensorInfo>,
    names: HashSet<String>,
}

impl GgufWriter {
    /// An empty version-3 file; alignment 32 unless `general.alignment` is set.
    pub fn new() -> GgufWriter {
        GgufWriter::default()
    }

    /// Sets `key`, keeping the position of a key set before.
    pub fn set_metadata(&mut self, key: &str, value: Value) {
        self.metadata.insert(key, value);
    }

    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// Tensors declared so far; `offset` is assigned by [`write`](Self::write) (0 until then).
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// Declares the next tensor (ggml dim order, `dims[0]` = row length). Checks the shape
    /// the same way the reader does, so whatever we write we can read back.
    pub fn add_tensor(&mut self, name: &str, dims: &[u64], ty: GgmlType) -> Result<(), GgufError> {
        let name_owned = name.to_owned();
        if self.names.contains(name) {
            return Err(GgufError::DuplicateTensor {
                name: name_owned,
                index: self.tensors.len(),
            });
        }
        if dims.len() > MAX_DIMS {
            return Err(GgufError::TooManyDims {
                name: name_owned,
                n_dims: dims.len() as u32,
                max: MAX_DIMS,
            });
        }
        let mut n_elements: u64 = 1;
        for (index, &d) in dims.iter().enumerate() {
            if d == 0 || d > i64::MAX as u64 {
                return Err(GgufError::BadDim {
                    name: name_owned,
                    index,
                    value: d,
                });
            }
            n_elements = match n_elements.checked_mul(d) {
                Some(n) if n <= i64::MAX as u64 => n,
                _ => {
                    return Err(GgufError::ElementCountOverflow {
                        name: name_owned,
                        dims: dims.to_vec(),
                    })
                }
            };
        }
        let row_len = dims.first().copied().unwrap_or(1);
        if !row_len.is_multiple_of(ty.block_size() as u64) {
            return Err(GgufError::NotBlockAligned {
                name: name_owned,
                ty,
                row_len,
                block_size: ty.block_size(),
            });
        }
        let n_bytes = ty
            .bytes_for(n_elements)
            .ok_or_else(|| GgufError::ElementCountOverflow {
                name: name_owned.clone(),
                dims: dims.to_vec(),
            })?;
        self.names.insert(name_owned.clone());
        self.tensors.push(TensorInfo {
            name: name_owned,
            dims: dims.to_vec(),
            ty,
            offset: 0,
            n_bytes,
        });
        Ok(())
    }

    /// Writes the whole file to `out`. `fill(i, info, w)` is called once per tensor, in
    /// declaration order, and must write exactly `info.n_bytes` bytes to `w`.
    pub fn write<W: Write>(
        mut self,
        mut out: W,
        mut fill: impl FnMut(usize, &TensorInfo, &mut dyn Write) -> std::io::Result<()>,
    ) -> Result<(), GgufError> {
        let alignment = match self.metadata.get(KEY_ALIGNMENT) {
            None => DEFAULT_ALIGNMENT,
            Some(v) => match v.as_integer().map(u64::try_from) {
                Some(Ok(a)) if a.is_power_of_two() => a,
                Some(a) => return Err(GgufError::BadAlignment(a.unwrap_or(0))),
                None => {
                    return Err(GgufError::WrongValueType {
                        key: KEY_ALIGNMENT.to_owned(),
                        expected: "uint32",
                        found: v.value_type().name(),
                    })
                }
            },
        };
        let mut offset = 0u64;
        for t in &mut self.tensors {
            t.offset = offset;
            offset = t
                .n_bytes
                .checked_next_multiple_of(alignment)
                .and_then(|n| n.checked_add(offset))
                .ok_or_else(|| GgufError::ElementCountOverflow {
                    name: t.name.clone(),
                    dims: t.dims.clone(),
                })?;
        }

        let mut header = Vec::new();
        header.extend_from_slice(&GGUF_MAGIC);
        header.extend_from_slice(&WRITE_VERSION.to_le_bytes());
        header.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        header.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (key, value) in self.metadata.iter() {
            encode_str(&mut header, key);
            header.extend_from_slice(&(value.value_type() as u32).to_le_bytes());
            encode_value(&mut header, value);
        }
        for t in &self.tensors {
            encode_str(&mut header, &t.name);
            header.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                header.extend_from_slice(&d.to_le_bytes());
            }
            header.extend_from_slice(&(t.ty as u32).to_le_bytes());
            header.extend_from_slice(&t.offset.to_le_bytes());
        }
        let header_len = header.len() as u64;
        out.write_all(&header).map_err(GgufError::Write)?;
        write_padding(&mut out, header_len, alignment)?;

        for (i, t) in self.tensors.iter().enumerate() {
            let mut counter = CountingWriter {
                inner: &mut out,
                written: 0,
            };
            fill(i, t, &mut counter).map_err(GgufError::Write)?;
            if counter.written != t.n_bytes {
                return Err(GgufError::WrongTensorSize {
                    name: t.name.clone(),
                    written: counter.written,
                    expected: t.n_bytes,
                });
            }
            write_padding(&mut out, t.n_bytes, alignment)?;
        }
        out.flush().map_err(GgufError::Write)
    }
}

/// Zero bytes up to the next multiple of `alignment` after `len` bytes.
fn write_padding(out: &mut impl Write, len: u64, alignment: u64) -> Result<(), GgufError> {
    let pad = len.next_multiple_of(alignment) - len;
    let zeros = [0u8; 256];
    let mut left = pad;
    while left > 0 {
        let n = left.min(zeros.len() as u64) as usize;
        out.write_all(&zeros[..n]).map_err(GgufError::Write)?;
        left -= n as u64;
    }
    Ok(())
}

struct CountingWriter<'a, W: Write> {
    inner: &'a mut W,
    written: u64,
}

impl<W: Write> Write for CountingWriter<'_, W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

fn encode_str(buf: &mut Vec<u8>, s: &str) {
    buf.extend_from_slice(&(s.len() as u64).to_le_bytes());
    buf.extend_from_slice(s.as_bytes());
}

/// The value's bytes without its type id.
fn encode_value(buf: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => buf.push(*x),
        Value::I8(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::U16(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::U64(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => buf.push(*x as u8),
        Value::String(s) => encode_str(buf, s),
        Value::Array(a) => encode_array(buf, a),
    }
}

/// Element type id, count, elements.
fn encode_array(buf: &mut Vec<u8>, a: &Array) {
    buf.extend_from_slice(&(a.element_type() as u32).to_le_bytes());
    buf.extend_from_slice(&(a.len() as u64).to_le_bytes());
    macro_rules! nums {
        ($v:expr) => {
            for x in $v {
                buf.extend_from_slice(&x.to_le_bytes());
            }
        };
    }
    match a {
        Array::U8(v) => buf.extend_from_slice(v),
        Array::I8(v) => nums!(v),
        Array::U16(v) => nums!(v),
        Array::I16(v) => nums!(v),
        Array::U32(v) => nums!(v),
        Array::I32(v) => nums!(v),
        Array::U64(v) => nums!(v),
        Array::I64(v) => nums!(v),
        Array::F32(v) => nums!(v),
        Array::F64(v) => nums!(v),
        Array::Bool(v) => buf.extend(v.iter().map(|&b| b as u8)),
        Array::String(v) => v.iter().for_each(|s| encode_str(buf, s)),
        Array::Array(v) => v.iter().for_each(|a| encode_array(buf, a)),
    }
}
