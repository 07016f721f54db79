//! The target side of speculative decoding: a model and one sequence state, with a verify
//! pass that can be rolled back.
//!
//! Rollback: attention-only models truncate the KV cache. Hybrid models (recurrent Gated
//! DeltaNet layers) snapshot the recurrent state before the verify pass; when a draft token
//! is rejected, the state is restored to the snapshot and the kept tokens are run again.
//! The snapshot is dropped once the step is settled.

use backend::Backend;
use model::{ModelOn, SeqStateOn};

use super::SpecError;

/// A model and the state of the sequence it is generating.
pub struct TargetSession<'m, B: Backend> {
    pub model: &'m ModelOn<B>,
    pub state: SeqStateOn<B>,
    /// Also return the final hidden states (the MTP drafter reads them).
    keep_hidden: bool,
    /// Length before the last verify pass.
    base: usize,
    /// Tokens of the last verify pass (empty once settled).
    verified: Vec<u32>,
    /// Hidden states `[n, n_embd]` of the last prefill / verify rows (when `keep_hidden`).
    pub hidden: Vec<f32>,
}

impl<'m, B: Backend> TargetSession<'m, B> {
    pub fn new(model: &'m ModelOn<B>, state: SeqStateOn<B>, keep_hidden: bool) -> Self {
        TargetSession {
            model,
            state,
            keep_hidden,
            base: 0,
            verified: Vec::new(),
            hidden: Vec::new(),
        }
    }

    pub fn n_vocab(&self) -> usize {
        self.model.config().n_vocab
    }

    /// Appends `prompt`; logits `[n_vocab]` of its last token.
    pub fn prefill(&mut self, prompt: &[u32]) -> Result<Vec<f32>, SpecError> {
        self.settle_check()?;
        if !self.keep_hidden {
            return Ok(self.model.forward(&mut self.state, prompt, false)?);
        }
        let (logits, hidden) = self.model.forward_hidden(&mut self.state, prompt, false)?;
        self.hidden = hidden;
        Ok(logits)
    }

    fn settle_check(&self) -> Result<(), SpecError> {
        if self.verified.is_empty() {
            Ok(())
        } else {
            Err(SpecError::Protocol(
                "a verify pass was not settled with accept",
            ))
        }
    }

    /// Runs `tokens` in one batched pass; logits of every row, `[n, n_vocab]`.
    pub fn verify(&mut self, tokens: &[u32]) -> Result<Vec<f32>, SpecError> {
        self.settle_check()?;
        self.base = self.state.len();
        if self.state.is_recurrent() {
            self.state.snapshot();
        }
        let logits = if self.keep_hidden {
            self.model
                .forward_hidden(&mut self.state, tokens, true)
                .map(|(logits, hidden)| {
                    self.hidden = hidden;
                    logits
                })
        } else {
            self.model.forward(&mut self.state, tokens, true)
        };
        let logits = match logits {
            Ok(l) => l,
            Err(e) => {
                self.state.drop_snapshot(self.base);
                return Err(e.into());
            }
        };
        self.verified = tokens.to_vec();
        Ok(logits)
    }

    /// Keeps the first `n_keep` tokens of the last verify pass.
    pub fn accept(&mut self, n_keep: usize) -> Result<(), SpecError> {
        let n = self.verified.len();
        if n_keep == 0 || n_keep > n {
            return Err(SpecError::Protocol("accept: n_keep outside 1..=verified"));
        }
        let result = if n_keep == n {
            Ok(())
        } else if !self.state.is_recurrent() {
            self.state.truncate(self.base + n_keep).map_err(Into::into)
        } else {
            // Restore the pre-verify recurrent state, then run the kept tokens again.
            self.state
                .truncate(self.base)
                .and_then(|()| {
                    self.model
                        .forward(&mut self.state, &self.verified[..n_keep], false)
                        .map(|_| ())
                })
                .map_err(Into::into)
        };
        self.state.drop_snapshot(self.base);
        self.verified.clear();
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use model::{KvType, LoadOptions, Model};

    const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data/fixtures");

    /// After verify + a partial accept, the hybrid state equals a state that only ever saw the
    /// kept tokens (same next logits), and no snapshot is left behind.
    #[test]
    fn hybrid_rollback_equals_never_having_seen_the_rejected_tokens() {
        let path = std::path::Path::new(FIXTURES).join("qwen35/model-f32.gguf");
        let m = Model::load(&path, &LoadOptions::default()).unwrap();
        let prompt = [1u32, 17, 99, 4, 250];
        let mut s = TargetSession::new(&m, m.new_state(64, KvType::F32).unwrap(), false);
        assert!(s.state.is_recurrent());
        s.prefill(&prompt).unwrap();
        s.verify(&[7, 8, 9, 10]).unwrap();
        s.accept(2).unwrap();
        assert_eq!(s.state.len(), prompt.len() + 2);
        assert!(s.state.snapshot_positions().is_empty());
        let got = m.forward(&mut s.state, &[11], false).unwrap();

        let mut fresh = m.new_state(64, KvType::F32).unwrap();
        m.forward(&mut fresh, &prompt, false).unwrap();
        m.forward(&mut fresh, &[7, 8], false).unwrap();
        let want = m.forward(&mut fresh, &[11], false).unwrap();
        let err = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(err < 1e-4, "max |Δlogit| {err}");

        // A full accept keeps everything without a rollback.
        s.verify(&[12, 13]).unwrap();
        s.accept(2).unwrap();
        assert_eq!(s.state.len(), prompt.len() + 5);
        assert!(s.accept(1).is_err(), "accept without verify is refused");
    }
}
