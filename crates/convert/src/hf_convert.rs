//! Hugging Face checkpoint directory -> GGUF, with the tensor names, transformations and
//! metadata of llama.cpp's `convert_hf_to_gguf.py` for Llama, Qwen2, Qwen3 and Qwen3.5 (dense).
//!
//! Streaming: tensors are read from the mmapped shards and converted one at a time while the
//! GGUF is written, so memory stays at about one tensor in f32.
//!
//! Transformations (checked bit for bit against the fixtures' llama.cpp GGUFs):
//! - Llama `q_proj` / `k_proj`: rows permuted from HF's rotate-half rotary layout to ggml's
//!   interleaved one (`LlamaModel.permute`).
//! - Qwen3.5 RMSNorm weights (all but the DeltaNet gated norm) are stored as w - 1 by HF: +1.
//! - Qwen3.5 `A_log` -> `ssm_a = -exp(A_log)` (computed in f64, rounded once, like torch).
//! - Qwen3.5 `conv1d.weight` [C, 1, K] -> [C, K].
//! - Qwen3.5 with more value heads than key heads: value heads go from grouped-by-key-head
//!   order to tiled order (`_LinearAttentionVReorderBase._reorder_v_heads`) in the V rows of
//!   `in_proj_qkv` and `conv1d`, the rows of `in_proj_z`, `in_proj_a`, `in_proj_b`, `dt_bias`,
//!   `A_log`, and the columns of `out_proj`.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use gguf::{Array, GgmlType, GgufWriter, Value};
use serde_json::Value as Json;

use crate::error::ConvertError;
use crate::hf_tokenizer::tokenizer_metadata;
use crate::safetensors::{model_files, StFile, StTensor};

/// `--outtype`: the type of the 2-D weight matrices (the rest stays F32, as llama.cpp does).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutType {
    F32,
    F16,
    BF16,
    Q8_0,
}

impl OutType {
    pub fn from_name(s: &str) -> Option<OutType> {
        match s.to_ascii_lowercase().as_str() {
            "f32" => Some(OutType::F32),
            "f16" => Some(OutType::F16),
            "bf16" => Some(OutType::BF16),
            "q8_0" => Some(OutType::Q8_0),
            _ => None,
        }
    }

    /// `general.file_type` (`enum llama_ftype`).
    fn llama_ftype(self) -> u32 {
        match self {
            OutType::F32 => 0,
            OutType::F16 => 1,
            OutType::Q8_0 => 7,
            OutType::BF16 => 32,
        }
    }

    fn ggml(self) -> GgmlType {
        match self {
            OutType::F32 => GgmlType::F32,
            OutType::F16 => GgmlType::F16,
            OutType::BF16 => GgmlType::BF16,
            OutType::Q8_0 => GgmlType::Q8_0,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Arch {
    Llama,
    Qwen2,
    Qwen3,
    Qwen35,
}

impl Arch {
    fn gguf_name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Qwen35 => "qwen35",
        }
    }

    /// `tokenizer.ggml.pre` (llama.cpp picks it by hashing the tokenizer's output; these are
    /// the values it gives for these families).
    fn pre_tokenizer(self) -> &'static str {
        match self {
            Arch::Llama => "llama-bpe",
            Arch::Qwen2 | Arch::Qwen3 => "qwen2",
            Arch::Qwen35 => "qwen35",
        }
    }
}

/// The hyperparameters the conversion needs, from config.json (text_config for multimodal).
struct HParams {
    arch: Arch,
    n_layer: usize,
    n_embd: usize,
    n_head: usize,
    n_head_kv: usize,
    head_dim: Option<usize>,
    /// Qwen3.5 DeltaNet: key heads, value heads, key / value head dims.
    lin: Option<(usize, usize, usize, usize)>,
    /// Qwen3.5 multi-token-prediction layers (`mtp.*`), written as blocks n_layer.. .
    n_mtp: usize,
}

