//! Which ggml type each tensor gets for a file type ("quant mix").
//!
//! Q4_K_M follows llama.cpp's `llama_tensor_get_type` (src/llama-quant.cpp): the output head
//! (or the tied embedding) goes to Q6_K; `attn_v` and `ffn_down` go to Q6_K on the
//! "use_more_bits" layers (the first and last eighth and every third one between, counted over
//! the tensors of that kind in layer order); everything else 2-D is Q4_K; 1-D tensors, norms,
//! biases and `ssm_conv1d` stay F32 as the converter wrote them. A tensor whose row length is not
//! a multiple of the block size falls back as llama.cpp's `tensor_type_fallback` does.
//!
//! Q6_K, Q5_K_M, Q4_K_S, Q3_K_M and Q3_K_S follow the same function's other branches (used by
//! the memory planner's what-if table): the head goes to Q6_K; Q5_K_M bumps `attn_v` and
//! `ffn_down` to Q6_K on the use_more_bits layers; Q4_K_S bumps the first four `attn_v` and the
//! first eighth of `ffn_down` to Q5_K; Q3_K_M puts the first two `attn_v` at Q5_K and the rest at
//! Q4_K, the first sixteenth of `ffn_down` at Q5_K and the rest at Q4_K, and `attn_output` at
//! Q4_K; Q3_K_S and Q6_K have no per-tensor rules. llama.cpp's 70B-only and MoE-only rules do not
//! apply to our shapes and are left out.
//!
//! Two rule sets differ only on Qwen3.5 (and on Q4_0 / IQ4_XS):
//!
//! - [`plan_types`], the peer files measured in shared/BENCHMARKING.md (`redline synth`, the
//!   planner's table; their sizes are asserted in the tests below): Q4_0, IQ4_XS and Q8_0 are
//!   *pure* (every quantizable tensor, head and embedding included, at that one type), the
//!   DeltaNet `attn_qkv` keeps the base type and `ssm_alpha` / `ssm_beta` stay F32.
//! - [`plan_types_default`] / [`plan_types_for_quantize`], `redline quantize`: llama-quantize
//!   0c1e570 itself. Its `category_is_attn_v` counts the DeltaNet `attn_qkv` with `attn_v` (the
//!   bumps and the layer counter), and `ssm_alpha` / `ssm_beta` are quantized like any 2-D
//!   weight; `--pure` gives every quantizable tensor the base type. Both were measured against
//!   the peer-file choice before adopting them (BENCHMARKS.md, Quantization quality, "Qwen3.5
//!   mix rules decided by measurement"): the `attn_qkv` bumps cut KL divergence by 6-17 % for
//!   0.6-3.4 % of size (fixture and a 16-layer synthetic), keeping `ssm_alpha` / `ssm_beta` F32
//!   bought 0.1-0.8 % of KL for 0.7-2.1 % of size. On the 27B this makes Q4_K_M
//!   0.24 GB larger than the peer file (+0.32 GB of Q6_K `attn_qkv`, −0.08 GB of alpha/beta).

use gguf::GgmlType;

/// A file type (llama.cpp's `llama_ftype` names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileType {
    Q4KM,
    IQ4XS,
    Q4_0,
    Q8_0,
    F16,
    F32,
    Q6K,
    Q5KM,
    Q4KS,
    Q3KM,
    Q3KS,
    // The rest of llama-quantize's common types (`redline quantize`); not in the planner's table.
    Q4_1,
    Q5_0,
    Q5_1,
    Q2K,
    Q3KL,
    Q5KS,
    IQ4NL,
    BF16,
}

impl FileType {
    pub const ALL: [FileType; 19] = [
        FileType::Q4KM,
        FileType::IQ4XS,
        FileType::Q4_0,
        FileType::Q8_0,
        FileType::F16,
        FileType::F32,
        FileType::Q6K,
        FileType::Q5KM,
        FileType::Q4KS,
        FileType::Q3KM,
        FileType::Q3KS,
        FileType::Q4_1,
        FileType::Q5_0,
        FileType::Q5_1,
        FileType::Q2K,
        FileType::Q3KL,
        FileType::Q5KS,
        FileType::IQ4NL,
        FileType::BF16,
    ];

