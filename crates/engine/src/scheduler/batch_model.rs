//! The narrow view of a model that the scheduler needs: per-sequence state, prefill of one
//! sequence, one batched decode step over many sequences, and the mixed step the scheduler
//! actually runs (decode tokens of some sequences plus prompt chunks of others in one pass),
//! and, for speculative decoding, batched draft steps, verify rows inside that mixed step and
//! the settling of each verify pass.
//!
//! The server implements it over `model::ModelOn` (crates/server/src/model_service.rs; with a
//! drafter: `engine::speculative::SpecBatch`); tests use small deterministic fakes.

/// A model the scheduler can drive. Called only from the scheduler thread.
pub trait BatchModel: Send + Sync + 'static {
    /// KV cache (and recurrent state) of one sequence.
    type State: Send;

    fn n_vocab(&self) -> usize;
    /// A fresh, empty state with room for `n_ctx` tokens.
    fn new_state(&self, n_ctx: usize) -> Result<Self::State, String>;
    /// Tokens currently held by the state.
    fn state_len(&self, state: &Self::State) -> usize;
    /// Rolls the state back to at most `pos` tokens and returns the length it kept: `pos`
    /// itself when possible, else an earlier restore point (a recurrent-state snapshot).
    /// On an error the scheduler starts the sequence over from an empty state.
    fn truncate(&self, state: &mut Self::State, pos: usize) -> Result<usize, String>;
    /// Called when a prompt has been fully computed: a good place to remember a restore
    /// point, since the next turn of a chat shares at least this prefix.
    fn checkpoint(&self, _state: &mut Self::State) {}
    /// Appends `tokens` to one sequence; returns the logits of the last one: [n_vocab].
    fn prefill(&self, state: &mut Self::State, tokens: &[u32]) -> Result<Vec<f32>, String>;
    /// Appends one token to each sequence in one pass over the weights;
    /// returns logits [states.len(), n_vocab] row-major.
    fn decode_batch(
        &self,
        states: &mut [&mut Self::State],
        tokens: &[u32],
    ) -> Result<Vec<f32>, String>;
    /// One step over a mixed batch: appends `tokens[i]` (one token for a decoding sequence,
    /// a prompt chunk for a prefilling one; never empty) to `states[i]`. Returns the logits
    /// of each sequence's last token, `[states.len(), n_vocab]` row-major.
    ///
    /// A model that can should run them all in the same passes over the weights
    /// (`ModelOn::forward_multi`), so a prefilling prompt costs running streams one slightly
    /// larger step instead of a separate one. This default runs `prefill` per multi-token
    /// sequence and one `decode_batch` over the rest.
    fn forward_multi(
        &self,
        states: &mut [&mut Self::State],
        tokens: &[&[u32]],
    ) -> Result<Vec<f32>, String> {
        forward_multi_by_parts(self, states, tokens)
    }

    /// [`BatchModel::forward_multi`] for a step whose sampled rows all pick greedily: each
    /// sequence's [`backend::greedy_pick`] of its last token's logits instead of the logits.
    /// A model whose logits live on a device reduces them there (a few bytes come back
    /// instead of `[states.len(), n_vocab]` floats); this default picks from `forward_multi`.
    fn forward_multi_greedy(
        &self,
        states: &mut [&mut Self::State],
        tokens: &[&[u32]],
    ) -> Result<Vec<Option<u32>>, String> {
        greedy_picks_of_logits(self, states, tokens)
    }

    /// [`BatchModel::forward_multi`] for a step whose sampled rows all draw from their best
    /// logits alone (top-k samplers, `k <= backend::MAX_TOP_K`): each sequence's
    /// [`backend::top_k_row`] of its last token's logits. A model whose logits live on a
    /// device selects them there; this default selects from `forward_multi`.
    fn forward_multi_top(
        &self,
        states: &mut [&mut Self::State],
        tokens: &[&[u32]],
        k: usize,
    ) -> Result<Vec<Vec<(u32, f32)>>, String> {
        top_k_of_logits(self, states, tokens, k)
    }

    /// Speculative decoding settings when this model drafts (`None`: plain decoding, and the
    /// three methods below are never called).
    fn speculation(&self) -> Option<crate::speculative::SpecOptions> {
        None
    }

    /// One batched draft step: the drafter of `states[i]` reads `tokens[i]` and returns its
    /// logits for the next token, `[states.len(), n_vocab]`. The first call of a round (since
    /// the sequence's last `settle`) gets the last decided token, and the drafter first
    /// catches up on what the target holds; later calls get the sequence's previous draft.
    fn draft_step(
        &self,
        _states: &mut [&mut Self::State],
        _tokens: &[u32],
    ) -> Result<Vec<f32>, String> {
        Err("this model has no drafter".into())
    }

    /// [`BatchModel::forward_multi`] with verify passes: a sequence with `verify[i]` (its
    /// tokens: the last decided token, then its drafts) returns the logits of every one of
    /// its tokens, the others of their last token; rows in sequence order. Each verified
    /// sequence must be settled with [`BatchModel::settle`] before its next step.
    fn forward_verify(
        &self,
        states: &mut [&mut Self::State],
        tokens: &[&[u32]],
        verify: &[bool],
    ) -> Result<Vec<f32>, String> {
        if verify.iter().any(|&v| v) {
            return Err("this model cannot run verify passes".into());
        }
        self.forward_multi(states, tokens)
    }

    /// Settles the verify passes of the last step: `states[i]` keeps the first `keep[i]`
    /// (1..=len) tokens of its verify pass and drops the rest (its drafter follows), all
    /// sequences in one call so rollbacks that rerun tokens share a pass over the weights.
    fn settle(&self, _states: &mut [&mut Self::State], _keep: &[usize]) -> Result<(), String> {
        Err("this model cannot run verify passes".into())
    }
}
/// [`BatchModel::forward_multi_greedy`] from [`BatchModel::forward_multi`]'s logits: each
/// row's [`backend::greedy_pick`] made on the host.
pub fn greedy_picks_of_logits<M: BatchModel + ?Sized>(
    model: &M,
    states: &mut [&mut M::State],
    tokens: &[&[u32]],
) -> Result<Vec<Option<u32>>, String> {
    let (logits, n_vocab) = checked_logits(model, states, tokens)?;
    Ok(logits.chunks(n_vocab).map(backend::greedy_pick).collect())
}

