//! Qwen3.5's multi-token-prediction block (MTP, llama.cpp's "NextN"), used as a built-in draft
//! model for speculative decoding.
//!
//! Layout (llama.cpp's converter, `convert_hf_to_gguf.py` for Qwen3.5; our `convert` writes the
//! same): `{arch}.nextn_predict_layers` extra blocks after the `n_layer` main ones, block
//! `blk.{n_layer}` holding an ordinary gated-attention layer plus
//! `nextn.eh_proj` (`[2 * n_embd] → [n_embd]`), `nextn.enorm`, `nextn.hnorm`,
//! `nextn.shared_head_norm`, and optionally `nextn.embed_tokens` / `nextn.shared_head_head`
//! (absent in Qwen3.5: the main embedding and output head are shared).
//!
//! One step, as vLLM's `Qwen3NextMultiTokenPredictor` computes it: for the token `tok` at main
//! position `p` and the main model's hidden state `h` of position `p - 1` (after the final
//! norm, the vector the main head reads),
//!
//! ```text
//! x      = eh_proj([enorm(embed(tok)) ; hnorm(h)])      // [n_embd]
//! x      = layer(x)                                      // attention over the MTP KV cache
//! h'     = shared_head_norm(x)                           // the MTP "hidden", chained
//! logits = head(h')                                      // predicts the token at p + 1
//! ```
//!
//! Drafting several tokens chains `h'` in place of the main hidden state. The MTP layer has its
//! own KV cache: entry `p` (main position) is stored at cache slot `p - 1` (position 0 has
//! no predecessor), and RoPE uses the main position `p`.

use backend::{Backend, ColumnCopy, KvType, Row};

use crate::arch::qwen35::{self, LayerStates};
use crate::blocks::{linear, norm, Batch};
use crate::config::ModelConfig;
use crate::loader::Loader;
use crate::ModelError;

/// The weights of the first MTP block.
pub struct MtpBlock<B: Backend> {
    /// `[2 * n_embd] → [n_embd]`; input is `[embedding ; hidden]`.
    pub eh_proj: B::Weight,
    pub enorm: B::Weight,
    pub hnorm: B::Weight,
    pub shared_head_norm: B::Weight,
    /// `None`: the main output head.
    pub head: Option<B::Weight>,
    /// `None`: the main token embedding.
    pub embed: Option<B::Weight>,
    pub layer: qwen35::Layer<B>,
}

/// The MTP layer's KV cache for one sequence. `len` = entries held = the main position of
/// the last entry (entries cover main positions `1..=len`).
pub struct MtpState<B: Backend> {
    kv: B::KvCache,
    n_ctx: usize,
    len: usize,
}

impl<B: Backend> MtpState<B> {
    /// Entries held (main positions `1..=len`).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Keeps the entries of main positions `1..=len` (attention only: always possible).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }
}

/// Loads block `blk.{n_layer}` if the file has MTP layers (`None` otherwise).
pub fn load<B: Backend>(
    l: &Loader<B>,
    cfg: &ModelConfig,
) -> Result<Option<MtpBlock<B>>, ModelError> {
    if cfg.n_mtp_layer == 0 {
        return Ok(None);
    }
    let (il, e, v) = (cfg.n_layer, cfg.n_embd, cfg.n_vocab);
    Ok(Some(MtpBlock {
        eh_proj: l.layer(il, "nextn.eh_proj.weight", &[2 * e, e])?,
        enorm: l.layer(il, "nextn.enorm.weight", &[e])?,
        hnorm: l.layer(il, "nextn.hnorm.weight", &[e])?,
        shared_head_norm: l.layer(il, "nextn.shared_head_norm.weight", &[e])?,
        head: l.layer_optional(il, "nextn.shared_head_head.weight", &[e, v])?,
        embed: l.layer_optional(il, "nextn.embed_tokens.weight", &[e, v])?,
        // MTP blocks are full-attention layers (the converter marks them non-recurrent).
        layer: qwen35::load_layer(l, cfg, il, false)?,
    }))
}