    /// The quantizations people commonly download, largest first (the planner's what-if table).
    pub const COMMON_QUANTS: [FileType; 9] = [
        FileType::Q8_0,
        FileType::Q6K,
        FileType::Q5KM,
        FileType::Q4KM,
        FileType::Q4KS,
        FileType::IQ4XS,
        FileType::Q4_0,
        FileType::Q3KM,
        FileType::Q3KS,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FileType::Q4KM => "Q4_K_M",
            FileType::IQ4XS => "IQ4_XS",
            FileType::Q4_0 => "Q4_0",
            FileType::Q8_0 => "Q8_0",
            FileType::F16 => "F16",
            FileType::F32 => "F32",
            FileType::Q6K => "Q6_K",
            FileType::Q5KM => "Q5_K_M",
            FileType::Q4KS => "Q4_K_S",
            FileType::Q3KM => "Q3_K_M",
            FileType::Q3KS => "Q3_K_S",
            FileType::Q4_1 => "Q4_1",
            FileType::Q5_0 => "Q5_0",
            FileType::Q5_1 => "Q5_1",
            FileType::Q2K => "Q2_K",
            FileType::Q3KL => "Q3_K_L",
            FileType::Q5KS => "Q5_K_S",
            FileType::IQ4NL => "IQ4_NL",
            FileType::BF16 => "BF16",
        }
    }

    pub fn from_name(name: &str) -> Option<FileType> {
        FileType::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(name))
    }

    /// `general.file_type` value (`enum llama_ftype` in include/llama.h).
    pub fn llama_ftype(self) -> u32 {
        match self {
            FileType::F32 => 0,
            FileType::F16 => 1,
            FileType::Q4_0 => 2,
            FileType::Q8_0 => 7,
            FileType::Q4KM => 15,
            FileType::IQ4XS => 30,
            FileType::Q3KS => 11,
            FileType::Q3KM => 12,
            FileType::Q4KS => 14,
            FileType::Q5KM => 17,
            FileType::Q6K => 18,
            FileType::Q4_1 => 3,
            FileType::Q5_0 => 8,
            FileType::Q5_1 => 9,
            FileType::Q2K => 10,
            FileType::Q3KL => 13,
            FileType::Q5KS => 16,
            FileType::IQ4NL => 25,
            FileType::BF16 => 32,
        }
    }

    /// The type most tensors get.
    pub fn base_type(self) -> GgmlType {
        match self {
            FileType::Q4KM => GgmlType::Q4K,
            FileType::IQ4XS => GgmlType::IQ4XS,
            FileType::Q4_0 => GgmlType::Q4_0,
            FileType::Q8_0 => GgmlType::Q8_0,
            FileType::F16 => GgmlType::F16,
            FileType::F32 => GgmlType::F32,
            FileType::Q6K => GgmlType::Q6K,
            FileType::Q5KM => GgmlType::Q5K,
            FileType::Q4KS => GgmlType::Q4K,
            FileType::Q3KM | FileType::Q3KS => GgmlType::Q3K,
            FileType::Q4_1 => GgmlType::Q4_1,
            FileType::Q5_0 => GgmlType::Q5_0,
            FileType::Q5_1 => GgmlType::Q5_1,
            FileType::Q2K => GgmlType::Q2K,
            FileType::Q3KL => GgmlType::Q3K,
            FileType::Q5KS => GgmlType::Q5K,
            FileType::IQ4NL => GgmlType::IQ4NL,
            FileType::BF16 => GgmlType::BF16,
        }
    }
}

