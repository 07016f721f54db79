//! Sizes of everything besides the weights: KV cache, recurrent state, compute buffers and the
//! runtime's own memory. All in bytes.

use backend::KvType;
use serde::Serialize;

use super::model_memory::{ModelMemory, RecurrentDims};

/// Device memory the runtime takes before any model byte, for cards without a measured figure
/// in the GPU table: the CUDA context (~0.3 GiB on a V100 or A100 under CUDA 12), the cuBLAS
/// handle and workspace, the NVRTC-compiled kernel modules and the CUDA graph of the decode step
/// (tens of MiB together), plus a margin for allocator fragmentation. On an H200 (CUDA 13,
/// driver 580) a bare context measured 527 MiB and context + cuBLAS + torch's modules 685 MiB,
/// so the Hopper entries use 700 MiB. At load the real figure is measured on the card.
pub const RUNTIME_OVERHEAD_BYTES: u64 = 512 << 20;

/// Rows of a micro-batch (tokens per forward call), llama.cpp's default `n_ubatch`.
pub const DEFAULT_UBATCH: usize = 512;

/// Tokens per chunk of the GPU's chunked DeltaNet prefill (CHUNK in crates/cuda's
/// backend/recurrent.rs and kernels/deltanet.cu).
const DELTANET_CHUNK: usize = 64;

/// KV positions one tile of prefill attention covers: scores are held for one tile at a time.
const ATTENTION_KV_TILE: u64 = 256;

/// Bytes of one stored row of `n` elements in `ty` (whole blocks, rounded up).
fn row_bytes(ty: KvType, n: usize) -> u64 {
    let g = ty.ggml_type();
    (n as u64).div_ceil(g.block_size() as u64) * g.type_size() as u64
}

/// KV bytes one token adds to one attention layer:
/// K row [n_head_kv × head_dim_k] in `k` + V row [n_head_kv × head_dim_v] in `v`
/// (f16 2 bytes/element, q8_0 34/32, q4_0 18/32).
pub fn kv_bytes_per_token_per_layer(m: &ModelMemory, k: KvType, v: KvType) -> u64 {
    row_bytes(k, m.n_head_kv * m.head_dim_k) + row_bytes(v, m.n_head_kv * m.head_dim_v)
}

/// KV bytes per token over all attention layers.
pub fn kv_bytes_per_token(m: &ModelMemory, k: KvType, v: KvType) -> u64 {
    m.n_attention_layers() as u64 * kv_bytes_per_token_per_layer(m, k, v)
}

/// Recurrent state of one sequence in one DeltaNet layer, f32: the conv window
/// [(kernel − 1), conv_channels] and the delta-rule matrices [n_v_heads, head_k_dim, head_v_dim].
pub fn recurrent_state_bytes_per_layer(d: &RecurrentDims) -> u64 {
    let conv = (d.conv_kernel.saturating_sub(1) * d.conv_channels) as u64;
    let delta = (d.n_v_heads * d.head_k_dim * d.head_v_dim) as u64;
    4 * (conv + delta)
}

/// Recurrent state of one sequence over all recurrent layers.
pub fn recurrent_state_bytes_per_seq(m: &ModelMemory) -> u64 {
    match &m.deltanet {
        Some(d) => m.n_recurrent_layers() as u64 * recurrent_state_bytes_per_layer(d),
        None => 0,
    }
}

/// Scratch buffers of one forward call over a micro-batch of `n_ubatch` rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ComputeBytes {
    /// Logits [n_ubatch, n_vocab] f32: the worst case is every row wanting logits (a decode
    /// batch of many slots, or verifying draft tokens).
    pub logits: u64,
    /// Activations live at once in one layer, f32 per row: the residual stream and its normed
    /// copy (2 × n_embd) plus the widest layer-internal set — FFN gate, up and their product
    /// (3 × n_ff), attention q (with gate), k, v and output (q_rows + 2 × kv_dim + q_dim), or
    /// DeltaNet conv channels, gate and output (conv_channels + 2 × value_dim + 2 × n_v_heads).
    pub activations: u64,
    /// The step scratch that prefill attention and the chunked DeltaNet prefill share (one
    /// block, reused by every layer), the larger of: tiled attention's scores for one KV tile
    /// of 256 positions and the output accumulator, [n_head, n_ubatch, 256 + head_dim_v] f32;
    /// the chunked delta rule's [n_v_heads, ceil(n_ubatch / 64) × 64, d_k + d_v + 65] f32.
    pub attention: u64,
}

impl ComputeBytes {
    pub fn total(&self) -> u64 {
        self.logits + self.activations + self.attention
    }
}

