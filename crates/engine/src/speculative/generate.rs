//! The speculative generation loop: [`crate::generate::generate`]'s contract (detokenize,
//! stop strings, end-of-generation, limits, streaming), with tokens decided in blocks by the
//! [`SpeculativeDecoder`].
//!
//! Every limit is checked per token exactly as the plain loop checks it, so with greedy
//! sampling both loops return the same tokens, text and finish reason. After a stop in the
//! middle of a block, the target state may hold a few tokens past the output.

use std::ops::ControlFlow;
use std::time::Instant;

use super::{SpecModel, SpecOptions, SpecStats, SpeculativeDecoder};
use crate::generate::{FinishReason, GenerateError, GenerateParams, Generation, Timings};
use crate::sampler::Sampler;
use crate::stop::StopMatcher;
use crate::tokenizer::{StreamDecoder, Tokenizer};

/// Generates from `prompt` with speculation. `model` starts at its current length (it
/// counts against `params.n_ctx`, as `n_past` does in the plain loop).
pub fn generate_speculative<S: SpecModel>(
    model: &mut S,
    tokenizer: &Tokenizer,
    sampler: &mut Sampler,
    prompt: &[u32],
    params: &GenerateParams,
    opts: &SpecOptions,
    mut on_text: impl FnMut(&str) -> ControlFlow<()>,
) -> Result<(Generation, SpecStats), GenerateError> {
    if prompt.is_empty() {
        return Err(GenerateError::EmptyPrompt);
    }
    let n_past = model.target_len();
    let n_ctx = params.n_ctx.min(model.n_ctx());
    crate::generate::check_prompt_fits(n_past, prompt.len(), n_ctx)?;
    let n_vocab = tokenizer.n_vocab();
    if model.n_vocab() < n_vocab {
        return Err(GenerateError::BadLogits {
            got: model.n_vocab(),
            expected: n_vocab,
        });
    }
    let model_err = |e: super::SpecError| GenerateError::Model(e.to_string());
    let mut timings = Timings {
        prompt_n: prompt.len(),
        ..Timings::default()
    };
    let mut dec = SpeculativeDecoder::new(model, sampler, opts.clone());
    dec.limit_vocab(n_vocab);
    let t0 = Instant::now();
    dec.prefill(prompt).map_err(model_err)?;
    timings.prompt_ms = t0.elapsed().as_secs_f64() * 1e3;

    let mut decoder = StreamDecoder::new(tokenizer);
    let mut stops = StopMatcher::new(params.stop.iter().cloned());
    let mut tokens = Vec::new();
    let mut text = String::new();
    // Tokens the plain loop would have run through the model so far.
    let n_start = n_past + prompt.len();
    let t1 = Instant::now();
    let finish = 'outer: loop {
        if tokens.len() >= params.max_tokens {
            break FinishReason::Length;
        }
        let budget = params.max_tokens - tokens.len();
        let block = dec.next_tokens(budget).map_err(model_err)?;
        for id in block {
            if id as usize >= n_vocab {
                return Err(GenerateError::BadLogits {
                    got: id as usize,
                    expected: n_vocab,
                });
            }
            timings.predicted_n += 1;
            if !params.ignore_eog && tokenizer.is_eog(id) {
                break 'outer FinishReason::EndOfGeneration;
            }
            tokens.push(id);
            let out = stops.push(&decoder.push(id));
            text.push_str(&out.text);
            let flow = if out.text.is_empty() {
                ControlFlow::Continue(())
            } else {
                on_text(&out.text)
            };
            if let Some(i) = out.stop {
                break 'outer FinishReason::Stop(i);
            }
            if flow.is_break() {
                break 'outer FinishReason::Cancelled;
            }
            if tokens.len() >= params.max_tokens {
                break 'outer FinishReason::Length;
            }
            if n_start + tokens.len() > n_ctx {
                break 'outer FinishReason::ContextFull;
            }
        }
    };
    timings.predicted_ms = t1.elapsed().as_secs_f64() * 1e3;
    let stats = dec.stats();
    if !matches!(finish, FinishReason::Stop(_) | FinishReason::Cancelled) {
        let tail = stops.push(&decoder.finish());
        let mut rest = tail.text;
        if tail.stop.is_none() {
            rest.push_str(&stops.finish());
        }
        if !rest.is_empty() {
            text.push_str(&rest);
            let _ = on_text(&rest);
        }
    }
    Ok((
        Generation {
            tokens,
            text,
            finish,
            timings,
        },
        stats,
    ))
}