/// `forward_multi`'s logits, checked to hold one row of `n_vocab` (> 0) per sequence.
fn checked_logits<M: BatchModel + ?Sized>(
    model: &M,
    states: &mut [&mut M::State],
    tokens: &[&[u32]],
) -> Result<(Vec<f32>, usize), String> {
    let n_vocab = model.n_vocab();
    let logits = model.forward_multi(states, tokens)?;
    if n_vocab == 0 || logits.len() != states.len() * n_vocab {
        return Err(format!(
            "the step returned {} logits, expected {}",
            logits.len(),
            states.len() * n_vocab
        ));
    }
    Ok((logits, n_vocab))
}

/// [`BatchModel::forward_multi_top`] from [`BatchModel::forward_multi`]'s logits: each row's
/// [`backend::top_k_row`] made on the host.
pub fn top_k_of_logits<M: BatchModel + ?Sized>(
    model: &M,
    states: &mut [&mut M::State],
    tokens: &[&[u32]],
    k: usize,
) -> Result<Vec<Vec<(u32, f32)>>, String> {
    let (logits, n_vocab) = checked_logits(model, states, tokens)?;
    Ok(logits
        .chunks(n_vocab)
        .map(|r| backend::top_k_row(r, k))
        .collect())
}

/// [`BatchModel::forward_multi`] built from `prefill` (each multi-token sequence alone) and
/// one `decode_batch` over the single-token ones.
pub fn forward_multi_by_parts<M: BatchModel + ?Sized>(
    model: &M,
    states: &mut [&mut M::State],
    tokens: &[&[u32]],
) -> Result<Vec<f32>, String> {
    if states.len() != tokens.len() {
        return Err(format!(
            "{} states but {} token lists",
            states.len(),
            tokens.len()
        ));
    }
    let n_vocab = model.n_vocab();
    let mut out = vec![0f32; states.len() * n_vocab];
    let mut decode_rows = Vec::new();
    let mut decode_states = Vec::new();
    let mut decode_tokens = Vec::new();
    for (i, (state, toks)) in states.iter_mut().zip(tokens).enumerate() {
        match toks {
            [] => return Err(format!("sequence {i} has no tokens")),
            [t] => {
                decode_rows.push(i);
                decode_states.push(&mut **state);
                decode_tokens.push(*t);
            }
            _ => {
                let logits = model.prefill(state, toks)?;
                if logits.len() != n_vocab {
                    return Err(format!(
                        "prefill returned {} logits, expected {n_vocab}",
                        logits.len()
                    ));
                }
                out[i * n_vocab..(i + 1) * n_vocab].copy_from_slice(&logits);
            }
        }
    }
    if !decode_rows.is_empty() {
        let logits = model.decode_batch(&mut decode_states, &decode_tokens)?;
        if logits.len() != decode_rows.len() * n_vocab {
            return Err(format!(
                "decode_batch returned {} logits, expected {}",
                logits.len(),
                decode_rows.len() * n_vocab
            ));
        }
        for (row, &i) in decode_rows.iter().enumerate() {
            out[i * n_vocab..(i + 1) * n_vocab]
                .copy_from_slice(&logits[row * n_vocab..(row + 1) * n_vocab]);
        }
    }
    Ok(out)
}

/// Keeps the first `n_use` of every `n` logits of each row (`logits`: `[rows, n]`; a model's
/// output head padded past its tokenizer's vocabulary), in place: no new vector. (A
/// `flat_map` collect into a fresh one cost ~3.6 ms of an 8-row step of the 32B on an H100,
/// session 24: the server's forward took 15.6 ms against 12.0 on the card.)
pub fn cut_rows(mut logits: Vec<f32>, n: usize, n_use: usize) -> Result<Vec<f32>, String> {
    if n_use == n {
        return Ok(logits);
    }
    if n == 0 || n_use > n || !logits.len().is_multiple_of(n) {
        return Err(format!(
            "{} logits are not rows of {n} (keeping {n_use} of each)",
            logits.len()
        ));
    }
    backend::cut_rows_in_place(&mut logits, n, n_use);
    Ok(logits)
}

#[cfg(test)]
mod cut_tests {
    use super::cut_rows;

    #[test]
    fn cut_rows_keeps_each_rows_head_in_order() {
        let logits: Vec<f32> = (0..15).map(|v| v as f32).collect();
        assert_eq!(
            cut_rows(logits.clone(), 5, 3).unwrap(),
            [0., 1., 2., 5., 6., 7., 10., 11., 12.]
        );
        assert_eq!(cut_rows(logits.clone(), 5, 5).unwrap(), logits);
        assert!(cut_rows(logits.clone(), 4, 3).is_err());
        assert!(cut_rows(logits, 5, 6).is_err());
        assert_eq!(cut_rows(Vec::new(), 5, 3).unwrap(), Vec::<f32>::new());
    }
}
