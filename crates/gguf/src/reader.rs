//! Parsing and validating the GGUF header: metadata and tensor table.
//!
//! Layout (ggml/docs/gguf.md, ggml/src/gguf.cpp), all little-endian:
//!
//! ```text
//! u32 magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
//! n_kv      × { string key | u32 value_type | value }
//! n_tensors × { string name | u32 n_dims | u64 dims[n_dims] | u32 ggml_type | u64 offset }
//! padding to `general.alignment` (default 32) | tensor data
//! string = u64 length | UTF-8 bytes;  array = u32 element_type | u64 count | elements
//! ```
//!
//! Every count is checked against the bytes remaining before anything is allocated, so a
//! hostile header cannot make us allocate more than a small multiple of the file size.

use std::collections::HashMap;

use crate::error::GgufError;
use crate::metadata::Metadata;
use crate::tensor::{TensorInfo, MAX_DIMS};
use crate::types::GgmlType;
use crate::value::{Array, Value, ValueType};

/// `"GGUF"` as the first four bytes.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// Alignment of the data section and of every tensor when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Key that overrides the alignment.
pub const KEY_ALIGNMENT: &str = "general.alignment";
/// Nested arrays deeper than this are rejected (keeps recursion bounded on hostile input).
pub const MAX_ARRAY_DEPTH: usize = 16;

/// Everything before the tensor data.
#[derive(Debug)]
pub(crate) struct Header {
    pub version: u32,
    pub metadata: Metadata,
    pub tensors: Vec<TensorInfo>,
    pub tensor_index: HashMap<String, usize>,
    pub alignment: u64,
    pub data_offset: u64,
}

/// Reads little-endian values from a byte slice, every read bounds-checked.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn offset(&self) -> u64 {
        self.pos as u64
    }

    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() {
            return Err(GgufError::Truncated {
                what: what(),
                offset: self.offset(),
                needed: n,
                file_len: self.buf.len() as u64,
            });
        }
        let n = n as usize;
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N], GgufError> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// Fails unless `count` items of at least `min_size` bytes each can fit in what is left.
    fn check_count(
        &self,
        count: u64,
        min_size: u64,
        what: &dyn Fn() -> String,
    ) -> Result<(), GgufError> {
        match count.checked_mul(min_size) {
            Some(n) if n <= self.remaining() => Ok(()),
            _ => Err(GgufError::CountTooLarge {
                what: what(),
                offset: self.offset(),
                count,
                remaining: self.remaining(),
            }),
        }
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String, GgufError> {
        let len = self.u64(what)?;
        let start = self.offset();
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| GgufError::InvalidUtf8 {
            what: what(),
            offset: start,
        })
    }

    fn value_type(&mut self, key: &str) -> Result<ValueType, GgufError> {
        let offset = self.offset();
        let id = self.u32(&|| format!("value type of key {key:?}"))?;
        ValueType::from_id(id).ok_or_else(|| GgufError::UnknownValueType {
            key: key.to_owned(),
            offset,
            type_id: id,
        })
    }

    /// `count` fixed-size little-endian numbers; `N` is the byte size of one.
    fn numbers<const N: usize, T>(
        &mut self,
        count: u64,
        from_le: fn([u8; N]) -> T,
        what: &dyn Fn() -> String,
    ) -> Result<Vec<T>, GgufError> {
        self.check_count(count, N as u64, what)?;
        let bytes = self.take(count * N as u64, what)?;
        Ok(bytes
            .chunks_exact(N)
            .map(|c| from_le(c.try_into().expect("chunks_exact yields N bytes")))
            .collect())
    }

    fn value(&mut self, ty: ValueType, key: &str, depth: usize) -> Result<Value, GgufError> {
        let what = || format!("value of key {key:?}");
        Ok(match ty {
            ValueType::U8 => Value::U8(self.array::<1>(&what)?[0]),
            ValueType::I8 => Value::I8(i8::from_le_bytes(self.array(&what)?)),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array(&what)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array(&what)?)),
            ValueType::U32 => Value::U32(u32::from_le_bytes(self.array(&what)?)),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array(&what)?)),
            ValueType::U64 => Value::U64(u64::from_le_bytes(self.array(&what)?)),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array(&what)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array(&what)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array(&what)?)),
            // gguf.cpp reads a bool as one byte, non-zero meaning true.
            ValueType::Bool => Value::Bool(self.array::<1>(&what)?[0] != 0),
            ValueType::String => Value::String(self.string(&what)?),
            ValueType::Array => Value::Array(self.array_value(key, depth)?),
        })
    }

    fn array_value(&mut self, key: &str, depth: usize) -> Result<Array, GgufError> {
        if depth >= MAX_ARRAY_DEPTH {
            return Err(GgufError::ArrayTooDeep {
                key: key.to_owned(),
                max_depth: MAX_ARRAY_DEPTH,
            });
        }
        let ty = self.value_type(key)?;
        let what = || format!("array elements of key {key:?}");
        let count = self.u64(&what)?;
        self.check_count(count, ty.min_encoded_size(), &what)?;
        Ok(match ty {
            ValueType::U8 => Array::U8(self.numbers(count, u8::from_le_bytes, &what)?),
            ValueType::I8 => Array::I8(self.numbers(count, i8::from_le_bytes, &what)?),
            ValueType::U16 => Array::U16(self.numbers(count, u16::from_le_bytes, &what)?),
            ValueType::I16 => Array::I16(self.numbers(count, i16::from_le_bytes, &what)?),
            ValueType::U32 => Array::U32(self.numbers(count, u32::from_le_bytes, &what)?),
            ValueType::I32 => Array::I32(self.numbers(count, i32::from_le_bytes, &what)?),
            ValueType::U64 => Array::U64(self.numbers(count, u64::from_le_bytes, &what)?),
            ValueType::I64 => Array::I64(self.numbers(count, i64::from_le_bytes, &what)?),
            ValueType::F32 => Array::F32(self.numbers(count, f32::from_le_bytes, &what)?),
            ValueType::F64 => Array::F64(self.numbers(count, f64::from_le_bytes, &what)?),
            ValueType::Bool => Array::Bool(self.numbers(count, |b: [u8; 1]| b[0] != 0, &what)?),
            ValueType::String => {
                let mut v = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    v.push(self.string(&what)?);
                }
                Array::String(v)
            }
            ValueType::Array => {
                let mut v = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    v.push(self.array_value(key, depth + 1)?);
                }
                Array::Array(v)
            }
        })
    }
}

