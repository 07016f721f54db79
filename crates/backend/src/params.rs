//! Plain parameter types shared by every backend.

use std::fmt;

/// One row of a batch: the token at position `pos` of sequence `seq` (an index into the slice
/// of per-sequence states given to the op).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Row {
    pub seq: usize,
    pub pos: usize,
}

/// Element type of the KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum KvType {
    F32,
    #[default]
    F16,
    Q8_0,
    Q4_0,
}

impl KvType {
    /// The ggml type rows are stored in.
    pub fn ggml_type(self) -> gguf::GgmlType {
        match self {
            KvType::F32 => gguf::GgmlType::F32,
            KvType::F16 => gguf::GgmlType::F16,
            KvType::Q8_0 => gguf::GgmlType::Q8_0,
            KvType::Q4_0 => gguf::GgmlType::Q4_0,
        }
    }

    /// Parses `f32`, `f16`, `q8_0`, `q4_0` (case-insensitive).
    pub fn from_name(name: &str) -> Option<KvType> {
        match name.to_ascii_lowercase().as_str() {
            "f32" => Some(KvType::F32),
            "f16" => Some(KvType::F16),
            "q8_0" => Some(KvType::Q8_0),
            "q4_0" => Some(KvType::Q4_0),
            _ => None,
        }
    }

    /// Bytes of one stored row of `n` elements, if `n` fits the block size.
    pub fn row_bytes(self, n: usize) -> Option<usize> {
        self.ggml_type().bytes_for(n as u64).map(|b| b as usize)
    }
}

impl fmt::Display for KvType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.ggml_type().name())
    }
}

/// Which dimensions of a head a rotary embedding pairs up (ggml `rope_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeMode {
    /// Adjacent pairs `(2i, 2i+1)`: llama (the converter permutes Q/K to match).
    Normal,
    /// Halves `(i, i + n_rot/2)`: GPT-NeoX, Qwen2/3.
    Neox,
    /// Multimodal RoPE, NeoX pairing, pair i takes its position from section
    /// `sections` (interleaved: pair i uses section `i % 3` while that section lasts, as
    /// ggml's IMROPE). For text all sections carry the same position, so this equals `Neox`;
    /// the sections are kept so image positions can be added later.
    Mrope {
        sections: [u32; 4],
        interleaved: bool,
    },
}

/// Rotary embedding parameters (ggml `rope_ext`).
#[derive(Debug, Clone, PartialEq)]
pub struct RopeParams {
    pub mode: RopeMode,
    /// Rotated dims per head (≤ head_dim, even).
    pub n_rot: usize,
    pub freq_base: f32,
    /// Linear position scaling: positions are multiplied by this (1 / factor).
    pub freq_scale: f32,
    /// Per-pair frequency divisors (Llama 3.1 `rope_freqs.weight`), `n_rot / 2` values.
    pub freq_factors: Option<Vec<f32>>,
}

impl RopeParams {
    /// The angle of pair `i` at position `pos`: `pos · scale · base^(-2i/n_rot) / factor[i]`.
    pub fn theta(&self, pos: f32, i: usize) -> f32 {
        let inv_freq = self.freq_base.powf(-2.0 * i as f32 / self.n_rot as f32);
        let f = self.freq_factors.as_ref().map_or(1.0, |f| f[i]);
        pos * self.freq_scale * inv_freq / f
    }
}

/// Dimensions of an attention layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionParams {
    pub n_head: usize,
    pub n_kv_head: usize,
    pub head_dim_k: usize,
    pub head_dim_v: usize,
    /// Score scale, usually `1 / sqrt(head_dim_k)`.
    pub scale: f32,
}

/// A strided copy of column blocks: for every row and `b in 0..n_blocks`, copies `width`
/// columns from `src[row][src_offset + b * src_stride ..]` to
/// `dst[row][dst_offset + b * dst_stride ..]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ColumnCopy {
    pub n_blocks: usize,
    pub width: usize,
    pub src_offset: usize,
    pub src_stride: usize,
    pub dst_offset: usize,
    pub dst_stride: usize,
}

impl ColumnCopy {
    /// One contiguous block of `width` columns.
    pub fn contiguous(src_offset: usize, width: usize, dst_offset: usize) -> ColumnCopy {
        ColumnCopy {
            n_blocks: 1,
            width,
            src_offset,
            src_stride: 0,
            dst_offset,
            dst_stride: 0,
        }
    }
}

/// Dimensions of one Gated DeltaNet layer's recurrent state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecurrentShape {
    /// Conv kernel size (the window keeps `d_conv - 1` inputs).
    pub d_conv: usize,
    /// Conv channels: `2 * n_k_heads * d_k + n_v_heads * d_v`.
    pub conv_channels: usize,
    pub n_k_heads: usize,
    pub n_v_heads: usize,
    pub d_k: usize,
    pub d_v: usize,
}