/// llama.cpp's `use_more_bits(i_layer, n_layers)`. `i` counts from 0 in layer order; for
/// i < n/8 the first clause holds, so C++'s negative remainder never matters.
fn use_more_bits(i: usize, n: usize) -> bool {
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

/// Which rule set picks the types.
#[derive(Debug, Clone, Copy)]
struct Rules {
    /// llama-quantize `--pure`: every quantizable tensor at the base type. In the peer-file
    /// rules only Q4_0 / IQ4_XS are pure (those files were made that way).
    pure: bool,
    has_imatrix: bool,
    /// llama-quantize 0c1e570's own rules (`redline quantize`): the DeltaNet `attn_qkv` counts
    /// with `attn_v` and `ssm_alpha` / `ssm_beta` are quantized. False: the peer files measured
    /// in shared/BENCHMARKING.md (`redline synth`, the planner's table).
    llama_quantize: bool,
}

/// Whether llama-quantize would quantize this tensor at all (`tensor_allows_quantization`,
/// restricted to the tensors our shapes have), given the converter's F32 choices. llama.cpp
/// quantizes Qwen3.5's `ssm_alpha` / `ssm_beta` ([n_embd, n_v_heads]) like any 2-D weight
/// (its converter writes them Q8_0 too: tests/data/fixtures/qwen35/model-q8_0.gguf); the peer
/// files kept them F32.
fn is_quantizable(name: &str, dims: &[u64], rules: Rules) -> bool {
    let ssm_gate = name.contains("ssm_alpha") || name.contains("ssm_beta");
    dims.len() >= 2
        && name.ends_with("weight")
        && !name.contains("_norm.weight")
        && !name.contains("ssm_conv1d")
        && (rules.llama_quantize || !ssm_gate)
}

/// llama.cpp's `category_is_attn_v`: the tensors that take `attn_v`'s bumps and share its
/// counter. llama.cpp 0c1e570 counts the fused `attn_qkv` (Qwen3.5's DeltaNet input
/// projection) with `attn_v`; the peer files left it at the base type.
fn is_attn_v_like(name: &str, rules: Rules) -> bool {
    name.contains("attn_v.weight") || (rules.llama_quantize && name.contains("attn_qkv.weight"))
}

/// llama.cpp's `tensor_type_fallback`: a type whose block does not divide the row length.
fn fallback(ty: GgmlType, row_len: u64) -> GgmlType {
    if row_len.is_multiple_of(ty.block_size() as u64) {
        return ty;
    }
    let alt = match ty {
        GgmlType::IQ4XS => GgmlType::IQ4NL,
        GgmlType::Q4K => GgmlType::Q5_0,
        GgmlType::Q5K => GgmlType::Q5_1,
        GgmlType::Q6K => GgmlType::Q8_0,
        GgmlType::Q2K | GgmlType::Q3K => GgmlType::Q4_0,
        other => other,
    };
    if row_len.is_multiple_of(alt.block_size() as u64) {
        alt
    } else {
        GgmlType::F16
    }
}

/// Assigns a type to every tensor of `tensors` ((name, dims), in the file's order).
pub fn plan_types(tensors: &[(String, Vec<u64>)], ftype: FileType) -> Vec<GgmlType> {
    let rules = Rules {
        pure: true,
        has_imatrix: false,
        llama_quantize: false,
    };
    plan_types_with(tensors, ftype, rules)
}

/// llama-quantize's default choice (without `--pure`), as `redline quantize` makes it: as
/// [`plan_types`], except that Q4_0 and IQ4_XS (pure there, to match the measured peer files)
/// take their per-tensor rules (the head goes to Q6_K, and IQ4_XS also bumps `attn_v` to Q5_K
/// on GQA >= 4 and the first eighth of `ffn_down` to Q5_K), and that on Qwen3.5 the DeltaNet
/// `attn_qkv` takes `attn_v`'s rules and `ssm_alpha` / `ssm_beta` are quantized.
pub fn plan_types_default(tensors: &[(String, Vec<u64>)], ftype: FileType) -> Vec<GgmlType> {
    plan_types_for_quantize(tensors, ftype, false, false)
}

/// [`plan_types_default`] (or, when `pure`, the base type for every quantizable tensor) for a
/// quantization with an importance matrix when `has_imatrix`: llama.cpp then leaves the IQ4_NL /
/// IQ4_XS `ffn_down` bump out, and puts the first eighth of `ffn_down` of Q4_0 / Q5_0 at Q4_1 /
/// Q5_1.
pub fn plan_types_for_quantize(
    tensors: &[(String, Vec<u64>)],
    ftype: FileType,
    pure: bool,
    has_imatrix: bool,
) -> Vec<GgmlType> {
    let rules = Rules {
        pure,
        has_imatrix,
        llama_quantize: true,
    };
    plan_types_with(tensors, ftype, rules)
}

fn plan_types_with(tensors: &[(String, Vec<u64>)], ftype: FileType, rules: Rules) -> Vec<GgmlType> {
    let Rules {
        pure, has_imatrix, ..
    } = rules;
    let tied = !tensors.iter().any(|(n, _)| n == "output.weight");
    let base = ftype.base_type();
    let n_attn_v = tensors
        .iter()
        .filter(|(n, _)| is_attn_v_like(n, rules))
        .count();
    let n_ffn_down = tensors
        .iter()
        .filter(|(n, _)| n.contains("ffn_down"))
        .count();

    // Query heads per KV head (llama.cpp's `n_gqa()`), from the first layer's q and v rows.
    let rows_of = |suffix: &str| {
        tensors
            .iter()
            .find(|(n, d)| n.ends_with(suffix) && d.len() >= 2)
            .map(|(_, d)| d[1])
    };
    // A Qwen3-Next / Qwen3.5 hybrid (its DeltaNet layers carry `ssm_*` tensors) stores query and
    // output gate in one `attn_q`: twice the query rows, which must not double the ratio
    // (llama.cpp takes n_head / n_head_kv from the hyperparameters).
    let gated_q = tensors.iter().any(|(n, _)| n.contains(".ssm_"));
    let gqa = match (rows_of("attn_q.weight"), rows_of("attn_v.weight")) {
        (Some(q), Some(v)) if v > 0 => q / v / if gated_q { 2 } else { 1 },
        _ => 1,
    };

    // The counters (`use_more_bits`, "first n") index tensors in llama-quantize's walk order:
    // its weights map sorts by layer number, then by name (`weight_name_comparer`), whatever
    // the file order is. Files from HF converters list layers by name (blk.0, blk.1, blk.10,
    // …, blk.2), so the file order would put the bumps on the wrong layers from 11 layers up.
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_by(|&a, &b| {
        let (na, nb) = (&tensors[a].0, &tensors[b].0);
        (layer_of(na), na).cmp(&(layer_of(nb), nb))
    });
    let mut c = Counters {
        i_attn_v: 0,
        n_attn_v,
        i_ffn_down: 0,
        n_ffn_down,
    };
    let mut types = vec![GgmlType::F32; tensors.len()];
    for i in order {
        let (name, dims) = &tensors[i];
        if !is_quantizable(name, dims, rules) || matches!(ftype, FileType::F32) {
            continue; // stays F32
        }
        types[i] = {
            let attn_v_like = is_attn_v_like(name, rules);
            let ty = match ftype {
                // llama-quantize --pure: no mix at all (head and embedding included).
                _ if pure && rules.llama_quantize => base,
                FileType::Q4KM => {
                    let is_head = name == "output.weight" || (tied && name == "token_embd.weight");
                    if is_head {
                        GgmlType::Q6K
                    } else if attn_v_like {
                        let t = if use_more_bits(c.i_attn_v, c.n_attn_v) {
                            GgmlType::Q6K
                        } else {
                            base
                        };
                        c.i_attn_v += 1;
                        t
                    } else if name.contains("ffn_down") {
                        let t = if use_more_bits(c.i_ffn_down, c.n_ffn_down) {
                            GgmlType::Q6K
                        } else {
                            base
                        };
                        c.i_ffn_down += 1;
                        t
                    } else {
                        base
                    }
                }
                FileType::Q6K
                | FileType::Q5KM
                | FileType::Q4KS
                | FileType::Q3KM
                | FileType::Q3KS => k_mix_type(ftype, name, attn_v_like, tied, &mut c),
                FileType::Q4_0 | FileType::IQ4XS if !pure => {
                    more_mix_type(ftype, name, attn_v_like, tied, gqa, has_imatrix, &mut c)
                }
                FileType::Q4_1
                | FileType::Q5_0
                | FileType::Q5_1
                | FileType::Q2K
                | FileType::Q3KL
                | FileType::Q5KS
                | FileType::IQ4NL => {
                    more_mix_type(ftype, name, attn_v_like, tied, gqa, has_imatrix, &mut c)
                }
                _ => base,
            };
            fallback(ty, dims[0])
        };
    }
    types
}

/// The block number of `blk.N.…` (llama.cpp's `sscanf(name, "blk.%d.")`), -1 for the rest.
fn layer_of(name: &str) -> i64 {
    name.strip_prefix("blk.")
        .and_then(|r| r.split_once('.'))
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or(-1)
}

/// llama.cpp's `qs.i_attention_wv` / `qs.n_attention_wv` and `qs.i_ffn_down` /
/// `qs.n_ffn_down`: tensors of that kind seen so far, and in all.
struct Counters {
    i_attn_v: usize,
    n_attn_v: usize,
    i_ffn_down: usize,
    n_ffn_down: usize,
}

/// The other k-quant mixes of `llama_tensor_get_type` (Q4_K_M keeps its own branch above).
/// `attn_v_like`: the tensor takes `attn_v`'s rules ([`is_attn_v_like`]).
fn k_mix_type(
    ftype: FileType,
    name: &str,
    attn_v_like: bool,
    tied: bool,
    c: &mut Counters,
) -> GgmlType {
    use GgmlType::{Q4K, Q5K, Q6K};
    let base = ftype.base_type();
    if name == "output.weight" || (tied && name == "token_embd.weight") {
        return Q6K;
    }
    if attn_v_like {
        let i = c.i_attn_v;
        c.i_attn_v += 1;
        return match ftype {
            FileType::Q3KM if i < 2 => Q5K,
            FileType::Q3KM => Q4K,
            FileType::Q5KM if use_more_bits(i, c.n_attn_v) => Q6K,
            FileType::Q4KS if i < 4 => Q5K,
            _ => base,
        };
    }
    if name.contains("ffn_down") {
        let i = c.i_ffn_down;
        c.i_ffn_down += 1;
        return match ftype {
            FileType::Q3KM if i < c.n_ffn_down / 16 => Q5K,
            FileType::Q3KM => Q4K,
            FileType::Q5KM if use_more_bits(i, c.n_ffn_down) => Q6K,
            FileType::Q4KS if i < c.n_ffn_down / 8 => Q5K,
            _ => base,
        };
    }
    if name.contains("attn_output.weight") && ftype == FileType::Q3KM {
        return Q4K;
    }
    base
}

/// `llama_tensor_get_type` for the types `redline quantize` adds (Q4_1, Q5_0, Q5_1, Q2_K,
/// Q3_K_L, Q5_K_S, IQ4_NL), without an imatrix: the head goes to Q6_K (no per-tensor rules for
/// Q4_1 / Q5_0 / Q5_1 / Q5_K_S beyond that).
fn more_mix_type(
    ftype: FileType,
    name: &str,
    attn_v_like: bool,
    tied: bool,
    gqa: u64,
    has_imatrix: bool,
    c: &mut Counters,
) -> GgmlType {
    use GgmlType::{Q3K, Q4K, Q5K, Q6K};
    let base = ftype.base_type();
    if name == "output.weight" || (tied && name == "token_embd.weight") {
        return Q6K;
    }
    if attn_v_like {
        c.i_attn_v += 1;
        return match ftype {
            FileType::Q2K if gqa >= 4 => Q4K,
            FileType::Q2K => Q3K,
            FileType::Q3KL => Q5K,
            FileType::IQ4NL | FileType::IQ4XS if gqa >= 4 => Q5K,
            _ => base,
        };
    }
    if name.contains("ffn_down") {
        let i = c.i_ffn_down;
        c.i_ffn_down += 1;
        return match ftype {
            FileType::Q2K => Q3K,
            FileType::Q3KL => Q5K,
            FileType::IQ4NL | FileType::IQ4XS if i < c.n_ffn_down / 8 && !has_imatrix => Q5K,
            FileType::Q4_0 if i < c.n_ffn_down / 8 && has_imatrix => GgmlType::Q4_1,
            FileType::Q5_0 if i < c.n_ffn_down / 8 && has_imatrix => GgmlType::Q5_1,
            _ => base,
        };
    }
    if name.contains("attn_output.weight") {
        return match ftype {
            FileType::Q2K => Q3K,
            FileType::Q3KL => Q5K,
            _ => base,
        };
    }
    base
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::shape::Shape;

    /// Bytes of tensor data as written with 32-byte alignment, without the header.
    fn data_bytes(shape: &Shape, ftype: FileType) -> u64 {
        let tensors = shape.tensors();
        let types = plan_types(&tensors, ftype);
        tensors
            .iter()
            .zip(types)
            .map(|((_, d), ty)| ty.bytes_for(d.iter().product()).unwrap().div_ceil(32) * 32)
            .sum()
    }

    fn gb(x: u64) -> f64 {
        x as f64 / 1e9
    }

    #[test]
    fn use_more_bits_matches_llama_cpp() {
        // n = 28 (Qwen2.5-1.5B): n/8 = 3, 7n/8 = 24; middle layers 5, 8, … 23.
        let more: Vec<usize> = (0..28).filter(|&i| use_more_bits(i, 28)).collect();
        assert_eq!(
            more,
            vec![0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 24, 25, 26, 27]
        );
    }

    // File sizes of the peer's files (shared/BENCHMARKING.md). Our header adds a few MB of
    // tokenizer metadata, so the tensor data must come within 0.02 GB below the file size.
    fn assert_size(shape: Shape, ftype: FileType, file_gb: f64) {
        let got = gb(data_bytes(&shape, ftype));
        assert!(
            got <= file_gb + 0.005 && got > file_gb - 0.02,
            "{} {}: {got:.3} GB of tensors, file {file_gb} GB",
            shape.name,
            ftype.name()
        );
    }

    #[test]
    fn qwen2_5_32b_sizes() {
        assert_size(Shape::qwen2_5_32b(), FileType::Q4KM, 19.85);
        assert_size(Shape::qwen2_5_32b(), FileType::IQ4XS, 17.41);
    }

    #[test]
    fn qwen3_5_27b_sizes() {
        assert_size(Shape::qwen3_5_27b(), FileType::Q4KM, 16.29);
        assert_size(Shape::qwen3_5_27b(), FileType::IQ4XS, 14.38);
    }

    #[test]
    fn qwen2_5_1_5b_sizes() {
        assert_size(Shape::qwen2_5_1_5b(), FileType::Q4KM, 1.11);
        assert_size(Shape::qwen2_5_1_5b(), FileType::Q4_0, 1.00);
    }

    #[test]
    fn llama3_8b_q4_k_m_size() {
        // Meta-Llama-3-8B Q4_K_M as published by llama.cpp users: 4.92 GB.
        assert_size(Shape::llama3_8b(), FileType::Q4KM, 4.92);
    }

    /// Published sizes of Llama-3-8B quants (bartowski's Meta-Llama-3-8B-Instruct-GGUF, made by
    /// llama-quantize with these rules), within 1 %.
    #[test]
    fn llama3_8b_other_k_mixes_sizes() {
        for (ftype, file_gb) in [
            (FileType::Q8_0, 8.54),
            (FileType::Q6K, 6.60),
            (FileType::Q5KM, 5.73),
            (FileType::Q4KS, 4.69),
            (FileType::Q3KM, 4.02),
            (FileType::Q3KS, 3.66),
        ] {
            let got = gb(data_bytes(&Shape::llama3_8b(), ftype));
            assert!(
                (got / file_gb - 1.0).abs() < 0.01,
                "{}: {got:.3} GB of tensors, published file {file_gb} GB",
                ftype.name()
            );
        }
    }

    #[test]
    fn k_mix_rules_per_tensor() {
        let s = Shape::llama3_8b(); // 32 layers
        let t = s.tensors();
        let get = |ftype: FileType, n: &str| {
            plan_types(&t, ftype)[t.iter().position(|(x, _)| x == n).unwrap()]
        };
        use GgmlType::*;
        assert_eq!(get(FileType::Q3KM, "output.weight"), Q6K);
        assert_eq!(get(FileType::Q3KM, "token_embd.weight"), Q3K);
        assert_eq!(get(FileType::Q3KM, "blk.1.attn_v.weight"), Q5K);
        assert_eq!(get(FileType::Q3KM, "blk.2.attn_v.weight"), Q4K);
        assert_eq!(get(FileType::Q3KM, "blk.1.ffn_down.weight"), Q5K);
        assert_eq!(get(FileType::Q3KM, "blk.2.ffn_down.weight"), Q4K);
        assert_eq!(get(FileType::Q3KM, "blk.2.attn_output.weight"), Q4K);
        assert_eq!(get(FileType::Q3KM, "blk.2.ffn_up.weight"), Q3K);
        assert_eq!(get(FileType::Q3KS, "blk.0.attn_v.weight"), Q3K);
        assert_eq!(get(FileType::Q3KS, "output.weight"), Q6K);
        assert_eq!(get(FileType::Q4KS, "blk.3.attn_v.weight"), Q5K);
        assert_eq!(get(FileType::Q4KS, "blk.4.attn_v.weight"), Q4K);
        assert_eq!(get(FileType::Q4KS, "blk.3.ffn_down.weight"), Q5K);
        assert_eq!(get(FileType::Q4KS, "blk.4.ffn_down.weight"), Q4K);
        assert_eq!(get(FileType::Q5KM, "blk.0.attn_v.weight"), Q6K);
        assert_eq!(get(FileType::Q5KM, "blk.4.attn_v.weight"), Q5K);
        assert_eq!(get(FileType::Q5KM, "blk.6.ffn_down.weight"), Q6K);
        assert_eq!(get(FileType::Q6K, "blk.9.ffn_gate.weight"), Q6K);
        assert_eq!(get(FileType::Q8_0, "output.weight"), Q8_0);
    }

    #[test]
    fn q4_k_m_mix_per_tensor() {
        let s = Shape::qwen2_5_1_5b();
        let t = s.tensors();
        let ty = plan_types(&t, FileType::Q4KM);
        let get = |n: &str| ty[t.iter().position(|(x, _)| x == n).unwrap()];
        assert_eq!(get("token_embd.weight"), GgmlType::Q4K);
        assert_eq!(get("output.weight"), GgmlType::Q6K);
        assert_eq!(get("output_norm.weight"), GgmlType::F32);
        assert_eq!(get("blk.0.attn_q.bias"), GgmlType::F32);
        assert_eq!(get("blk.0.attn_v.weight"), GgmlType::Q6K);
        assert_eq!(get("blk.3.attn_v.weight"), GgmlType::Q4K);
        assert_eq!(get("blk.5.ffn_down.weight"), GgmlType::Q6K);
        assert_eq!(get("blk.6.ffn_down.weight"), GgmlType::Q4K);
        assert_eq!(get("blk.6.ffn_up.weight"), GgmlType::Q4K);
        // Tied embeddings: the embedding is the head, so it gets the head's type.
        let tied = Shape {
            tied_embeddings: true,
            ..Shape::qwen2_5_1_5b()
        };
        let t = tied.tensors();
        assert_eq!(plan_types(&t, FileType::Q4KM)[0], GgmlType::Q6K);
        assert_eq!(plan_types(&t, FileType::Q4_0)[0], GgmlType::Q4_0);
    }

    #[test]
    fn more_mix_rules_per_tensor() {
        let s = Shape::llama3_8b(); // 32 layers, 32 q heads over 8 kv heads: gqa 4
        let t = s.tensors();
        let get = |ftype: FileType, n: &str| {
            plan_types(&t, ftype)[t.iter().position(|(x, _)| x == n).unwrap()]
        };
        use GgmlType::*;
        assert_eq!(get(FileType::Q2K, "output.weight"), Q6K);
        assert_eq!(get(FileType::Q2K, "blk.0.attn_v.weight"), Q4K);
        assert_eq!(get(FileType::Q2K, "blk.0.ffn_down.weight"), Q3K);
        assert_eq!(get(FileType::Q2K, "blk.0.attn_output.weight"), Q3K);
        assert_eq!(get(FileType::Q2K, "blk.0.ffn_up.weight"), Q2K);
        assert_eq!(get(FileType::Q3KL, "blk.9.attn_v.weight"), Q5K);
        assert_eq!(get(FileType::Q3KL, "blk.9.ffn_down.weight"), Q5K);
        assert_eq!(get(FileType::Q3KL, "blk.9.ffn_gate.weight"), Q3K);
        assert_eq!(get(FileType::IQ4NL, "blk.3.ffn_down.weight"), Q5K);
        assert_eq!(get(FileType::IQ4NL, "blk.4.ffn_down.weight"), IQ4NL);
        assert_eq!(get(FileType::IQ4NL, "blk.4.attn_v.weight"), Q5K);
        assert_eq!(get(FileType::Q5_1, "output.weight"), Q6K);
        assert_eq!(get(FileType::Q5_1, "blk.0.attn_v.weight"), Q5_1);
        assert_eq!(get(FileType::Q5KS, "blk.0.attn_v.weight"), Q5K);
        assert_eq!(get(FileType::BF16, "blk.0.attn_v.weight"), BF16);
        assert_eq!(FileType::from_name("q3_k_l"), Some(FileType::Q3KL));
        // Q4_0 / IQ4_XS: pure in plan_types, llama-quantize's rules in plan_types_default.
        let def = |ftype: FileType, n: &str| {
            plan_types_default(&t, ftype)[t.iter().position(|(x, _)| x == n).unwrap()]
        };
        assert_eq!(get(FileType::Q4_0, "output.weight"), Q4_0);
        assert_eq!(def(FileType::Q4_0, "output.weight"), Q6K);
        assert_eq!(def(FileType::Q4_0, "blk.0.ffn_down.weight"), Q4_0);
        assert_eq!(def(FileType::IQ4XS, "output.weight"), Q6K);
        assert_eq!(def(FileType::IQ4XS, "blk.0.attn_v.weight"), Q5K);
        assert_eq!(def(FileType::IQ4XS, "blk.3.ffn_down.weight"), Q5K);
        assert_eq!(def(FileType::IQ4XS, "blk.4.ffn_down.weight"), IQ4XS);
        assert_eq!(def(FileType::Q4KM, "blk.0.attn_v.weight"), Q6K);
        let imat = |ftype: FileType, n: &str| {
            plan_types_for_quantize(&t, ftype, false, true)
                [t.iter().position(|(x, _)| x == n).unwrap()]
        };
        assert_eq!(imat(FileType::IQ4XS, "blk.3.ffn_down.weight"), IQ4XS);
        assert_eq!(imat(FileType::Q4_0, "blk.3.ffn_down.weight"), Q4_1);
        assert_eq!(imat(FileType::Q4_0, "blk.4.ffn_down.weight"), Q4_0);
        assert_eq!(imat(FileType::Q5_0, "blk.0.ffn_down.weight"), Q5_1);
    }

    /// Qwen3.5's `attn_q` holds query and gate (twice the query rows): the GQA rules must see
    /// n_head / n_head_kv (llama.cpp's `n_gqa()`), not twice that.
    #[test]
    fn gated_attention_does_not_double_the_gqa() {
        let s = Shape {
            n_head: 8,
            n_head_kv: 4, // gqa 2: the attn_v bumps of GQA >= 4 must not apply
            ..Shape::qwen3_5_27b()
        };
        let t = s.tensors();
        let v = t
            .iter()
            .position(|(n, _)| n.ends_with("attn_v.weight"))
            .unwrap();
        let q = t
            .iter()
            .position(|(n, _)| n.ends_with("attn_q.weight"))
            .unwrap();
        assert_eq!(t[q].1[1], 2 * t[v].1[1] * 2, "attn_q: query + gate rows");
        use GgmlType::*;
        assert_eq!(plan_types_default(&t, FileType::IQ4XS)[v], IQ4XS);
        assert_eq!(plan_types(&t, FileType::Q2K)[v], Q3K);
        let real = Shape::qwen3_5_27b(); // 24 / 4 = 6: bumped
        let t = real.tensors();
        assert_eq!(plan_types_default(&t, FileType::IQ4XS)[v], Q5K);
        assert_eq!(plan_types(&t, FileType::Q2K)[v], Q4K);
    }

    /// `redline quantize` on Qwen3.5 follows llama.cpp 0c1e570 (src/llama-quant.cpp:
    /// `category_is_attn_v` takes ATTENTION_QKV, counted in `n_attention_wv` too): the DeltaNet
    /// `attn_qkv` takes `attn_v`'s bumps and shares its layer counter. Measured before choosing
    /// (BENCHMARKS.md, Quantization quality, "Qwen3.5 mix rules decided by measurement"): on the
    /// fixture the first layer's `attn_qkv` bump cuts KL divergence by 15-17 % (Q4_K_S, Q3_K_M,
    /// Q3_K_L) at +1-2.4 % size; on a 16-layer synthetic with GQA 4 the rule cuts it by 6-10 %
    /// (Q4_K_M, Q4_K_S, IQ4_XS, Q5_K_M) at +0.6-3.4 %: more KL per byte than the type steps.
    /// The peer-file mix of `plan_types` (synthetic speed files, planner) keeps the base type.
    #[test]
    fn qwen35_attn_qkv_counts_with_attn_v_in_quantize_rules() {
        let s = Shape::qwen3_5_27b(); // 48 DeltaNet attn_qkv + 16 attn_v; GQA 24 / 4 = 6
        let t = s.tensors();
        let at = |n: &str| t.iter().position(|(x, _)| x == n).unwrap();
        let q = |ftype: FileType, n: &str| plan_types_default(&t, ftype)[at(n)];
        use GgmlType::*;
        // Q4_K_M / Q5_K_M: use_more_bits over all 64 attn_v-like tensors, one per layer, so the
        // index is the layer: 0..8, 56..64 and every third from 10 (10, 13, …, 55).
        for (il, more) in [
            (0, true),
            (7, true),
            (8, false),
            (10, true),
            (11, false),
            (55, true),
        ] {
            let kind = if il % 4 == 3 { "attn_v" } else { "attn_qkv" };
            let name = format!("blk.{il}.{kind}.weight");
            let want = if more { Q6K } else { Q4K };
            assert_eq!(q(FileType::Q4KM, &name), want, "Q4_K_M {name}");
            let want = if more { Q6K } else { Q5K };
            assert_eq!(q(FileType::Q5KM, &name), want, "Q5_K_M {name}");
        }
        assert_eq!(q(FileType::Q4KM, "blk.63.attn_v.weight"), Q6K);
        // Q4_K_S: the first four attn_v-like tensors (layers 0-3) at Q5_K.
        assert_eq!(q(FileType::Q4KS, "blk.2.attn_qkv.weight"), Q5K);
        assert_eq!(q(FileType::Q4KS, "blk.3.attn_v.weight"), Q5K);
        assert_eq!(q(FileType::Q4KS, "blk.4.attn_qkv.weight"), Q4K);
        assert_eq!(q(FileType::Q4KS, "blk.7.attn_v.weight"), Q4K);
        // Q3_K_M: first two Q5_K, the rest Q4_K; Q3_K_L: Q5_K; GQA >= 4: IQ4 at Q5_K, Q2_K at Q4_K.
        assert_eq!(q(FileType::Q3KM, "blk.1.attn_qkv.weight"), Q5K);
        assert_eq!(q(FileType::Q3KM, "blk.2.attn_qkv.weight"), Q4K);
        assert_eq!(q(FileType::Q3KL, "blk.9.attn_qkv.weight"), Q5K);
        assert_eq!(q(FileType::IQ4XS, "blk.9.attn_qkv.weight"), Q5K);
        assert_eq!(q(FileType::IQ4NL, "blk.9.attn_qkv.weight"), Q5K);
        assert_eq!(q(FileType::Q2K, "blk.9.attn_qkv.weight"), Q4K);
        // No attn_v rule: the base type.
        assert_eq!(q(FileType::Q3KS, "blk.0.attn_qkv.weight"), Q3K);
        assert_eq!(q(FileType::Q4_0, "blk.0.attn_qkv.weight"), Q4_0);
        // The peer-file mix (synthetic files, planner) keeps attn_qkv at the base type.
        assert_eq!(
            plan_types(&t, FileType::Q4KM)[at("blk.0.attn_qkv.weight")],
            Q4K
        );
        assert_eq!(
            plan_types(&t, FileType::Q4KM)[at("blk.3.attn_v.weight")],
            Q6K
        );
    }

    /// llama.cpp 0c1e570 quantizes Qwen3.5's `ssm_alpha` / `ssm_beta` ([n_embd, n_v_heads]) like
    /// any 2-D weight (no rule names them; its converter writes them Q8_0 as well). Keeping them
    /// F32 measured 0.1-0.8 % lower KL for +0.7-2.1 % size (fixture and 16-layer synthetic), less
    /// than a type step buys per byte, so `redline quantize` quantizes them; the peer-file mix
    /// keeps them F32.
    #[test]
    fn qwen35_ssm_alpha_beta_are_quantized_by_quantize_rules() {
        let s = Shape::qwen3_5_27b();
        let t = s.tensors();
        let at = |n: &str| t.iter().position(|(x, _)| x == n).unwrap();
        use GgmlType::*;
        for name in ["blk.0.ssm_alpha.weight", "blk.62.ssm_beta.weight"] {
            assert_eq!(plan_types_default(&t, FileType::Q4KM)[at(name)], Q4K);
            assert_eq!(plan_types_default(&t, FileType::IQ4XS)[at(name)], IQ4XS);
            assert_eq!(plan_types_default(&t, FileType::Q8_0)[at(name)], Q8_0);
            assert_eq!(
                plan_types_for_quantize(&t, FileType::Q4KM, true, false)[at(name)],
                Q4K
            );
            assert_eq!(plan_types(&t, FileType::Q4KM)[at(name)], F32);
        }
        // The rest of the DeltaNet block is as before.
        assert_eq!(
            plan_types_default(&t, FileType::Q4KM)[at("blk.0.ssm_conv1d.weight")],
            F32
        );
        assert_eq!(
            plan_types_default(&t, FileType::Q4KM)[at("blk.0.ssm_out.weight")],
            Q4K
        );
    }

    /// What the llama-quantize rules cost on the 27B next to the peer files' mix (which equals
    /// them for the K-mixes except for these two rules): Q4_K_M +0.324 GB of Q6_K `attn_qkv`
    /// (24 of 48) − 0.081 GB of quantized `ssm_alpha` / `ssm_beta` = +0.243 GB (+1.5 %); Q5_K_M
    /// +0.167 − 0.078 GB. (IQ4_XS, GQA 6: all 48 `attn_qkv` at Q5_K, +0.393 − 0.082 GB.)
    #[test]
    fn qwen35_quantize_rules_size_on_the_27b() {
        let s = Shape::qwen3_5_27b();
        let t = s.tensors();
        let gb = |types: Vec<GgmlType>| -> f64 {
            t.iter()
                .zip(types)
                .map(|((_, d), ty)| ty.bytes_for(d.iter().product()).unwrap() as f64)
                .sum::<f64>()
                / 1e9
        };
        for (ftype, delta) in [(FileType::Q4KM, 0.243), (FileType::Q5KM, 0.089)] {
            let got = gb(plan_types_default(&t, ftype)) - gb(plan_types(&t, ftype));
            assert!(
                (got - delta).abs() < 0.002,
                "{}: {got:.4} GB over the peer mix, want {delta}",
                ftype.name()
            );
        }
    }

    /// llama-quantize --pure: every quantizable tensor at the base type, head included.
    #[test]
    fn pure_quantize_has_no_mix() {
        let s = Shape::llama3_8b();
        let t = s.tensors();
        let pure = plan_types_for_quantize(&t, FileType::Q4KM, true, false);
        for ((name, dims), ty) in t.iter().zip(pure) {
            let want = if dims.len() < 2 || name.contains("_norm") {
                GgmlType::F32
            } else {
                GgmlType::Q4K
            };
            assert_eq!(ty, want, "{name}");
        }
    }

    /// The layer counters follow llama-quantize's walk (layer number, then name), not the file
    /// order: a file listing blk.0, blk.1, blk.10, … blk.2 (HF converters sort by name) gets
    /// the same type per tensor as one in layer order.
    #[test]
    fn counters_follow_layer_order_not_file_order() {
        for shape in [Shape::qwen2_5_1_5b(), Shape::qwen3_5_27b()] {
            let t = shape.tensors();
            let mut by_name = t.clone();
            by_name.sort_by(|a, b| a.0.cmp(&b.0));
            assert_ne!(by_name, t);
            for ftype in [
                FileType::Q4KM,
                FileType::Q3KM,
                FileType::IQ4XS,
                FileType::Q5KM,
            ] {
                let want = plan_types_default(&t, ftype);
                let got = plan_types_default(&by_name, ftype);
                for ((name, _), ty) in by_name.iter().zip(got) {
                    let i = t.iter().position(|(n, _)| n == name).unwrap();
                    assert_eq!(ty, want[i], "{} {} {name}", shape.name, ftype.name());
                }
            }
        }
        assert_eq!(layer_of("blk.12.ffn_down.weight"), 12);
        assert_eq!(layer_of("output.weight"), -1);
        assert_eq!(layer_of("blk.x.attn_v.weight"), -1);
    }

    #[test]
    fn odd_row_lengths_fall_back() {
        assert_eq!(fallback(GgmlType::Q4K, 4096 + 32), GgmlType::Q5_0);
        assert_eq!(fallback(GgmlType::Q6K, 96), GgmlType::Q8_0);
        assert_eq!(fallback(GgmlType::IQ4XS, 96), GgmlType::IQ4NL);
        assert_eq!(fallback(GgmlType::Q4_0, 48), GgmlType::F16);
        assert_eq!(fallback(GgmlType::Q4K, 512), GgmlType::Q4K);
    }
}