/// Parses and validates everything up to the data section of `buf` (the whole file).
pub(crate) fn parse_header(buf: &[u8]) -> Result<Header, GgufError> {
    let mut c = Cursor { buf, pos: 0 };
    let magic: [u8; 4] = c.array(&|| "magic".to_owned())?;
    if magic != GGUF_MAGIC {
        // gguf-py writes the magic in file byte order, so a big-endian file may start "FUGG".
        if magic == *b"FUGG" {
            return Err(GgufError::BigEndian {
                raw: u32::from_le_bytes(magic),
            });
        }
        return Err(GgufError::BadMagic { found: magic });
    }
    let version = c.u32(&|| "version".to_owned())?;
    // A big-endian file has its version (a small number) byte-swapped: low 16 bits zero.
    if version & 0xFFFF == 0 && version != 0 {
        return Err(GgufError::BigEndian { raw: version });
    }
    if !(2..=3).contains(&version) {
        return Err(GgufError::UnsupportedVersion(version));
    }
    let n_tensors = c.u64(&|| "tensor count".to_owned())?;
    let n_kv = c.u64(&|| "metadata count".to_owned())?;
    // Smallest metadata entry: empty key (8) + type (4) + one-byte value (1).
    c.check_count(n_kv, 13, &|| "metadata entries".to_owned())?;

    let mut metadata = Metadata::new();
    for i in 0..n_kv {
        let key_offset = c.offset();
        let key = c.string(&|| format!("key of metadata entry #{i}"))?;
        if metadata.contains_key(&key) {
            return Err(GgufError::DuplicateKey {
                key,
                offset: key_offset,
            });
        }
        let ty = c.value_type(&key)?;
        let value = c.value(ty, &key, 0)?;
        metadata.insert(&key, value);
    }
    let alignment = alignment_of(&metadata)?;

    // Smallest tensor entry: empty name (8) + n_dims (4) + type (4) + offset (8).
    c.check_count(n_tensors, 24, &|| "tensor infos".to_owned())?;
    let mut tensors = Vec::with_capacity(n_tensors as usize);
    let mut tensor_index = HashMap::with_capacity(n_tensors as usize);
    for i in 0..n_tensors as usize {
        let t = tensor_info(&mut c, i, alignment)?;
        if tensor_index.insert(t.name.clone(), i).is_some() {
            return Err(GgufError::DuplicateTensor {
                name: t.name,
                index: i,
            });
        }
        tensors.push(t);
    }

    let data_offset = c
        .offset()
        .checked_next_multiple_of(alignment)
        .ok_or(GgufError::BadAlignment(alignment))?;
    check_tensor_layout(&tensors, data_offset, buf.len() as u64)?;
    Ok(Header {
        version,
        metadata,
        tensors,
        tensor_index,
        alignment,
        data_offset,
    })
}