/// The compute-buffer estimate for `m` at micro-batch `n_ubatch` (documented on each field).
pub fn compute_bytes(m: &ModelMemory, n_ubatch: usize) -> ComputeBytes {
    let ub = n_ubatch as u64;
    let q_dim = (m.n_head * m.head_dim_k) as u64;
    let kv_dim = (m.n_head_kv * m.head_dim_k.max(m.head_dim_v)) as u64;
    // Qwen3.5's gated attention emits query and gate from attn_q.
    let q_rows = if m.arch == "qwen35" { 2 * q_dim } else { q_dim };
    let attn_width = q_rows + 2 * kv_dim + q_dim;
    let ffn_width = 3 * m.n_ff as u64;
    let deltanet_width = m.deltanet.map_or(0, |d| {
        (d.conv_channels + 2 * d.n_v_heads * d.head_v_dim + 2 * d.n_v_heads) as u64
    });
    let per_row = 2 * m.n_embd as u64 + attn_width.max(ffn_width).max(deltanet_width);
    let attention = if m.n_attention_layers() > 0 {
        4 * m.n_head as u64 * ub * (ATTENTION_KV_TILE + m.head_dim_v as u64)
    } else {
        0
    };
    let deltanet_chunked = m.deltanet.map_or(0, |d| {
        let rows = n_ubatch.div_ceil(DELTANET_CHUNK) * DELTANET_CHUNK;
        4 * (d.n_v_heads * rows * (d.head_k_dim + d.head_v_dim + DELTANET_CHUNK + 1)) as u64
    });
    ComputeBytes {
        logits: 4 * ub * m.n_vocab as u64,
        activations: 4 * ub * per_row,
        attention: attention.max(deltanet_chunked),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::{FileType, Shape};

    #[test]
    fn kv_bytes_by_hand() {
        // Llama-3-8B: 32 layers × 8 KV heads × 128 × (K + V); f16 = 128 KiB per token.
        let m = ModelMemory::from_shape(&Shape::llama3_8b(), FileType::Q4KM);
        assert_eq!(kv_bytes_per_token(&m, KvType::F16, KvType::F16), 131072);
        assert_eq!(
            kv_bytes_per_token(&m, KvType::Q8_0, KvType::Q8_0),
            32 * 2 * 1024 / 32 * 34
        );
        assert_eq!(
            kv_bytes_per_token(&m, KvType::F16, KvType::Q4_0),
            32 * (2048 + 1024 / 32 * 18)
        );
        // Qwen3.5-27B: 16 attention layers × 4 KV heads × 256 × (K + V) × 2 = 64 KiB per token.
        let q = ModelMemory::from_shape(&Shape::qwen3_5_27b(), FileType::Q4KM);
        assert_eq!(kv_bytes_per_token(&q, KvType::F16, KvType::F16), 65536);
        assert_eq!(kv_bytes_per_token(&q, KvType::Q8_0, KvType::Q8_0), 34816);
        // Qwen2.5-32B: 64 × 8 × 128 × 2 × 2 = 256 KiB per token.
        let q = ModelMemory::from_shape(&Shape::qwen2_5_32b(), FileType::Q4KM);
        assert_eq!(kv_bytes_per_token(&q, KvType::F16, KvType::F16), 262144);
    }

    #[test]
    fn qwen35_recurrent_state_by_hand() {
        // 48 DeltaNet layers: conv 3 × 10240 f32 + 48 heads × 128 × 128 f32.
        let q = ModelMemory::from_shape(&Shape::qwen3_5_27b(), FileType::Q4KM);
        let per_layer = 4 * (3 * 10240 + 48 * 128 * 128);
        assert_eq!(per_layer, 3_268_608);
        assert_eq!(recurrent_state_bytes_per_seq(&q), 48 * per_layer);
        let l = ModelMemory::from_shape(&Shape::llama3_8b(), FileType::Q4KM);
        assert_eq!(recurrent_state_bytes_per_seq(&l), 0);
    }

    #[test]
    fn compute_bytes_for_qwen35_27b() {
        let q = ModelMemory::from_shape(&Shape::qwen3_5_27b(), FileType::Q4KM);
        let c = compute_bytes(&q, 512);
        assert_eq!(c.logits, 4 * 512 * 248320);
        // widest: FFN 3 × 17408 = 52224 > attention 12288 + 2048 + 6144, + 2 × 5120
        assert_eq!(c.activations, 4 * 512 * (52224 + 10240));
        // chunked DeltaNet scratch 48 v-heads × 512 × (128 + 128 + 65) = 31.6 MB is larger
        // than tiled attention's 24 heads × 512 × (256 + 256) = 25.2 MB
        assert_eq!(c.attention, 4 * 48 * 512 * (128 + 128 + 65));
        assert!(c.attention > 4 * 24 * 512 * (256 + 256));
    }
}
