//! qwen35 (Qwen3.5 / 3.6 dense): a hybrid of Gated DeltaNet layers and gated full-attention
//! layers (the pattern comes from `attention.recurrent_layers` / `full_attention_interval`),
//! each followed by a SwiGLU MLP. Norm weights are used as stored (llama.cpp's converter
//! already folded the `1 + w` of the HF RMSNorm into them); `ssm_a` is stored as
//! `-exp(A_log)`; value heads are stored in the order where value head h reads key head
//! `h % n_k_heads`.
//!
//! Layer: `x += mixer(norm(x)); x += mlp(post_attention_norm(x))`.

use backend::{AttnBlock, Backend, RecurrentShape};

use crate::blocks::{attention_params, norm, Batch, FfnWeights};
use crate::config::{ModelConfig, SsmConfig};
use crate::loader::Loader;
use crate::ModelError;

/// Gated full attention: `attn_q` yields query and gate per head (`[q_h | gate_h]` for each
/// head h), per-head q/k RMS norm, partial M-RoPE, output scaled by `sigmoid(gate)`.
pub struct GatedAttention<B: Backend> {
    pub wq: B::Weight,
    pub wk: B::Weight,
    pub wv: B::Weight,
    pub wo: B::Weight,
    pub q_norm: B::Weight,
    pub k_norm: B::Weight,
}

/// Gated DeltaNet mixer.
pub struct DeltaNet<B: Backend> {
    /// `[n_embd] → [q | k | v]` (conv channels).
    pub qkv: B::Weight,
    /// `z`, the output gate: `[n_embd] → [d_inner]`.
    pub gate: B::Weight,
    pub beta: B::Weight,
    pub alpha: B::Weight,
    pub dt_bias: B::Weight,
    pub a: B::Weight,
    /// `[channels, d_conv]`.
    pub conv: B::Weight,
    /// `[d_v]`, shared by all value heads.
    pub norm: B::Weight,
    pub out: B::Weight,
}

pub enum Mixer<B: Backend> {
    Attention(GatedAttention<B>),
    DeltaNet(DeltaNet<B>),
}

pub struct Layer<B: Backend> {
    pub attn_norm: B::Weight,
    pub post_norm: B::Weight,
    pub mixer: Mixer<B>,
    pub ffn: FfnWeights<B>,
}

pub fn recurrent_shape(ssm: &SsmConfig) -> RecurrentShape {
    RecurrentShape {
        d_conv: ssm.d_conv,
        conv_channels: ssm.conv_channels(),
        n_k_heads: ssm.n_k_heads,
        n_v_heads: ssm.n_v_heads,
        d_k: ssm.d_state,
        d_v: ssm.d_v(),
    }
}

fn ssm_config(cfg: &ModelConfig) -> Result<&SsmConfig, ModelError> {
    cfg.ssm
        .as_ref()
        .ok_or_else(|| ModelError::MissingKey("qwen35.ssm.*".into()))
}

pub fn load<B: Backend>(l: &Loader<B>, cfg: &ModelConfig) -> Result<Vec<Layer<B>>, ModelError> {
    (0..cfg.n_layer)
        .map(|il| load_layer(l, cfg, il, cfg.recurrent_layers[il]))
        .collect()
}

