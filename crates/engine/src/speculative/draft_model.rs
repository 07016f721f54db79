//! A separate draft model (`-md DRAFT.gguf`) with the target's vocabulary.
//!
//! The drafter's state follows the target's accepted sequence lazily: tokens the target kept
//! but the drafter has not read yet are fed together with the next draft step (one batched
//! forward). Draft tokens the target rejected are dropped by truncating (attention-only
//! drafter) or by restoring the snapshot taken at the start of the step and re-feeding
//! (hybrid drafter).

use backend::Backend;
use gguf::GgufFile;
use model::{ModelOn, SeqStateOn};

use super::target::TargetSession;
use super::{SpecError, SpecModel};

/// Errors unless `draft` has the same vocabulary as `target`: the same logit width and, when
/// both files carry a token list, the same tokens in the same order.
pub fn check_same_vocab(target: &GgufFile, draft: &GgufFile) -> Result<(), SpecError> {
    let key = "tokenizer.ggml.tokens";
    match (
        target.metadata().get_str_array(key),
        draft.metadata().get_str_array(key),
    ) {
        (Some(a), Some(b)) => {
            if a.len() != b.len() {
                return Err(SpecError::VocabMismatch(format!(
                    "{} tokens in the target, {} in the draft",
                    a.len(),
                    b.len()
                )));
            }
            if let Some(i) = a.iter().zip(b).position(|(x, y)| x != y) {
                return Err(SpecError::VocabMismatch(format!(
                    "token {i} is {:?} in the target and {:?} in the draft",
                    a[i], b[i]
                )));
            }
            Ok(())
        }
        (None, None) => Ok(()),
        _ => Err(SpecError::VocabMismatch(
            "only one of the files has a tokenizer token list".into(),
        )),
    }
}

/// Target + draft model.
pub struct DraftModelSpec<'m, B: Backend> {
    pub target: TargetSession<'m, B>,
    draft: &'m ModelOn<B>,
    draft_state: SeqStateOn<B>,
    /// Every token the target holds (prompt and kept tokens), in order.
    seq: Vec<u32>,
    /// Drafter length when the current step's first draft step ran (`None`: no draft step
    /// in this step yet).
    step_base: Option<usize>,
    /// Tokens the drafter read in this step (a prefix of the step's verify tokens).
    consumed: usize,
    /// Tokens of the last verify pass (at the end of `seq` until `accept`).
    n_verified: usize,
}

impl<'m, B: Backend> DraftModelSpec<'m, B> {
    /// Pairs two models with fresh states of `n_ctx` positions each. Fails unless they share
    /// the vocabulary.
    pub fn new(
        target: &'m ModelOn<B>,
        target_state: SeqStateOn<B>,
        draft: &'m ModelOn<B>,
        draft_state: SeqStateOn<B>,
    ) -> Result<Self, SpecError> {
        if target.config().n_vocab != draft.config().n_vocab {
            return Err(SpecError::VocabMismatch(format!(
                "logits of {} in the target, {} in the draft",
                target.config().n_vocab,
                draft.config().n_vocab
            )));
        }
        check_same_vocab(target.gguf(), draft.gguf())?;
        if !target_state.is_empty() || !draft_state.is_empty() {
            return Err(SpecError::Protocol("speculation starts from empty states"));
        }
        Ok(DraftModelSpec {
            target: TargetSession::new(target, target_state, false),
            draft,
            draft_state,
            seq: Vec::new(),
            step_base: None,
            consumed: 0,
            n_verified: 0,
        })
    }
}

impl<B: Backend> SpecModel for DraftModelSpec<'_, B> {
    fn n_vocab(&self) -> usize {
        self.target.n_vocab()
    }

    fn n_ctx(&self) -> usize {
        self.target.state.n_ctx().min(self.draft_state.n_ctx())
    }

    fn target_len(&self) -> usize {
        self.target.state.len()
    }

    fn prefill(&mut self, prompt: &[u32]) -> Result<Vec<f32>, SpecError> {
        let logits = self.target.prefill(prompt)?;
        // The drafter reads the prompt with its first draft step.
        self.seq.extend_from_slice(prompt);
        Ok(logits)
    }

    fn draft_step(&mut self, token: u32) -> Result<Vec<f32>, SpecError> {
        let st = &mut self.draft_state;
        let feed: Vec<u32> = if self.step_base.is_none() {
            if st.is_recurrent() {
                st.snapshot();
            }
            self.step_base = Some(st.len());
            let mut f = self.seq[st.len()..].to_vec();
            f.push(token);
            f
        } else {
            vec![token]
        };
        let logits = self.draft.forward(st, &feed, false)?;
        self.consumed += 1;
        Ok(logits)
    }

    fn verify(&mut self, tokens: &[u32]) -> Result<Vec<f32>, SpecError> {
        let logits = self.target.verify(tokens)?;
        self.seq.extend_from_slice(tokens);
        self.n_verified = tokens.len();
        Ok(logits)
    }

    fn accept(&mut self, n_keep: usize) -> Result<(), SpecError> {
        self.target.accept(n_keep)?;
        // seq ends with the verified tokens; keep the accepted ones.
        let n_verified = std::mem::take(&mut self.n_verified);
        self.seq.truncate(self.seq.len() - n_verified + n_keep);
        let Some(base) = self.step_base.take() else {
            return Ok(());
        };
        let st = &mut self.draft_state;
        let consumed = std::mem::take(&mut self.consumed);
        if consumed > n_keep {
            // The drafter read rejected drafts: back to the kept prefix.
            let keep = self.seq.len();
            if st.is_recurrent() {
                st.truncate(base)?;
            } else {
                st.truncate(keep)?;
            }
        }
        st.drop_snapshot(base);
        Ok(())
    }
}
