//! Reading safetensors files (the Hugging Face weight format), checked and zero-copy.
//!
//! Layout (huggingface/safetensors README): u64 little-endian header length N, then N bytes of
//! JSON `{"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, "__metadata__":
//! {..}}`, then the data; offsets are relative to the end of the header. A sharded checkpoint has
//! `model.safetensors.index.json` with `weight_map: {tensor name: shard file}`.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::error::ConvertError;

/// Element types we convert from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    F32,
    F16,
    BF16,
}

impl Dtype {
    pub fn size(self) -> usize {
        match self {
            Dtype::F32 => 4,
            Dtype::F16 | Dtype::BF16 => 2,
        }
    }
}

#[derive(Debug, Clone)]
pub struct StTensor {
    pub name: String,
    pub dtype: Dtype,
    /// Row-major (PyTorch) shape: the last dim is contiguous.
    pub shape: Vec<usize>,
    /// Absolute byte range in the file.
    pub start: usize,
    pub end: usize,
}

impl StTensor {
    pub fn n_elements(&self) -> usize {
        self.shape.iter().product()
    }
}

/// One mmapped safetensors file.
pub struct StFile {
    pub path: PathBuf,
    map: Mmap,
    pub tensors: Vec<StTensor>,
}

impl StFile {
    pub fn open(path: &Path) -> Result<StFile, ConvertError> {
        let f = File::open(path).map_err(|e| ConvertError::io(path, e))?;
        // SAFETY: the file is mapped read-only; like every mmap reader we assume nobody
        // truncates it while we convert.
        let map = unsafe { Mmap::map(&f) }.map_err(|e| ConvertError::io(path, e))?;
        let tensors = parse_header(&map).map_err(|w| {
            ConvertError::Input(format!("{}: not a safetensors file: {w}", path.display()))
        })?;
        Ok(StFile {
            path: path.to_owned(),
            map,
            tensors,
        })
    }

    pub fn bytes(&self, t: &StTensor) -> &[u8] {
        &self.map[t.start..t.end]
    }

    /// The tensor as f32 (converted from F16 / BF16), row-major.
    pub fn to_f32(&self, t: &StTensor) -> Vec<f32> {
        self.range_to_f32(t, 0, t.n_elements())
    }

    /// Elements `[start, start + n)` of the tensor (flattened, row-major) as f32.
    /// Panics if the range is outside the tensor (callers derive it from the shape).
    pub fn range_to_f32(&self, t: &StTensor, start: usize, n: usize) -> Vec<f32> {
        let sz = t.dtype.size();
        let b = &self.bytes(t)[start * sz..(start + n) * sz];
        match t.dtype {
            Dtype::F32 => b
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            Dtype::F16 => b
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            Dtype::BF16 => b
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
        }
    }
}