/// `general.alignment` if present (any integer type), else the default.
fn alignment_of(metadata: &Metadata) -> Result<u64, GgufError> {
    let Some(v) = metadata.get(KEY_ALIGNMENT) else {
        return Ok(DEFAULT_ALIGNMENT);
    };
    let a = v.as_integer().ok_or(GgufError::WrongValueType {
        key: KEY_ALIGNMENT.to_owned(),
        expected: "uint32",
        found: v.value_type().name(),
    })?;
    match u64::try_from(a) {
        Ok(a) if a.is_power_of_two() => Ok(a),
        _ => Err(GgufError::BadAlignment(a.clamp(0, u64::MAX as i128) as u64)),
    }
}

fn tensor_info(c: &mut Cursor, index: usize, alignment: u64) -> Result<TensorInfo, GgufError> {
    let name = c.string(&|| format!("name of tensor #{index}"))?;
    let what = || format!("info of tensor {name:?}");
    let n_dims = c.u32(&what)?;
    if n_dims as usize > MAX_DIMS {
        return Err(GgufError::TooManyDims {
            name,
            n_dims,
            max: MAX_DIMS,
        });
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for _ in 0..n_dims {
        dims.push(c.u64(&what)?);
    }
    let type_id = c.u32(&what)?;
    let offset = c.u64(&what)?;

    // ggml keeps dims as int64_t: each must be positive, and so must their product.
    let mut n_elements: u64 = 1;
    for (i, &d) in dims.iter().enumerate() {
        if d == 0 || d > i64::MAX as u64 {
            return Err(GgufError::BadDim {
                name,
                index: i,
                value: d,
            });
        }
        n_elements = match n_elements.checked_mul(d) {
            Some(n) if n <= i64::MAX as u64 => n,
            _ => return Err(GgufError::ElementCountOverflow { name, dims }),
        };
    }
    let Some(ty) = GgmlType::from_id(type_id) else {
        return Err(GgufError::UnknownTensorType { name, type_id });
    };
    // gguf.cpp requires whole blocks per row, which implies whole blocks overall.
    let row_len = dims.first().copied().unwrap_or(1);
    if !row_len.is_multiple_of(ty.block_size() as u64) {
        return Err(GgufError::NotBlockAligned {
            name,
            ty,
            row_len,
            block_size: ty.block_size(),
        });
    }
    let Some(n_bytes) = ty.bytes_for(n_elements) else {
        return Err(GgufError::ElementCountOverflow { name, dims });
    };
    if !offset.is_multiple_of(alignment) {
        return Err(GgufError::MisalignedTensor {
            name,
            offset,
            alignment,
        });
    }
    Ok(TensorInfo {
        name,
        dims,
        ty,
        offset,
        n_bytes,
    })
}

/// Every tensor's bytes lie inside the file and no two tensors share a byte.
fn check_tensor_layout(
    tensors: &[TensorInfo],
    data_offset: u64,
    file_len: u64,
) -> Result<(), GgufError> {
    for t in tensors {
        let start = data_offset.checked_add(t.offset);
        let end = start.and_then(|s| s.checked_add(t.n_bytes));
        match (start, end) {
            (Some(_), Some(end)) if end <= file_len => {}
            _ => {
                return Err(GgufError::TensorOutOfBounds {
                    name: t.name.clone(),
                    start: start.unwrap_or(u64::MAX),
                    end: end.unwrap_or(u64::MAX),
                    file_len,
                })
            }
        }
    }
    let mut by_offset: Vec<&TensorInfo> = tensors.iter().collect();
    by_offset.sort_by_key(|t| t.offset);
    for pair in by_offset.windows(2) {
        // Both ends were checked above not to overflow.
        if pair[0].offset + pair[0].n_bytes > pair[1].offset {
            return Err(GgufError::OverlappingTensors {
                first: pair[0].name.clone(),
                second: pair[1].name.clone(),
            });
        }
    }
    Ok(())
}
