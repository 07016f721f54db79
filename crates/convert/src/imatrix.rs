//! Importance matrices in llama.cpp's GGUF imatrix format (tools/imatrix, `--output-format
//! gguf`): for each weight `<name>`, an F32 tensor `<name>.in_sum2` [n_per_row, n_mat] with the
//! sums of squared input activations per column, and `<name>.counts` [1, n_mat] with how many
//! activations were summed. The importance of a column is in_sum2 / count.

use std::collections::HashMap;
use std::path::Path;

use gguf::{GgmlType, GgufFile};

use crate::error::ConvertError;

/// Reads an imatrix file (GGUF, or llama.cpp's older `.dat` format) into per-weight
/// importances (`name -> [n_mat * n_per_row]`).
pub fn load_imatrix(path: &Path) -> Result<HashMap<String, Vec<f32>>, ConvertError> {
    let bytes = std::fs::read(path).map_err(|e| ConvertError::io(path, e))?;
    if !bytes.starts_with(b"GGUF") {
        return parse_legacy_imatrix(&bytes)
            .map_err(|w| ConvertError::Imatrix(format!("{}: {w}", path.display())));
    }
    let file = GgufFile::from_bytes(bytes)?;
    let bad = |w: String| ConvertError::Imatrix(format!("{}: {w}", path.display()));
    let mut out = HashMap::new();
    for t in file.tensors() {
        let Some(name) = t.name.strip_suffix(".in_sum2") else {
            continue;
        };
        let counts_name = format!("{name}.counts");
        let c = file
            .tensor(&counts_name)
            .ok_or_else(|| bad(format!("{} has no {counts_name}", t.name)))?;
        if t.ty != GgmlType::F32 || c.ty != GgmlType::F32 {
            return Err(bad(format!("{name}: in_sum2 / counts must be F32")));
        }
        let sums = f32s(file.tensor_data(t));
        let counts = f32s(file.tensor_data(c));
        let n_per_row = *t.dims.first().unwrap_or(&0) as usize;
        if n_per_row == 0 || counts.is_empty() || sums.len() != n_per_row * counts.len() {
            return Err(bad(format!(
                "{name}: {} sums for {} counts",
                sums.len(),
                counts.len()
            )));
        }
        let values = sums
            .chunks(n_per_row)
            .zip(&counts)
            .flat_map(|(row, &n)| row.iter().map(move |&s| if n > 0.0 { s / n } else { 1.0 }))
            .collect();
        out.insert(name.to_owned(), values);
    }
    if out.is_empty() {
        return Err(bad(
            "no <name>.in_sum2 tensors (not a GGUF imatrix file?)".into()
        ));
    }
    Ok(out)
}

