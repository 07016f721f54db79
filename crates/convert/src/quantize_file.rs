//! Quantize a whole GGUF file (llama-quantize): metadata copied, each tensor's type chosen by
//! `model::synth::plan_types_for_quantize` (llama-quantize 0c1e570's per-tensor mix), data
//! streamed tensor by tensor.
//!
//! Memory stays bounded: a tensor is converted in chunks of whole rows (at most
//! [`CHUNK_ELEMENTS`] f32 at a time), read from the mmapped input and written straight out.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use gguf::{GgmlType, GgufFile, GgufWriter, TensorInfo, Value};
use model::synth::{plan_types_for_quantize, FileType};

use crate::error::ConvertError;

/// f32 elements converted at once (64 MiB of f32).
pub const CHUNK_ELEMENTS: usize = 16 << 20;

/// `general.quantization_version` written by llama.cpp today.
pub const QUANTIZATION_VERSION: u32 = 2;

pub struct QuantizeOptions {
    pub ftype: FileType,
    /// Per-tensor importance (mean squared activation per input column), keyed by tensor name.
    pub imatrix: Option<HashMap<String, Vec<f32>>>,
    /// Worker threads; `None` = rayon's default (all cores).
    pub threads: Option<usize>,
    /// llama-quantize `--pure`: every quantizable tensor at the base type, no per-tensor mix
    /// (see `plan_types_for_quantize`).
    pub pure: bool,
}

/// What happened to one tensor.
#[derive(Debug, Clone)]
pub struct TensorReport {
    pub name: String,
    pub from: GgmlType,
    pub to: GgmlType,
    pub used_imatrix: bool,
}

#[derive(Debug, Clone, Default)]
pub struct QuantizeReport {
    pub tensors: Vec<TensorReport>,
    /// Input tensors that were already quantized (and were dequantized and requantized).
    pub requantized: Vec<String>,
    pub bytes_in: u64,
    pub bytes_out: u64,
}

/// True for the types llama-quantize reads without requantizing (full-precision floats).
fn is_float(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
}

/// The output type of every tensor of `file` for `ftype`. A tensor the mix keeps as is
/// (planned F32: norms, biases, 1-D, conv) keeps its input type, as llama.cpp does.
pub fn plan_file(file: &GgufFile, ftype: FileType, pure: bool, has_imatrix: bool) -> Vec<GgmlType> {
    let shapes: Vec<(String, Vec<u64>)> = file
        .tensors()
        .iter()
        .map(|t| (t.name.clone(), t.dims.clone()))
        .collect();
    let planned = plan_types_for_quantize(&shapes, ftype, pure, has_imatrix);
    file.tensors()
        .iter()
        .zip(planned)
        .map(|(t, ty)| {
            if ty == GgmlType::F32 && !(ftype == FileType::F32 && is_float(t.ty)) {
                t.ty
            } else {
                ty
            }
        })
        .collect()
}

/// Quantizes `input` into `output`. `progress(done, total)` counts tensor elements.
pub fn quantize_file(
    input: &Path,
    output: &Path,
    opts: &QuantizeOptions,
    progress: &mut (dyn FnMut(u64, u64) + Send),
) -> Result<QuantizeReport, ConvertError> {
    let file = GgufFile::open(input)?;
    let out = File::create(output).map_err(|e| ConvertError::io(output, e))?;
    let pool = {
        let mut b = rayon::ThreadPoolBuilder::new();
        if let Some(n) = opts.threads {
            b = b.num_threads(n.max(1));
        }
        b.build()
            .map_err(|e| ConvertError::ThreadPool(e.to_string()))?
    };
    let report = pool.install(|| {
        quantize_gguf(
            &file,
            BufWriter::with_capacity(8 << 20, out),
            opts,
            progress,
        )
    })?;
    Ok(report)
}