/// Parses and checks the header of `data`; tensors come back sorted by name.
pub fn parse_header(data: &[u8]) -> Result<Vec<StTensor>, String> {
    let n = data
        .get(..8)
        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
        .ok_or("shorter than 8 bytes")?;
    let header_end = usize::try_from(n)
        .ok()
        .and_then(|n| n.checked_add(8))
        .filter(|&e| e <= data.len())
        .ok_or_else(|| format!("header length {n} past the end of the file"))?;
    let json: serde_json::Value =
        serde_json::from_slice(&data[8..header_end]).map_err(|e| format!("header JSON: {e}"))?;
    let obj = json.as_object().ok_or("header is not a JSON object")?;
    let mut out = Vec::new();
    for (name, v) in obj {
        if name == "__metadata__" {
            continue;
        }
        let bad = |w: &str| format!("tensor {name}: {w}");
        let dtype = match v.get("dtype").and_then(|d| d.as_str()) {
            Some("F32") => Dtype::F32,
            Some("F16") => Dtype::F16,
            Some("BF16") => Dtype::BF16,
            Some(other) => return Err(bad(&format!("dtype {other} is not supported"))),
            None => return Err(bad("no dtype")),
        };
        let shape: Vec<usize> = v
            .get("shape")
            .and_then(|s| s.as_array())
            .ok_or_else(|| bad("no shape"))?
            .iter()
            .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
            .collect::<Option<_>>()
            .ok_or_else(|| bad("bad shape"))?;
        let offs: Vec<usize> = v
            .get("data_offsets")
            .and_then(|s| s.as_array())
            .ok_or_else(|| bad("no data_offsets"))?
            .iter()
            .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
            .collect::<Option<_>>()
            .ok_or_else(|| bad("bad data_offsets"))?;
        let [b, e] = offs[..] else {
            return Err(bad("data_offsets is not [begin, end]"));
        };
        let n_bytes = shape
            .iter()
            .try_fold(dtype.size(), |a, &d| a.checked_mul(d))
            .ok_or_else(|| bad("size overflows"))?;
        let start = header_end
            .checked_add(b)
            .ok_or_else(|| bad("offset overflows"))?;
        let end = header_end
            .checked_add(e)
            .ok_or_else(|| bad("offset overflows"))?;
        if b > e || e - b != n_bytes || end > data.len() {
            return Err(bad(&format!(
                "data [{b}, {e}) does not hold {n_bytes} bytes inside the file"
            )));
        }
        out.push(StTensor {
            name: name.clone(),
            dtype,
            shape,
            start,
            end,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// The safetensors files of a Hugging Face model directory: the shards listed in
/// `model.safetensors.index.json` (sorted by file name), else `model.safetensors`.
pub fn model_files(dir: &Path) -> Result<Vec<PathBuf>, ConvertError> {
    let index = dir.join("model.safetensors.index.json");
    if index.exists() {
        let text = std::fs::read_to_string(&index).map_err(|e| ConvertError::io(&index, e))?;
        let json: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| ConvertError::Input(format!("{}: {e}", index.display())))?;
        let map = json
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| ConvertError::Input(format!("{}: no weight_map", index.display())))?;
        let mut files: BTreeMap<String, ()> = BTreeMap::new();
        for f in map.values() {
            let f = f.as_str().ok_or_else(|| {
                ConvertError::Input(format!(
                    "{}: weight_map value is not a string",
                    index.display()
                ))
            })?;
            if f.contains('/') || f.contains('\\') || f.contains("..") {
                return Err(ConvertError::Input(format!(
                    "shard name {f:?} leaves the directory"
                )));
            }
            files.insert(f.to_owned(), ());
        }
        return Ok(files.into_keys().map(|f| dir.join(f)).collect());
    }
    let single = dir.join("model.safetensors");
    if single.exists() {
        return Ok(vec![single]);
    }
    Err(ConvertError::Input(format!(
        "{}: no model.safetensors or model.safetensors.index.json",
        dir.display()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(header: &str, data: &[u8]) -> Vec<u8> {
        let mut v = (header.len() as u64).to_le_bytes().to_vec();
        v.extend_from_slice(header.as_bytes());
        v.extend_from_slice(data);
        v
    }

    #[test]
    fn parses_and_checks() {
        let h = r#"{"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"BF16","shape":[1,2],"data_offsets":[8,12]},"__metadata__":{"format":"pt"}}"#;
        let t = parse_header(&file(h, &[0; 12])).unwrap();
        assert_eq!(t[0].name, "a");
        assert_eq!(t[0].dtype, Dtype::BF16);
        assert_eq!(t[1].shape, vec![2]);
        // Data past the end, wrong sizes, bad header length: errors, not panics.
        assert!(parse_header(&file(h, &[0; 11])).is_err());
        let wrong = r#"{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#;
        assert!(parse_header(&file(wrong, &[0; 8])).is_err());
        assert!(parse_header(&[255; 8]).is_err());
        assert!(parse_header(&[1, 2]).is_err());
        let i8 = r#"{"a":{"dtype":"I8","shape":[1],"data_offsets":[0,1]}}"#;
        assert!(parse_header(&file(i8, &[0])).is_err());
    }
}
