//! Self-speculation with Qwen3.5's multi-token-prediction block (`model::arch::qwen35_mtp`).
//!
//! The MTP entry of main position `j` reads token `j` and the target's hidden state of
//! position `j - 1`. Entries whose inputs are known (the prompt, kept tokens) are computed
//! lazily, in one batch with the first draft step of the next step. Draft steps after the
//! first chain the MTP's own output hidden state instead of the target's; those entries are
//! dropped once the target has verified the step (truncating the MTP KV cache is free) and
//! recomputed from the target's hidden states of the kept tokens.

use backend::{Backend, KvType};
use model::arch::qwen35_mtp::MtpState;
use model::{ModelOn, SeqStateOn};

use super::target::TargetSession;
use super::{SpecError, SpecModel};

/// Rows per MTP pass when catching up on a long prompt.
const MTP_CHUNK: usize = 512;

/// A Qwen3.5 target with its MTP block as the drafter.
pub struct MtpSpec<'m, B: Backend> {
    pub target: TargetSession<'m, B>,
    mtp: MtpState<B>,
    n_embd: usize,
    /// Entries not yet in the MTP cache: tokens and the hidden state before each.
    pend_tokens: Vec<u32>,
    pend_hidden: Vec<f32>,
    /// The target's hidden state of its last token (pairs with the next decided token).
    last_hidden: Vec<f32>,
    /// The MTP's output hidden state of the previous draft step (chained).
    chain: Vec<f32>,
    /// MTP cache length after this step's first draft step (its entries are exact).
    exact_len: Option<usize>,
    /// Tokens of the last verify pass.
    verified: Vec<u32>,
}

impl<'m, B: Backend> MtpSpec<'m, B> {
    /// `model` must have its MTP block loaded (`ModelOn::load_mtp`); `state` must be empty.
    pub fn new(
        model: &'m ModelOn<B>,
        state: SeqStateOn<B>,
        kv_type: KvType,
    ) -> Result<Self, SpecError> {
        if !model.has_mtp() {
            return Err(SpecError::NoMtp);
        }
        if !state.is_empty() {
            return Err(SpecError::Protocol(
                "speculation starts from an empty state",
            ));
        }
        let mtp = model.new_mtp_state(state.n_ctx(), kv_type)?;
        Ok(MtpSpec {
            target: TargetSession::new(model, state, true),
            mtp,
            n_embd: model.config().n_embd,
            pend_tokens: Vec::new(),
            pend_hidden: Vec::new(),
            last_hidden: Vec::new(),
            chain: Vec::new(),
            exact_len: None,
            verified: Vec::new(),
        })
    }

    /// Queues MTP entries for `tokens`, the first paired with `last_hidden` (if any: the very
    /// first token of a sequence has no entry), the others with `hidden` rows `0..`; the
    /// last row of `hidden` becomes `last_hidden`.
    fn queue(&mut self, tokens: &[u32], hidden: &[f32]) {
        let e = self.n_embd;
        for (i, &t) in tokens.iter().enumerate() {
            let h = if i == 0 {
                &self.last_hidden[..]
            } else {
                &hidden[(i - 1) * e..i * e]
            };
            if h.len() == e {
                self.pend_tokens.push(t);
                self.pend_hidden.extend_from_slice(h);
            }
        }
        if let Some(n) = tokens.len().checked_sub(1) {
            self.last_hidden = hidden[n * e..(n + 1) * e].to_vec();
        }
    }
}

impl<B: Backend> SpecModel for MtpSpec<'_, B> {
    fn n_vocab(&self) -> usize {
        self.target.n_vocab()
    }

    fn n_ctx(&self) -> usize {
        self.target.state.n_ctx()
    }

    fn target_len(&self) -> usize {
        self.target.state.len()
    }

    fn prefill(&mut self, prompt: &[u32]) -> Result<Vec<f32>, SpecError> {
        let logits = self.target.prefill(prompt)?;
        let hidden = std::mem::take(&mut self.target.hidden);
        self.queue(prompt, &hidden);
        Ok(logits)
    }

    fn draft_step(&mut self, token: u32) -> Result<Vec<f32>, SpecError> {
        let model = self.target.model;
        if self.exact_len.is_some() {
            let out = model.mtp_forward(&mut self.mtp, &[token], &self.chain, false)?;
            self.chain = out.hidden;
            return Ok(out.logits);
        }
        // First draft step: the pending exact entries plus (token, last target hidden).
        let mut tokens = std::mem::take(&mut self.pend_tokens);
        let mut hidden = std::mem::take(&mut self.pend_hidden);
        tokens.push(token);
        hidden.extend_from_slice(&self.last_hidden);
        let e = self.n_embd;
        let mut out = None;
        for (t, h) in tokens.chunks(MTP_CHUNK).zip(hidden.chunks(MTP_CHUNK * e)) {
            out = Some(model.mtp_forward(&mut self.mtp, t, h, false)?);
        }
        let out = out.ok_or(SpecError::Protocol("empty MTP batch"))?;
        let n_last = out.hidden.len() / e;
        self.chain = out.hidden[(n_last - 1) * e..].to_vec();
        self.exact_len = Some(self.mtp.len());
        Ok(out.logits)
    }

    fn verify(&mut self, tokens: &[u32]) -> Result<Vec<f32>, SpecError> {
        let logits = self.target.verify(tokens)?;
        self.verified = tokens.to_vec();
        Ok(logits)
    }

    fn accept(&mut self, n_keep: usize) -> Result<(), SpecError> {
        self.target.accept(n_keep)?;
        let verified = std::mem::take(&mut self.verified);
        let hidden = std::mem::take(&mut self.target.hidden);
        let kept = &verified[..n_keep.min(verified.len())];
        match self.exact_len.take() {
            Some(len) => {
                // The first kept token's entry is exact; drafts' entries used chained states.
                self.mtp.truncate(len);
                self.queue_rest(kept, &hidden);
            }
            None => self.queue(kept, &hidden),
        }
        Ok(())
    }
}

impl<B: Backend> MtpSpec<'_, B> {
    /// After an exact first entry for `kept[0]`: queues `kept[1..]` with the target hidden
    /// rows before each and sets `last_hidden` to the row of the last kept token.
    fn queue_rest(&mut self, kept: &[u32], hidden: &[f32]) {
        let e = self.n_embd;
        for (i, &t) in kept.iter().enumerate().skip(1) {
            self.pend_tokens.push(t);
            self.pend_hidden
                .extend_from_slice(&hidden[(i - 1) * e..i * e]);
        }
        let n = kept.len() - 1;
        self.last_hidden = hidden[n * e..(n + 1) * e].to_vec();
    }
}