/// What one MTP pass returns.
pub struct MtpOutput {
    /// `[1, n_vocab]` (last row) or `[n, n_vocab]` (every row).
    pub logits: Vec<f32>,
    /// `h'` of every row, `[n, n_embd]`: feed a row back as the next step's hidden state.
    pub hidden: Vec<f32>,
}

impl<B: Backend> MtpBlock<B> {
    pub fn new_state(
        &self,
        b: &B,
        cfg: &ModelConfig,
        n_ctx: usize,
        kv_type: KvType,
    ) -> Result<MtpState<B>, ModelError> {
        if n_ctx == 0 {
            return Err(ModelError::BadContext(n_ctx));
        }
        let kv = b.new_kv_cache(
            n_ctx,
            cfg.n_head_kv,
            cfg.head_dim_k,
            cfg.head_dim_v,
            kv_type,
        )?;
        Ok(MtpState { kv, n_ctx, len: 0 })
    }

    /// Runs rows `r = 0..n`: token `tokens[r]` at main position `st.len() + 1 + r` with the
    /// hidden state `hidden[r]` (`[n, n_embd]` f32, of the position before it), appending to
    /// the MTP cache. `tok_embd` / `main_head`: the main model's embedding and output head.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        b: &B,
        cfg: &ModelConfig,
        tok_embd: &B::Weight,
        main_head: &B::Weight,
        st: &mut MtpState<B>,
        tokens: &[u32],
        hidden: &[f32],
        all_logits: bool,
    ) -> Result<MtpOutput, ModelError> {
        let (n, e) = (tokens.len(), cfg.n_embd);
        if n == 0 {
            return Err(ModelError::EmptyInput);
        }
        if hidden.len() != n * e {
            return Err(ModelError::BatchMismatch {
                n_states: hidden.len() / e.max(1),
                n_tokens: n,
            });
        }
        if let Some(&token) = tokens.iter().find(|&&t| t as usize >= cfg.n_vocab) {
            return Err(ModelError::TokenOutOfRange {
                token,
                n_vocab: cfg.n_vocab,
            });
        }
        if st.len + n > st.n_ctx {
            return Err(ModelError::ContextFull {
                needed: n,
                used: st.len,
                n_ctx: st.n_ctx,
            });
        }
        // Cache slot = main position - 1; RoPE at the main position.
        let rows: Vec<Row> = (0..n)
            .map(|r| Row {
                seq: 0,
                pos: st.len + r,
            })
            .collect();
        let positions = rows.iter().map(|r| (r.pos + 1) as u32).collect();
        let batch = Batch { rows, positions };

        let mut emb = b.zeros(n, e);
        b.embed(self.embed.as_ref().unwrap_or(tok_embd), tokens, &mut emb)?;
        b.rms_norm_inplace(&mut emb, &self.enorm, cfg.rms_eps)?;
        let h = b.upload(hidden, n, e)?;
        let h = norm(b, &self.hnorm, &h, cfg.rms_eps)?;
        // cat: [n, 2 * n_embd] = [enorm(embed) | hnorm(h)]
        let mut cat = b.zeros(n, 2 * e);
        b.copy_cols(&emb, &mut cat, &ColumnCopy::contiguous(0, e, 0))?;
        b.copy_cols(&h, &mut cat, &ColumnCopy::contiguous(0, e, e))?;
        let mut x = linear(b, &self.eh_proj, &cat)?;
        self.layer
            .forward(b, cfg, &batch, LayerStates::Kv(vec![&mut st.kv]), &mut x)?;
        st.len += n;
        b.rms_norm_inplace(&mut x, &self.shared_head_norm, cfg.rms_eps)?;
        let head = self.head.as_ref().unwrap_or(main_head);
        let logits = if all_logits {
            linear(b, head, &x)?
        } else {
            let mut last = b.zeros(1, e);
            b.get_rows(&x, &[n - 1], &mut last)?;
            linear(b, head, &last)?
        };
        Ok(MtpOutput {
            logits: b.download(&logits),
            hidden: b.download(&x),
        })
    }
}