/// Block `il` as a DeltaNet (`recurrent`) or gated-attention layer. The MTP block
/// (`il == n_layer`) is an attention layer loaded through here too.
pub fn load_layer<B: Backend>(
    l: &Loader<B>,
    cfg: &ModelConfig,
    il: usize,
    recurrent: bool,
) -> Result<Layer<B>, ModelError> {
    let e = cfg.n_embd;
    let mixer = if recurrent {
        let ssm = *ssm_config(cfg)?;
        let hv = ssm.n_v_heads;
        Mixer::DeltaNet(DeltaNet {
            qkv: l.layer(il, "attn_qkv.weight", &[e, ssm.conv_channels()])?,
            gate: l.layer(il, "attn_gate.weight", &[e, ssm.d_inner])?,
            beta: l.layer(il, "ssm_beta.weight", &[e, hv])?,
            alpha: l.layer(il, "ssm_alpha.weight", &[e, hv])?,
            dt_bias: l.layer(il, "ssm_dt.bias", &[hv])?,
            a: l.layer(il, "ssm_a", &[hv])?,
            conv: l.layer(il, "ssm_conv1d.weight", &[ssm.d_conv, ssm.conv_channels()])?,
            norm: l.layer(il, "ssm_norm.weight", &[ssm.d_v()])?,
            out: l.layer(il, "ssm_out.weight", &[ssm.d_inner, e])?,
        })
    } else {
        let (hk, hv) = (cfg.head_dim_k, cfg.head_dim_v);
        if hk != hv {
            return Err(ModelError::BadKey {
                key: "qwen35.attention.key_length".into(),
                detail: format!("gated attention needs equal K/V head sizes, got {hk}/{hv}"),
            });
        }
        Mixer::Attention(GatedAttention {
            wq: l.layer(il, "attn_q.weight", &[e, cfg.n_head * hk * 2])?,
            wk: l.layer(il, "attn_k.weight", &[e, cfg.n_head_kv * hk])?,
            wv: l.layer(il, "attn_v.weight", &[e, cfg.n_head_kv * hv])?,
            wo: l.layer(il, "attn_output.weight", &[cfg.n_head * hv, e])?,
            q_norm: l.layer(il, "attn_q_norm.weight", &[hk])?,
            k_norm: l.layer(il, "attn_k_norm.weight", &[hk])?,
        })
    };
    Ok(Layer {
        attn_norm: l.layer(il, "attn_norm.weight", &[e])?,
        post_norm: l.layer(il, "post_attention_norm.weight", &[e])?,
        mixer,
        ffn: FfnWeights::load(l, cfg, il)?,
    })
}