/// llama.cpp's legacy `.dat` imatrix (tools/imatrix, `--output-format dat`): i32 n_entries,
/// then per entry i32 name length, name, i32 ncall, i32 nval, f32 values[nval] (importance
/// times ncall), then i32 last_call and the dataset name. Importance = value / ncall.
pub fn parse_legacy_imatrix(b: &[u8]) -> Result<HashMap<String, Vec<f32>>, String> {
    let mut pos = 0usize;
    let i32_at = |pos: &mut usize| -> Result<i32, String> {
        let v = b
            .get(*pos..*pos + 4)
            .ok_or_else(|| format!("truncated at byte {pos}"))?;
        *pos += 4;
        Ok(i32::from_le_bytes(v.try_into().expect("4 bytes")))
    };
    let n = i32_at(&mut pos)?;
    if n <= 0 {
        return Err(format!("{n} entries"));
    }
    let mut out = HashMap::new();
    for _ in 0..n {
        let len = usize::try_from(i32_at(&mut pos)?).map_err(|_| "negative name length")?;
        let name = b.get(pos..pos + len).ok_or("truncated name")?;
        let name = String::from_utf8(name.to_vec()).map_err(|_| "name is not UTF-8")?;
        pos += len;
        let ncall = i32_at(&mut pos)?;
        let nval = usize::try_from(i32_at(&mut pos)?).map_err(|_| "negative value count")?;
        let vals = b
            .get(
                pos..nval
                    .checked_mul(4)
                    .and_then(|n| n.checked_add(pos))
                    .ok_or("size overflow")?,
            )
            .ok_or("truncated values")?;
        pos += nval * 4;
        let scale = if ncall > 0 { 1.0 / ncall as f32 } else { 1.0 };
        out.insert(name, f32s(vals).into_iter().map(|v| v * scale).collect());
    }
    Ok(out)
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Accumulated squared activations of one weight: `sums` [n_per_row], `count` activations.
#[derive(Debug, Clone)]
pub struct ImatrixEntry {
    pub sums: Vec<f32>,
    pub count: f32,
}

/// Writes entries in the GGUF imatrix format that [`load_imatrix`] and llama-quantize read.
pub fn save_imatrix(
    path: &Path,
    entries: &[(String, ImatrixEntry)],
    chunk_count: u32,
    chunk_size: u32,
    dataset: &str,
) -> Result<(), ConvertError> {
    use gguf::{Array, GgufWriter, Value};
    let mut w = GgufWriter::new();
    w.set_metadata("general.type", Value::String("imatrix".into()));
    w.set_metadata(
        "imatrix.datasets",
        Value::Array(Array::String(vec![dataset.to_owned()])),
    );
    w.set_metadata("imatrix.chunk_count", Value::U32(chunk_count));
    w.set_metadata("imatrix.chunk_size", Value::U32(chunk_size));
    for (name, e) in entries {
        w.add_tensor(
            &format!("{name}.in_sum2"),
            &[e.sums.len() as u64, 1],
            GgmlType::F32,
        )?;
        w.add_tensor(&format!("{name}.counts"), &[1, 1], GgmlType::F32)?;
    }
    let f = std::fs::File::create(path).map_err(|e| ConvertError::io(path, e))?;
    let mut out = std::io::BufWriter::new(f);
    w.write(&mut out, |i, _, sink| {
        let e = &entries[i / 2].1;
        if i % 2 == 0 {
            for v in &e.sums {
                sink.write_all(&v.to_le_bytes())?;
            }
            Ok(())
        } else {
            sink.write_all(&e.count.to_le_bytes())
        }
    })?;
    std::io::Write::flush(&mut out).map_err(|e| ConvertError::io(path, e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn save_then_load_gives_mean_squares() {
        let path =
            std::env::temp_dir().join(format!("redline-imatrix-{}.gguf", std::process::id()));
        let entries = vec![
            (
                "blk.0.attn_q.weight".to_owned(),
                ImatrixEntry {
                    sums: vec![2.0, 4.0, 8.0],
                    count: 2.0,
                },
            ),
            (
                "blk.0.ffn_down.weight".to_owned(),
                ImatrixEntry {
                    sums: vec![3.0; 5],
                    count: 3.0,
                },
            ),
        ];
        save_imatrix(&path, &entries, 7, 512, "wiki.txt").unwrap();
        let m = load_imatrix(&path).unwrap();
        assert_eq!(m["blk.0.attn_q.weight"], vec![1.0, 2.0, 4.0]);
        assert_eq!(m["blk.0.ffn_down.weight"], vec![1.0; 5]);
        let f = GgufFile::open(&path).unwrap();
        assert_eq!(f.metadata().get_u32("imatrix.chunk_count"), Some(7));
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn legacy_dat_format() {
        let mut b = 1i32.to_le_bytes().to_vec();
        let name = b"blk.0.ffn_up.weight";
        b.extend((name.len() as i32).to_le_bytes());
        b.extend(name);
        b.extend(4i32.to_le_bytes()); // ncall
        b.extend(2i32.to_le_bytes()); // nval
        b.extend(8f32.to_le_bytes());
        b.extend(2f32.to_le_bytes());
        b.extend(4i32.to_le_bytes()); // last_call
        let m = parse_legacy_imatrix(&b).unwrap();
        assert_eq!(m["blk.0.ffn_up.weight"], vec![2.0, 0.5]);
        assert!(parse_legacy_imatrix(&b[..b.len() - 9]).is_err());
        assert!(parse_legacy_imatrix(&[0xff; 4]).is_err());
    }

    #[test]
    fn rejects_a_model_file() {
        let p = Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/data/fixtures/llama/model-f32.gguf"
        ));
        assert!(matches!(load_imatrix(p), Err(ConvertError::Imatrix(_))));
    }
}
