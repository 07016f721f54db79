//! The narrow view of a model that the scheduler needs: per-sequence state, prefill of one
//! sequence, and one batched decode step over many sequences.
//!
//! `model::Model` implements it in `model_adapter.rs`; tests use a small deterministic fake.

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
}