/// Per-layer state handed to [`Layer::forward`]: the KV caches (attention layers) or the
/// recurrent states (DeltaNet layers) of every sequence in the batch.
pub enum LayerStates<'a, B: Backend> {
    Kv(Vec<&'a mut B::KvCache>),
    Recurrent(Vec<&'a mut B::RecurrentState>),
}

impl<B: Backend> Layer<B> {
    /// The weight the layer's first product reads first (a prefetch hint before its norm).
    pub fn first_product(&self) -> &B::Weight {
        match &self.mixer {
            Mixer::Attention(w) => &w.wq,
            Mixer::DeltaNet(w) => &w.qkv,
        }
    }

    /// x: `[n, n_embd]`, updated in place.
    pub fn forward(
        &self,
        b: &B,
        cfg: &ModelConfig,
        batch: &Batch,
        states: LayerStates<'_, B>,
        x: &mut B::Tensor,
    ) -> Result<(), ModelError> {
        let h = norm(b, &self.attn_norm, x, cfg.rms_eps)?;
        // the products after the mixer's chain (a prefetch hint, see Backend::prefetch)
        let next = &self.ffn.gate;
        match (&self.mixer, states) {
            (Mixer::Attention(w), LayerStates::Kv(mut caches)) => {
                w.forward(b, cfg, batch, &mut caches, &h, x, next)?
            }
            (Mixer::DeltaNet(w), LayerStates::Recurrent(mut rs)) => {
                w.forward(b, cfg, batch, &mut rs, &h, x, next)?
            }
            _ => {
                return Err(ModelError::ForeignState {
                    found: 0,
                    expected: cfg.n_layer,
                })
            }
        };
        let h = norm(b, &self.post_norm, x, cfg.rms_eps)?;
        self.ffn.forward_add(b, &h, x)?;
        Ok(())
    }
}

impl<B: Backend> GatedAttention<B> {
    /// `next`: the product after this block's (a prefetch hint).
    #[allow(clippy::too_many_arguments)]
    fn forward(
        &self,
        b: &B,
        cfg: &ModelConfig,
        batch: &Batch,
        caches: &mut [&mut B::KvCache],
        h: &B::Tensor,
        x: &mut B::Tensor,
        next: &B::Weight,
    ) -> Result<(), ModelError> {
        let (n, hd, nh) = (batch.len(), cfg.head_dim_k, cfg.n_head);
        // qg: [n, n_head * 2 * hd], per head [q | gate]; q, k, v read the same h: one call
        let mut qg = b.zeros(n, b.weight_shape(&self.wq).0);
        let mut k = b.zeros(n, b.weight_shape(&self.wk).0);
        let mut v = b.zeros(n, b.weight_shape(&self.wv).0);
        b.matmul_many(
            &[&self.wq, &self.wk, &self.wv],
            &[],
            h,
            &mut [&mut qg, &mut k, &mut v],
        )?;
        // the attention chain reads little: the o-projection's weights may move meanwhile
        b.prefetch(&[&self.wo, next])?;
        let mut o = b.zeros(n, nh * cfg.head_dim_v);
        // q/k norms, RoPE, attention and the sigmoid gate in one call: a device may fuse the
        // chain (and read q and the gate in place from qg).
        b.attention_block(
            AttnBlock {
                q: &mut qg,
                q_head_stride: 2 * hd,
                gate_offset: Some(hd),
                k: &mut k,
                v: &v,
                q_norm: Some(&self.q_norm),
                k_norm: Some(&self.k_norm),
                norm_eps: cfg.rms_eps,
                positions: &batch.positions,
                rope: &cfg.rope,
            },
            &batch.rows,
            caches,
            &attention_params(cfg),
            &mut o,
        )?;
        b.matmul_add(&self.wo, &o, x)?;
        Ok(())
    }
}

impl<B: Backend> DeltaNet<B> {
    /// `next`: the product after this block's (a prefetch hint).
    #[allow(clippy::too_many_arguments)]
    fn forward(
        &self,
        b: &B,
        cfg: &ModelConfig,
        batch: &Batch,
        states: &mut [&mut B::RecurrentState],
        h: &B::Tensor,
        x: &mut B::Tensor,
        next: &B::Weight,
    ) -> Result<(), ModelError> {
        let ssm = ssm_config(cfg)?;
        let n = batch.len();
        let kd = ssm.key_dim();
        let rows = |w: &B::Weight| b.weight_shape(w).0;
        let mut qkv = b.zeros(n, rows(&self.qkv)); // [n, 2 * key_dim + d_inner]
        let mut z = b.zeros(n, rows(&self.gate)); // [n, d_inner]
        let mut beta = b.zeros(n, rows(&self.beta)); // [n, n_v_heads]
        let mut g = b.zeros(n, rows(&self.alpha)); // [n, n_v_heads]
                                                   // the conv / delta-rule chain reads little: the out-projection's weights may move
                                                   // meanwhile (a hint the conv takes up)
        b.prefetch(&[&self.out, next])?;
        // the four projections read the same h, then conv1d with the rolling state, silu,
        // transformers' l2norm of q and k (x * rsqrt(sum(x²) + 1e-6) per d_state group; the q|k
        // columns of the conv output are adjacent) and the split of [q | k | v]: one call, which
        // a device may fuse (the alpha / beta products, read only by the rule, beside the conv)
        let (mut q, mut k, mut v) = (b.zeros(n, kd), b.zeros(n, kd), b.zeros(n, ssm.d_inner));
        b.in_proj_conv1d_qkv(
            h,
            &[&self.qkv, &self.gate, &self.beta, &self.alpha],
            &mut [&mut qkv, &mut z, &mut beta, &mut g],
            &self.conv,
            &batch.rows,
            states,
            (2 * kd, ssm.d_state, cfg.rms_eps),
            &[0, kd, 2 * kd],
            &mut [&mut q, &mut k, &mut v],
        )?;
        let mut o = b.zeros(n, ssm.d_inner);
        // the gates (softplus decay, sigmoid beta), the rule and the gated output norm: one
        // call, which a device may fuse
        b.delta_rule_gated_norm(
            &q,
            &k,
            &v,
            &mut g,
            &mut beta,
            (&self.dt_bias, &self.a),
            &batch.rows,
            states,
            &mut o,
            (&self.norm, &z, cfg.rms_eps),
        )?;
        b.matmul_add(&self.out, &o, x)?;
        Ok(())
    }
}