/// One tensor to write: where it comes from and what happens to it.
struct Plan {
    name: String,
    src: usize,
    tensor: StTensor,
    dims: Vec<u64>,
    ty: GgmlType,
}

#[derive(Debug, Clone, Default)]
pub struct ConvertReport {
    pub arch: String,
    pub n_tensors: usize,
    pub bytes_out: u64,
}

fn cfg_usize(c: &Json, key: &str) -> Option<usize> {
    c.get(key)?.as_u64().map(|v| v as usize)
}

fn need(c: &Json, key: &str) -> Result<usize, ConvertError> {
    cfg_usize(c, key).ok_or_else(|| ConvertError::Input(format!("config.json: no {key}")))
}

/// Converts the checkpoint in `dir` to a GGUF at `output`; `progress(done, total)` in elements.
pub fn convert_hf(
    dir: &Path,
    output: &Path,
    outtype: OutType,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<ConvertReport, ConvertError> {
    convert_hf_chunked(
        dir,
        output,
        outtype,
        crate::quantize_file::CHUNK_ELEMENTS,
        progress,
    )
}

/// As [`convert_hf`], streaming untransformed tensors in chunks of about `chunk_elements`.
pub fn convert_hf_chunked(
    dir: &Path,
    output: &Path,
    outtype: OutType,
    chunk_elements: usize,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<ConvertReport, ConvertError> {
    let cfg_path = dir.join("config.json");
    let text = std::fs::read_to_string(&cfg_path).map_err(|e| ConvertError::io(&cfg_path, e))?;
    let root: Json = serde_json::from_str(&text)
        .map_err(|e| ConvertError::Input(format!("{}: {e}", cfg_path.display())))?;
    let arch_name = root
        .get("architectures")
        .and_then(|a| a.get(0))
        .and_then(|a| a.as_str())
        .unwrap_or("");
    let arch = match arch_name {
        "LlamaForCausalLM" => Arch::Llama,
        "Qwen2ForCausalLM" => Arch::Qwen2,
        "Qwen3ForCausalLM" => Arch::Qwen3,
        "Qwen3_5ForCausalLM" | "Qwen3_5ForConditionalGeneration" => Arch::Qwen35,
        other => {
            return Err(ConvertError::Input(format!(
                "architecture {other:?} is not supported (Llama, Qwen2, Qwen3, Qwen3.5 dense)"
            )))
        }
    };
    let c = root.get("text_config").unwrap_or(&root).clone();
    let hp = HParams {
        arch,
        n_layer: need(&c, "num_hidden_layers")?,
        n_embd: need(&c, "hidden_size")?,
        n_head: need(&c, "num_attention_heads")?,
        n_head_kv: cfg_usize(&c, "num_key_value_heads").unwrap_or(need(&c, "num_attention_heads")?),
        head_dim: cfg_usize(&c, "head_dim"),
        lin: match arch {
            Arch::Qwen35 => Some((
                need(&c, "linear_num_key_heads")?,
                need(&c, "linear_num_value_heads")?,
                need(&c, "linear_key_head_dim")?,
                need(&c, "linear_value_head_dim")?,
            )),
            _ => None,
        },
        n_mtp: match arch {
            Arch::Qwen35 => cfg_usize(&c, "mtp_num_hidden_layers").unwrap_or(0),
            _ => 0,
        },
    };

    let files: Vec<StFile> = model_files(dir)?
        .iter()
        .map(|p| StFile::open(p))
        .collect::<Result<_, _>>()?;
    let mut plans = Vec::new();
    for (fi, f) in files.iter().enumerate() {
        for t in &f.tensors {
            let Some(name) = gguf_name(&hp, &t.name)? else {
                continue;
            };
            let mut shape: Vec<u64> = t.shape.iter().map(|&d| d as u64).collect();
            if name.ends_with("ssm_conv1d.weight") {
                // [C, 1, K] -> [C, K]
                shape.retain(|&d| d != 1);
            }
            let dims: Vec<u64> = shape.iter().rev().copied().collect();
            let ty = out_type(&name, &dims, outtype);
            plans.push(Plan {
                name,
                src: fi,
                tensor: t.clone(),
                dims,
                ty,
            });
        }
    }
    let n_vocab = plans
        .iter()
        .find(|p| p.name == "token_embd.weight")
        .and_then(|p| p.dims.get(1).copied())
        .ok_or_else(|| ConvertError::Input("no model.embed_tokens.weight".into()))?
        as usize;

    let mut w = GgufWriter::new();
    for (k, v) in model_metadata(&hp, &c, dir, outtype, n_vocab)? {
        w.set_metadata(&k, v);
    }
    for p in &plans {
        w.add_tensor(&p.name, &p.dims, p.ty)?;
    }
    let bytes_out = w.tensors().iter().map(|t| t.n_bytes).sum();
    let total: u64 = plans.iter().map(|p| p.tensor.n_elements() as u64).sum();
    let out = File::create(output).map_err(|e| ConvertError::io(output, e))?;
    let mut out = BufWriter::with_capacity(8 << 20, out);
    let mut done = 0u64;
    let mut failure = None;
    w.write(&mut out, |i, _, sink| {
        let p = &plans[i];
        let r = write_tensor(&hp, &files[p.src], p, chunk_elements, sink);
        done += p.tensor.n_elements() as u64;
        progress(done, total);
        r.map_err(|e| {
            let msg = e.to_string();
            failure = Some(e);
            std::io::Error::other(msg)
        })
    })
    .map_err(|e| failure.take().unwrap_or(ConvertError::Gguf(e)))?;
    out.flush().map_err(|e| ConvertError::io(output, e))?;
    Ok(ConvertReport {
        arch: arch.gguf_name().into(),
        n_tensors: plans.len(),
        bytes_out,
    })
}

/// llama.cpp's converter keeps 1-D tensors, norms and the conv kernel in F32.
fn out_type(name: &str, dims: &[u64], outtype: OutType) -> GgmlType {
    let keep_f32 = dims.len() < 2
        || !name.ends_with(".weight")
        || name.contains("_norm.weight")
        || name.contains("ssm_conv1d");
    if keep_f32 || outtype == OutType::F32 {
        return GgmlType::F32;
    }
    let ty = outtype.ggml();
    if !dims[0].is_multiple_of(ty.block_size() as u64) {
        // gguf-py's quantize falls back to F16 when the rows do not split into blocks.
        return GgmlType::F16;
    }
    ty
}

/// The GGUF name of an HF tensor, `None` for tensors the text model does not use.
fn gguf_name(hp: &HParams, hf: &str) -> Result<Option<String>, ConvertError> {
    let hf = hf
        .strip_prefix("model.language_model.")
        .map(|r| format!("model.{r}"))
        .unwrap_or_else(|| hf.to_owned());
    if hf.starts_with("model.visual.") || hf.starts_with("visual.") {
        // The vision tower goes to a separate mmproj file in llama.cpp.
        return Ok(None);
    }
    if let Some(mtp) = hf.strip_prefix("mtp.") {
        return mtp_name(hp, mtp);
    }
    let fixed = match hf.as_str() {
        "lm_head.weight" => Some("output.weight"),
        "model.embed_tokens.weight" => Some("token_embd.weight"),
        "model.norm.weight" => Some("output_norm.weight"),
        _ => None,
    };
    if let Some(n) = fixed {
        return Ok(Some(n.into()));
    }
    let unknown = || ConvertError::Input(format!("tensor {hf} has no GGUF name"));
    let rest = hf.strip_prefix("model.layers.").ok_or_else(unknown)?;
    let (layer, part) = rest.split_once('.').ok_or_else(unknown)?;
    let layer: usize = layer.parse().map_err(|_| unknown())?;
    if layer >= hp.n_layer {
        return Err(unknown());
    }
    layer_name(hp, layer, part).map(Some).ok_or_else(unknown)
}

/// Qwen3.5's MTP head (`mtp.*` without the prefix) as llama.cpp's `nextn` block(s) after the
/// main layers: `fc` -> `nextn.eh_proj`, the two pre-fc norms -> `nextn.enorm` / `nextn.hnorm`,
/// the final norm -> `nextn.shared_head_norm`, and `layers.i.*` as an ordinary attention block.
fn mtp_name(hp: &HParams, mtp: &str) -> Result<Option<String>, ConvertError> {
    if hp.n_mtp == 0 {
        return Ok(None);
    }
    let unknown = || ConvertError::Input(format!("tensor mtp.{mtp} has no GGUF name"));
    let blk = hp.n_layer;
    let fixed = match mtp {
        "fc.weight" => Some("nextn.eh_proj.weight"),
        "pre_fc_norm_embedding.weight" => Some("nextn.enorm.weight"),
        "pre_fc_norm_hidden.weight" => Some("nextn.hnorm.weight"),
        "norm.weight" => Some("nextn.shared_head_norm.weight"),
        _ => None,
    };
    if let Some(n) = fixed {
        return Ok(Some(format!("blk.{blk}.{n}")));
    }
    let rest = mtp.strip_prefix("layers.").ok_or_else(unknown)?;
    let (layer, part) = rest.split_once('.').ok_or_else(unknown)?;
    let layer: usize = layer.parse().map_err(|_| unknown())?;
    if layer >= hp.n_mtp {
        return Err(unknown());
    }
    layer_name(hp, blk + layer, part)
        .map(Some)
        .ok_or_else(unknown)
}

/// `blk.<layer>.<name>` of one decoder-layer tensor (`part` after `layers.<i>.`); `None` for
/// an unknown tensor.
fn layer_name(hp: &HParams, layer: usize, part: &str) -> Option<String> {
    let post_norm = if hp.arch == Arch::Qwen35 {
        "post_attention_norm.weight"
    } else {
        "ffn_norm.weight"
    };
    let suffix = match part {
        "input_layernorm.weight" => "attn_norm.weight",
        "post_attention_layernorm.weight" => post_norm,
        "mlp.gate_proj.weight" => "ffn_gate.weight",
        "mlp.up_proj.weight" => "ffn_up.weight",
        "mlp.down_proj.weight" => "ffn_down.weight",
        "self_attn.q_proj.weight" => "attn_q.weight",
        "self_attn.k_proj.weight" => "attn_k.weight",
        "self_attn.v_proj.weight" => "attn_v.weight",
        "self_attn.o_proj.weight" => "attn_output.weight",
        "self_attn.q_proj.bias" => "attn_q.bias",
        "self_attn.k_proj.bias" => "attn_k.bias",
        "self_attn.v_proj.bias" => "attn_v.bias",
        "self_attn.q_norm.weight" => "attn_q_norm.weight",
        "self_attn.k_norm.weight" => "attn_k_norm.weight",
        "self_attn.rotary_emb.inv_freq" => return None,
        "linear_attn.A_log" => "ssm_a",
        "linear_attn.conv1d.weight" => "ssm_conv1d.weight",
        "linear_attn.dt_bias" => "ssm_dt.bias",
        "linear_attn.in_proj_a.weight" => "ssm_alpha.weight",
        "linear_attn.in_proj_b.weight" => "ssm_beta.weight",
        "linear_attn.in_proj_qkv.weight" => "attn_qkv.weight",
        "linear_attn.in_proj_z.weight" => "attn_gate.weight",
        "linear_attn.norm.weight" => "ssm_norm.weight",
        "linear_attn.out_proj.weight" => "ssm_out.weight",
        _ => return None,
    };
    Some(format!("blk.{layer}.{suffix}"))
}

/// Reads, transforms and writes one tensor.
fn write_tensor(
    hp: &HParams,
    file: &StFile,
    p: &Plan,
    chunk_elements: usize,
    sink: &mut dyn Write,
) -> Result<(), ConvertError> {
    let row = (p.dims[0] as usize).max(1);
    let io = |e| ConvertError::io(format!("writing {}", p.name), e);
    if !transforms(hp, &p.name) {
        // Untouched tensors (embeddings, heads, MLPs: the bulk of a model) stream in chunks of
        // whole rows, so memory stays at ~CHUNK_ELEMENTS f32 whatever the tensor size.
        let n = p.tensor.n_elements();
        let rows_per_chunk = (chunk_elements / row).max(1);
        let out_row =
            p.ty.bytes_for(row as u64)
                .ok_or_else(|| ConvertError::Tensor {
                    name: p.name.clone(),
                    what: "not whole blocks".into(),
                })? as usize;
        let mut start = 0;
        while start < n {
            let len = (rows_per_chunk * row).min(n - start);
            let x = file.range_to_f32(&p.tensor, start, len);
            let mut out = vec![0u8; len / row * out_row];
            quant::quantize_rows(p.ty, &x, row, &mut out, None)?;
            sink.write_all(&out).map_err(io)?;
            start += len;
        }
        return Ok(());
    }
    let mut x = file.to_f32(&p.tensor);
    transform(hp, &p.name, &p.tensor.shape, &mut x)?;
    let n_bytes =
        p.ty.bytes_for(x.len() as u64)
            .ok_or_else(|| ConvertError::Tensor {
                name: p.name.clone(),
                what: "not whole blocks".into(),
            })? as usize;
    let mut out = vec![0u8; n_bytes];
    quant::quantize_rows(p.ty, &x, row, &mut out, None)?;
    sink.write_all(&out).map_err(io)
}

/// Whether [`transform`] changes tensor `name` (the rest is copied / cast as is).
fn transforms(hp: &HParams, name: &str) -> bool {
    let base = name.split('.').nth(2).unwrap_or(name);
    match hp.arch {
        Arch::Llama => matches!(base, "attn_q" | "attn_k"),
        Arch::Qwen35 => {
            name.contains("norm")
                || base.starts_with("ssm_")
                || matches!(base, "attn_qkv" | "attn_gate")
        }
        _ => false,
    }
}

/// Applies llama.cpp's converter transformations in place. x: row-major with HF `shape`.
fn transform(hp: &HParams, name: &str, shape: &[usize], x: &mut [f32]) -> Result<(), ConvertError> {
    let base = name.split('.').nth(2).unwrap_or(name);
    let cols = shape.last().copied().unwrap_or(1);
    match hp.arch {
        Arch::Llama if base == "attn_q" && name.ends_with("weight") => {
            permute_rotary(x, hp.n_head, cols)
        }
        Arch::Llama if base == "attn_k" && name.ends_with("weight") => {
            permute_rotary(x, hp.n_head_kv, cols)
        }
        Arch::Qwen35 => {
            let is_norm = name == "output_norm.weight"
                || (name.contains("norm.weight") && !name.contains("ssm_norm"));
            if is_norm {
                x.iter_mut().for_each(|v| *v += 1.0);
            }
            if base == "ssm_a" {
                x.iter_mut().for_each(|v| *v = -((*v as f64).exp()) as f32);
            }
            let (nk, nv, hk, hv) = hp.lin.expect("qwen35 has DeltaNet dims");
            if nv != nk && nv % nk == 0 {
                let r = nv / nk;
                let n_rows = x.len() / cols.max(1);
                let conv_cols = if base == "ssm_conv1d" {
                    x.len() / n_rows.max(1)
                } else {
                    cols
                };
                match base {
                    "ssm_a" | "ssm_dt" => reorder_rows(x, 1, 0, nk, r, 1),
                    "ssm_alpha" | "ssm_beta" => reorder_rows(x, cols, 0, nk, r, 1),
                    "attn_gate" => reorder_rows(x, cols, 0, nk, r, hv),
                    "attn_qkv" => reorder_rows(x, cols, 2 * nk * hk, nk, r, hv),
                    "ssm_conv1d" => reorder_rows(x, conv_cols, 2 * nk * hk, nk, r, hv),
                    "ssm_out" => reorder_cols(x, cols, nk, r, hv),
                    _ => {}
                }
            }
        }
        _ => {}
    }
    Ok(())
}

/// llama.cpp's `LlamaModel.permute`: per head, rows [2, hd/2] -> [hd/2, 2].
/// x: [n_head * hd, cols] row-major.
fn permute_rotary(x: &mut [f32], n_head: usize, cols: usize) {
    let rows = x.len() / cols;
    let hd = rows / n_head;
    let half = hd / 2;
    let src = x.to_vec();
    for h in 0..n_head {
        for i in 0..half {
            for j in 0..2 {
                let from = h * hd + j * half + i;
                let to = h * hd + i * 2 + j;
                x[to * cols..(to + 1) * cols].copy_from_slice(&src[from * cols..(from + 1) * cols]);
            }
        }
    }
}

/// Rows `row0 ..` hold value heads grouped by key head, [nk, r, hd] rows; rewrite them tiled,
/// [r, nk, hd]. x: [rows, cols] row-major.
fn reorder_rows(x: &mut [f32], cols: usize, row0: usize, nk: usize, r: usize, hd: usize) {
    let n = nk * r * hd * cols;
    let start = row0 * cols;
    if start + n > x.len() {
        return;
    }
    let src = x[start..start + n].to_vec();
    for k in 0..nk {
        for j in 0..r {
            let from = ((k * r + j) * hd) * cols;
            let to = ((j * nk + k) * hd) * cols;
            x[start + to..start + to + hd * cols].copy_from_slice(&src[from..from + hd * cols]);
        }
    }
}

/// As [`reorder_rows`] along the columns of x: [rows, cols].
fn reorder_cols(x: &mut [f32], cols: usize, nk: usize, r: usize, hd: usize) {
    if nk * r * hd != cols {
        return;
    }
    let mut tmp = vec![0f32; cols];
    for row in x.chunks_exact_mut(cols) {
        tmp.copy_from_slice(row);
        for k in 0..nk {
            for j in 0..r {
                let from = (k * r + j) * hd;
                let to = (j * nk + k) * hd;
                row[to..to + hd].copy_from_slice(&tmp[from..from + hd]);
            }
        }
    }
}

/// `general.*`, `<arch>.*` and `tokenizer.*` keys, in the order llama.cpp writes them.
fn model_metadata(
    hp: &HParams,
    c: &Json,
    dir: &Path,
    outtype: OutType,
    n_vocab: usize,
) -> Result<Vec<(String, Value)>, ConvertError> {
    let a = hp.arch.gguf_name();
    let k = |s: &str| format!("{a}.{s}");
    let u = |v: usize| Value::U32(v as u32);
    let rope = c.get("rope_parameters");
    let rope_theta = rope
        .and_then(|r| r.get("rope_theta"))
        .or_else(|| c.get("rope_theta"))
        .and_then(|v| v.as_f64())
        .unwrap_or(10000.0);
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| a.into());
    let mut md: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(a.into())),
        ("general.type".into(), Value::String("model".into())),
        ("general.name".into(), Value::String(name)),
        (k("block_count"), u(hp.n_layer + hp.n_mtp)),
    ];
    if let Some(ctx) = cfg_usize(c, "max_position_embeddings") {
        md.push((k("context_length"), u(ctx)));
    }
    md.push((k("embedding_length"), u(hp.n_embd)));
    md.push((k("feed_forward_length"), u(need(c, "intermediate_size")?)));
    md.push((k("attention.head_count"), u(hp.n_head)));
    md.push((k("attention.head_count_kv"), u(hp.n_head_kv)));
    if hp.arch == Arch::Qwen35 {
        let s: Vec<i32> = rope
            .and_then(|r| r.get("mrope_section"))
            .and_then(|s| s.as_array())
            .map(|s| {
                s.iter()
                    .filter_map(|v| v.as_i64())
                    .map(|v| v as i32)
                    .collect()
            })
            .unwrap_or_else(|| vec![11, 11, 10]);
        let mut s4 = s.clone();
        s4.resize(4, 0);
        md.push((k("rope.dimension_sections"), Value::Array(Array::I32(s4))));
    }
    md.push((k("rope.freq_base"), Value::F32(rope_theta as f32)));
    let eps = c
        .get("rms_norm_eps")
        .and_then(|v| v.as_f64())
        .unwrap_or(1e-6);
    md.push((
        k("attention.layer_norm_rms_epsilon"),
        Value::F32(eps as f32),
    ));
    if let Some(hd) = hp.head_dim {
        md.push((k("attention.key_length"), u(hd)));
        md.push((k("attention.value_length"), u(hd)));
    }
    md.push((
        "general.file_type".into(),
        Value::U32(outtype.llama_ftype()),
    ));
    let head_dim = hp.head_dim.unwrap_or(hp.n_embd / hp.n_head.max(1));
    match hp.arch {
        Arch::Qwen35 => {
            let (nk, nv, hk, hv) = hp.lin.expect("qwen35");
            md.push((k("ssm.conv_kernel"), u(need(c, "linear_conv_kernel_dim")?)));
            md.push((k("ssm.state_size"), u(hk)));
            md.push((k("ssm.group_count"), u(nk)));
            md.push((k("ssm.time_step_rank"), u(nv)));
            md.push((k("ssm.inner_size"), u(nv * hv)));
            let interval = cfg_usize(c, "full_attention_interval").unwrap_or(4);
            let mut recurrent: Vec<bool> = match c.get("layer_types").and_then(|l| l.as_array()) {
                Some(l) => l
                    .iter()
                    .map(|t| t.as_str() == Some("linear_attention"))
                    .collect(),
                None => (0..hp.n_layer).map(|i| (i + 1) % interval != 0).collect(),
            };
            // MTP blocks are full-attention layers.
            recurrent.resize(hp.n_layer + hp.n_mtp, false);
            md.push((
                k("attention.recurrent_layers"),
                Value::Array(Array::Bool(recurrent)),
            ));
            md.push((k("full_attention_interval"), u(interval)));
            let partial = rope
                .and_then(|r| r.get("partial_rotary_factor"))
                .or_else(|| c.get("partial_rotary_factor"))
                .and_then(|v| v.as_f64())
                .unwrap_or(1.0);
            md.push((
                k("rope.dimension_count"),
                u((head_dim as f64 * partial) as usize),
            ));
            if hp.n_mtp > 0 {
                md.push((k("nextn_predict_layers"), u(hp.n_mtp)));
            }
        }
        Arch::Llama => {
            md.push((k("vocab_size"), u(n_vocab)));
            md.push((k("rope.dimension_count"), u(head_dim)));
        }
        _ => {}
    }
    md.push(("general.quantization_version".into(), Value::U32(2)));
    md.extend(tokenizer_metadata(dir, n_vocab, hp.arch.pre_tokenizer())?);
    Ok(md)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reorder_grouped_to_tiled() {
        // 2 key heads x 2 value heads each, head dim 1: [k0v0, k0v1, k1v0, k1v1] -> tiled.
        let mut x = vec![0.0, 1.0, 2.0, 3.0];
        reorder_rows(&mut x, 1, 0, 2, 2, 1);
        assert_eq!(x, vec![0.0, 2.0, 1.0, 3.0]);
        let mut m = vec![0.0, 1.0, 2.0, 3.0, 10.0, 11.0, 12.0, 13.0];
        reorder_cols(&mut m, 4, 2, 2, 1);
        assert_eq!(m, vec![0.0, 2.0, 1.0, 3.0, 10.0, 12.0, 11.0, 13.0]);
    }

    #[test]
    fn rotary_permutation() {
        // One head of dim 4, one column: rows [a0, a1, b0, b1] -> [a0, b0, a1, b1].
        let mut x = vec![0.0, 1.0, 2.0, 3.0];
        permute_rotary(&mut x, 1, 1);
        assert_eq!(x, vec![0.0, 2.0, 1.0, 3.0]);
    }
}
