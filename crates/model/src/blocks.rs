//! Blocks shared by the architectures: the batch description, multi-head attention with
//! optional QKV bias and q/k norm, the SwiGLU MLP, and the pre-norm transformer layer.

use backend::{AttentionParams, AttnBlock, Backend, Row};

use crate::config::ModelConfig;
use crate::loader::Loader;
use crate::ModelError;

/// The rows of one forward call: row r is the token at `rows[r].pos` of sequence
/// `rows[r].seq`. `positions[r] == rows[r].pos` (as u32, for RoPE).
pub struct Batch {
    pub rows: Vec<Row>,
    pub positions: Vec<u32>,
}

impl Batch {
    pub fn new(rows: Vec<Row>) -> Batch {
        let positions = rows.iter().map(|r| r.pos as u32).collect();
        Batch { rows, positions }
    }

    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }
}

/// `out = x · wᵀ` into a fresh `[n, out_cols]` tensor.
pub fn linear<B: Backend>(b: &B, w: &B::Weight, x: &B::Tensor) -> Result<B::Tensor, ModelError> {
    let (n, _) = b.shape(x);
    let (m, _) = b.weight_shape(w);
    let mut out = b.zeros(n, m);
    b.matmul(w, x, &mut out)?;
    Ok(out)
}

/// `rms_norm(x) * w` into a fresh tensor.
pub fn norm<B: Backend>(
    b: &B,
    w: &B::Weight,
    x: &B::Tensor,
    eps: f32,
) -> Result<B::Tensor, ModelError> {
    let (n, c) = b.shape(x);
    let mut out = b.zeros(n, c);
    b.rms_norm(x, w, eps, &mut out)?;
    Ok(out)
}

/// Standard attention weights (llama, qwen2, qwen3).
pub struct AttnWeights<B: Backend> {
    pub wq: B::Weight,
    pub wk: B::Weight,
    pub wv: B::Weight,
    pub wo: B::Weight,
    pub bq: Option<B::Weight>,
    pub bk: Option<B::Weight>,
    pub bv: Option<B::Weight>,
    /// Per-head RMS norm of q and k before RoPE (qwen3), `[head_dim]`.
    pub q_norm: Option<B::Weight>,
    pub k_norm: Option<B::Weight>,
}

/// Which optional attention tensors an architecture has.
#[derive(Debug, Clone, Copy)]
pub struct AttnOptions {
    pub qk_norm: bool,
}

impl<B: Backend> AttnWeights<B> {
    pub fn load(
        l: &Loader<B>,
        cfg: &ModelConfig,
        il: usize,
        opts: AttnOptions,
    ) -> Result<Self, ModelError> {
        let (e, hk, hv) = (cfg.n_embd, cfg.head_dim_k, cfg.head_dim_v);
        let (q_dim, k_dim, v_dim) = (cfg.n_head * hk, cfg.n_head_kv * hk, cfg.n_head_kv * hv);
        let norm = |name: &str| -> Result<Option<B::Weight>, ModelError> {
            if opts.qk_norm {
                l.layer(il, name, &[hk]).map(Some)
            } else {
                Ok(None)
            }
        };
        Ok(AttnWeights {
            wq: l.layer(il, "attn_q.weight", &[e, q_dim])?,
            wk: l.layer(il, "attn_k.weight", &[e, k_dim])?,
            wv: l.layer(il, "attn_v.weight", &[e, v_dim])?,
            wo: l.layer(il, "attn_output.weight", &[cfg.n_head * hv, e])?,
            bq: l.layer_optional(il, "attn_q.bias", &[q_dim])?,
            bk: l.layer_optional(il, "attn_k.bias", &[k_dim])?,
            bv: l.layer_optional(il, "attn_v.bias", &[v_dim])?,
            q_norm: norm("attn_q_norm.weight")?,
            k_norm: norm("attn_k_norm.weight")?,
        })
    }
}

pub fn attention_params(cfg: &ModelConfig) -> AttentionParams {
    AttentionParams {
        n_head: cfg.n_head,
        n_kv_head: cfg.n_head_kv,
        head_dim_k: cfg.head_dim_k,
        head_dim_v: cfg.head_dim_v,
        scale: cfg.attn_scale,
    }
}