/// As [`quantize_file`] for an open file and any writer.
pub fn quantize_gguf<W: Write>(
    file: &GgufFile,
    mut out: W,
    opts: &QuantizeOptions,
    progress: &mut (dyn FnMut(u64, u64) + Send),
) -> Result<QuantizeReport, ConvertError> {
    let types = plan_file(file, opts.ftype, opts.pure, opts.imatrix.is_some());
    let mut w = GgufWriter::new();
    for (k, v) in file.metadata().iter() {
        w.set_metadata(k, v.clone());
    }
    w.set_metadata("general.file_type", Value::U32(opts.ftype.llama_ftype()));
    w.set_metadata(
        "general.quantization_version",
        Value::U32(QUANTIZATION_VERSION),
    );
    let mut report = QuantizeReport::default();
    for (t, &ty) in file.tensors().iter().zip(&types) {
        w.add_tensor(&t.name, &t.dims, ty)?;
        if ty != t.ty && !is_float(t.ty) {
            report.requantized.push(t.name.clone());
        }
        report.bytes_in += t.n_bytes;
        report.tensors.push(TensorReport {
            name: t.name.clone(),
            from: t.ty,
            to: ty,
            used_imatrix: false,
        });
    }
    report.bytes_out = w.tensors().iter().map(|t| t.n_bytes).sum();
    let total: u64 = file.tensors().iter().map(|t| t.n_elements()).sum();
    let mut done = 0u64;
    let mut failure: Option<ConvertError> = None;
    let imatrix = opts.imatrix.as_ref();
    w.write(&mut out, |i, info, sink| {
        let src = &file.tensors()[i];
        let weights = imatrix.and_then(|m| m.get(&src.name));
        let r = convert_tensor(file, src, info, weights.map(|v| v.as_slice()), sink);
        done += src.n_elements();
        progress(done, total);
        r.map_err(|e| {
            let msg = e.to_string();
            failure = Some(e);
            std::io::Error::other(msg)
        })
    })
    .map_err(|e| failure.take().unwrap_or(ConvertError::Gguf(e)))?;
    out.flush()
        .map_err(|e| ConvertError::io("quantize output", e))?;
    for r in &mut report.tensors {
        r.used_imatrix =
            r.from != r.to && !is_float(r.to) && imatrix.is_some_and(|m| m.contains_key(&r.name));
    }
    Ok(report)
}

/// Writes tensor `src` of `file` as `dst.ty` to `sink`, row chunk by row chunk.
fn convert_tensor(
    file: &GgufFile,
    src: &TensorInfo,
    dst: &TensorInfo,
    imatrix: Option<&[f32]>,
    sink: &mut dyn Write,
) -> Result<(), ConvertError> {
    let data = file.tensor_data(src);
    let io = |e| ConvertError::io(format!("writing {}", src.name), e);
    if src.ty == dst.ty {
        return sink.write_all(data).map_err(io);
    }
    let bad = |what: String| ConvertError::Tensor {
        name: src.name.clone(),
        what,
    };
    let row_len = *src.dims.first().ok_or_else(|| bad("no dims".into()))? as usize;
    let n_rows = src.n_rows() as usize;
    if row_len == 0 {
        return Ok(());
    }
    let imatrix = match imatrix {
        Some(w) if w.len() == row_len => Some(w),
        Some(w) if w.len() > row_len && w.len() % row_len == 0 => {
            // Stacked per-expert weights (3-D tensors); ours are 2-D so only the first slice applies.
            Some(&w[..row_len])
        }
        Some(w) => {
            return Err(bad(format!(
                "imatrix has {} entries for rows of {row_len}",
                w.len()
            )))
        }
        None => None,
    };
    let in_row = src.ty.bytes_for(row_len as u64).ok_or_else(|| {
        bad(format!(
            "row of {row_len} is not whole {} blocks",
            src.ty.name()
        ))
    })? as usize;
    let out_row = dst.ty.bytes_for(row_len as u64).ok_or_else(|| {
        bad(format!(
            "row of {row_len} is not whole {} blocks",
            dst.ty.name()
        ))
    })? as usize;
    if in_row * n_rows != data.len() {
        return Err(bad("data size does not match its shape".into()));
    }
    let rows_per_chunk = (CHUNK_ELEMENTS / row_len).max(1);
    let mut f32_buf = vec![0f32; rows_per_chunk.min(n_rows) * row_len];
    let mut q_buf = vec![0u8; rows_per_chunk.min(n_rows) * out_row];
    let mut r0 = 0;
    while r0 < n_rows {
        let nr = rows_per_chunk.min(n_rows - r0);
        let x = &mut f32_buf[..nr * row_len];
        let raw = &data[r0 * in_row..(r0 + nr) * in_row];
        dequantize_rows(src.ty, raw, in_row, row_len, x)?;
        let q = &mut q_buf[..nr * out_row];
        quant::quantize_rows(dst.ty, x, row_len, q, imatrix)?;
        sink.write_all(q).map_err(io)?;
        r0 += nr;
    }
    Ok(())
}

/// raw: [n_rows, in_row bytes] of `ty` -> x: [n_rows, row_len] f32, rows in parallel.
fn dequantize_rows(
    ty: GgmlType,
    raw: &[u8],
    in_row: usize,
    row_len: usize,
    x: &mut [f32],
) -> Result<(), ConvertError> {
    use rayon::prelude::*;
    raw.par_chunks(in_row)
        .zip(x.par_chunks_mut(row_len))
        .try_for_each(|(r, y)| quant::dequantize_row(ty, r, y))?;
    Ok(())
}