/// Self-attention of the normed input `h` (`[n, n_embd]`), added to the residual stream
/// `x` (`[n, n_embd]`). `next`: the product after it (a prefetch hint, see
/// `Backend::prefetch`).
#[allow(clippy::too_many_arguments)]
pub fn attention<B: Backend>(
    b: &B,
    cfg: &ModelConfig,
    w: &AttnWeights<B>,
    batch: &Batch,
    caches: &mut [&mut B::KvCache],
    h: &B::Tensor,
    x: &mut B::Tensor,
    next: &B::Weight,
) -> Result<(), ModelError> {
    let n = batch.len();
    let mut q = b.zeros(n, b.weight_shape(&w.wq).0);
    let mut k = b.zeros(n, b.weight_shape(&w.wk).0);
    let mut v = b.zeros(n, b.weight_shape(&w.wv).0);
    let biases = match (&w.bq, &w.bk, &w.bv) {
        (None, None, None) => vec![],
        (bq, bk, bv) => vec![bq.as_ref(), bk.as_ref(), bv.as_ref()],
    };
    // Q, K and V read the same h: one call (x quantized once, same-type products in one launch).
    b.matmul_many(
        &[&w.wq, &w.wk, &w.wv],
        &biases,
        h,
        &mut [&mut q, &mut k, &mut v],
    )?;
    // the attention chain reads little: the o-projection's weights may move meanwhile
    b.prefetch(&[&w.wo, next])?;
    let mut o = b.zeros(n, cfg.n_head * cfg.head_dim_v);
    // q/k norms, RoPE and attention in one call: a device may fuse the chain.
    b.attention_block(
        AttnBlock {
            q: &mut q,
            q_head_stride: cfg.head_dim_k,
            gate_offset: None,
            k: &mut k,
            v: &v,
            q_norm: w.q_norm.as_ref(),
            k_norm: w.k_norm.as_ref(),
            norm_eps: cfg.rms_eps,
            positions: &batch.positions,
            rope: &cfg.rope,
        },
        &batch.rows,
        caches,
        &attention_params(cfg),
        &mut o,
    )?;
    b.matmul_add(&w.wo, &o, x)?;
    Ok(())
}

/// SwiGLU MLP: `down(silu(gate(h)) * up(h))`.
pub struct FfnWeights<B: Backend> {
    pub gate: B::Weight,
    pub up: B::Weight,
    pub down: B::Weight,
}

impl<B: Backend> FfnWeights<B> {
    pub fn load(l: &Loader<B>, cfg: &ModelConfig, il: usize) -> Result<Self, ModelError> {
        let (e, f) = (cfg.n_embd, cfg.n_ff);
        Ok(FfnWeights {
            gate: l.layer(il, "ffn_gate.weight", &[e, f])?,
            up: l.layer(il, "ffn_up.weight", &[e, f])?,
            down: l.layer(il, "ffn_down.weight", &[f, e])?,
        })
    }

    /// `x += mlp(h)`; h, x: `[n, n_embd]`.
    pub fn forward_add(&self, b: &B, h: &B::Tensor, x: &mut B::Tensor) -> Result<(), ModelError> {
        let (n, _) = b.shape(h);
        let f = b.weight_shape(&self.gate).0;
        let mut gate = b.zeros(n, f);
        let mut up = b.zeros(n, b.weight_shape(&self.up).0);
        // gate and up read the same h: one call (one launch when they share a weight type).
        b.matmul_many(&[&self.gate, &self.up], &[], h, &mut [&mut gate, &mut up])?;
        let mut act = b.zeros(n, f);
        b.swiglu(&gate, &up, &mut act)?;
        b.matmul_add(&self.down, &act, x)?;
        Ok(())
    }
}

/// A pre-norm transformer layer: `x += attn(norm(x)); x += ffn(norm(x))`.
pub struct DenseLayer<B: Backend> {
    pub attn_norm: B::Weight,
    pub attn: AttnWeights<B>,
    pub ffn_norm: B::Weight,
    pub ffn: FfnWeights<B>,
}

impl<B: Backend> DenseLayer<B> {
    pub fn load(
        l: &Loader<B>,
        cfg: &ModelConfig,
        il: usize,
        opts: AttnOptions,
    ) -> Result<Self, ModelError> {
        Ok(DenseLayer {
            attn_norm: l.layer(il, "attn_norm.weight", &[cfg.n_embd])?,
            attn: AttnWeights::load(l, cfg, il, opts)?,
            ffn_norm: l.layer(il, "ffn_norm.weight", &[cfg.n_embd])?,
            ffn: FfnWeights::load(l, cfg, il)?,
        })
    }

    /// The weight the layer's first product reads first (a prefetch hint before its norm).
    pub fn first_product(&self) -> &B::Weight {
        &self.attn.wq
    }

    /// x: `[n, n_embd]`, updated in place.
    pub fn forward(
        &self,
        b: &B,
        cfg: &ModelConfig,
        batch: &Batch,
        caches: &mut [&mut B::KvCache],
        x: &mut B::Tensor,
    ) -> Result<(), ModelError> {
        let h = norm(b, &self.attn_norm, x, cfg.rms_eps)?;
        attention(b, cfg, &self.attn, batch, caches, &h, x, &self.ffn.gate)?;
        let h = norm(b, &self.ffn_norm, x, cfg.rms_eps)?;
        self.ffn.forward_add(b, &h, x)?;
        Ok(())
    }
}

/// Loads `cfg.n_layer` dense layers.
pub fn load_dense_layers<B: Backend>(
    l: &Loader<B>,
    cfg: &ModelConfig,
    opts: AttnOptions,
) -> Result<Vec<DenseLayer<B>>, ModelError> {
    (0..cfg.n_layer)
        .map(|il| DenseLayer::load(l, cfg, il, opts))
        .collect()
}
