//! The single-sequence generation loop: prefill the prompt, then sample, detokenize, check
//! stop conditions and stream text, one token at a time.
//!
//! The model is any `FnMut(&[u32]) -> Result<Vec<f32>, E>` that appends tokens to its sequence
//! and returns the logits of the last one ([n_vocab] f32), e.g.
//! `|t| model.forward(&mut state, t, false)`, so this loop knows nothing of model internals and
//! is tested with a fake.

use std::ops::ControlFlow;
use std::time::Instant;

use crate::sampler::Sampler;
use crate::stop::StopMatcher;
use crate::tokenizer::{StreamDecoder, Tokenizer};

/// Limits of one generation.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateParams {
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Context size: generation stops when prompt + generated tokens reach it.
    pub n_ctx: usize,
    /// Text that ends generation (not included in the output).
    pub stop: Vec<String>,
    /// Keep going past end-of-generation tokens (for benchmarks).
    pub ignore_eog: bool,
}

impl Default for GenerateParams {
    fn default() -> Self {
        GenerateParams {
            max_tokens: 256,
            n_ctx: 4096,
            stop: Vec::new(),
            ignore_eog: false,
        }
    }
}

/// Whether a prompt of `n_prompt` tokens after `n_past` already in the sequence fits a context
/// of `n_ctx` tokens: the check [`generate`] makes first, for callers that want it before they
/// print or allocate anything.
pub fn check_prompt_fits(
    n_past: usize,
    n_prompt: usize,
    n_ctx: usize,
) -> Result<(), GenerateError> {
    if n_past + n_prompt > n_ctx {
        return Err(GenerateError::PromptTooLong {
            n_prompt: n_past + n_prompt,
            n_ctx,
        });
    }
    Ok(())
}

/// Why generation ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation token (EOS, EOT, `<|im_end|>` …) was sampled.
    EndOfGeneration,
    /// `max_tokens` were generated.
    Length,
    /// The context is full.
    ContextFull,
    /// A stop string appeared (its index in `GenerateParams::stop`).
    Stop(usize),
    /// The text callback asked to stop.
    Cancelled,
}

impl FinishReason {
    /// OpenAI's name: `stop` or `length` (cancelled reads as `stop`).
    pub fn openai_name(&self) -> &'static str {
        match self {
            FinishReason::Length | FinishReason::ContextFull => "length",
            _ => "stop",
        }
    }
}

/// Wall-clock times of the two phases, as llama.cpp reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Timings {
    /// Prompt tokens evaluated (in one prefill call).
    pub prompt_n: usize,
    pub prompt_ms: f64,
    /// Tokens generated (each one sampled, and all but the last also evaluated).
    pub predicted_n: usize,
    pub predicted_ms: f64,
}

impl Timings {
    pub fn prompt_per_second(&self) -> f64 {
        per_second(self.prompt_n, self.prompt_ms)
    }

    pub fn predicted_per_second(&self) -> f64 {
        per_second(self.predicted_n, self.predicted_ms)
    }
}

fn per_second(n: usize, ms: f64) -> f64 {
    if ms > 0.0 {
        n as f64 * 1000.0 / ms
    } else {
        0.0
    }
}

/// The result of one generation.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    /// Generated token ids; an end-of-generation token that ended the run is not included.
    pub tokens: Vec<u32>,
    /// Text shown (stop strings and end-of-generation tokens excluded).
    pub text: String,
    pub finish: FinishReason,
    pub timings: Timings,
}

/// Errors of the loop: the model failed, or there was nothing to evaluate.
#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    #[error("model forward failed: {0}")]
    Model(String),
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("the prompt ({n_prompt} tokens) does not fit the context ({n_ctx})")]
    PromptTooLong { n_prompt: usize, n_ctx: usize },
    #[error("the model returned {got} logits, expected {expected}")]
    BadLogits { got: usize, expected: usize },
}

/// Runs `prompt` through `forward` and generates until a stop condition. `on_text` receives
/// each piece of text as soon as it is safe to show (held back while it could be the start of a
/// stop string); returning `ControlFlow::Break` stops generation (e.g. on Ctrl-C).
///
/// `n_past` is how many tokens the sequence already holds before `prompt` (multi-turn chat
/// feeds only the new tokens); it counts against `n_ctx`. The prompt tokens are recorded in
/// the sampler's penalty window, as llama.cpp does.
pub fn generate<E: std::fmt::Display>(
    mut forward: impl FnMut(&[u32]) -> Result<Vec<f32>, E>,
    tokenizer: &Tokenizer,
    sampler: &mut Sampler,
    prompt: &[u32],
    n_past: usize,
    params: &GenerateParams,
    mut on_text: impl FnMut(&str) -> ControlFlow<()>,
) -> Result<Generation, GenerateError> {
    if prompt.is_empty() {
        return Err(GenerateError::EmptyPrompt);
    }
    check_prompt_fits(n_past, prompt.len(), params.n_ctx)?;
    let n_vocab = tokenizer.n_vocab();
    let mut timings = Timings {
        prompt_n: prompt.len(),
        ..Timings::default()
    };
    let t0 = Instant::now();
    let mut logits = forward(prompt).map_err(|e| GenerateError::Model(e.to_string()))?;
    timings.prompt_ms = t0.elapsed().as_secs_f64() * 1e3;
    for &t in prompt {
        sampler.accept(t);
    }

    let mut decoder = StreamDecoder::new(tokenizer);
    let mut stops = StopMatcher::new(params.stop.iter().cloned());
    let mut tokens = Vec::new();
    let mut text = String::new();
    let mut n_in_ctx = n_past + prompt.len();
    let t1 = Instant::now();
    let finish = loop {
        if tokens.len() >= params.max_tokens {
            break FinishReason::Length;
        }
        // Logits cover at least the tokenizer's vocabulary (models may pad the output head).
        if logits.len() < n_vocab {
            return Err(GenerateError::BadLogits {
                got: logits.len(),
                expected: n_vocab,
            });
        }
        let id = sampler.sample(&logits[..n_vocab]);
        timings.predicted_n += 1;
        if !params.ignore_eog && tokenizer.is_eog(id) {
            break FinishReason::EndOfGeneration;
        }
        sampler.accept(id);
        tokens.push(id);
        let out = stops.push(&decoder.push(id));
        text.push_str(&out.text);
        let flow = if out.text.is_empty() {
            ControlFlow::Continue(())
        } else {
            on_text(&out.text)
        };
        if let Some(i) = out.stop {
            break FinishReason::Stop(i);
        }
        if flow.is_break() {
            break FinishReason::Cancelled;
        }
        if tokens.len() >= params.max_tokens {
            break FinishReason::Length;
        }
        if n_in_ctx >= params.n_ctx {
            break FinishReason::ContextFull;
        }
        logits = forward(&[id]).map_err(|e| GenerateError::Model(e.to_string()))?;
        n_in_ctx += 1;
    };
    timings.predicted_ms = t1.elapsed().as_secs_f64() * 1e3;
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
    Ok(Generation {
        tokens,
        text,
        finish,
        timings,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::SamplerConfig;
    use gguf::{Array, Metadata, Value};

    /// A 6-token vocabulary: "a", "b", " ", "<0xC3>", "<0xA9>" (é in two byte tokens), EOS.
    fn tokenizer() -> Tokenizer {
        let mut m = Metadata::new();
        let tokens = ["a", "b", "Ġ", "Ã", "©", "</s>"];
        m.insert("tokenizer.ggml.model", Value::String("gpt2".into()));
        m.insert("tokenizer.ggml.pre", Value::String("qwen2".into()));
        m.insert(
            "tokenizer.ggml.tokens",
            Value::Array(Array::String(
                tokens.iter().map(|s| s.to_string()).collect(),
            )),
        );
        m.insert(
            "tokenizer.ggml.token_type",
            Value::Array(Array::I32(vec![1, 1, 1, 1, 1, 3])),
        );
        m.insert("tokenizer.ggml.merges", Value::Array(Array::String(vec![])));
        m.insert("tokenizer.ggml.eos_token_id", Value::U32(5));
        Tokenizer::from_gguf(&m).expect("test vocab loads")
    }

    /// A fake model that emits a scripted token sequence (one-hot logits), and records what it
    /// was fed.
    struct Script {
        next: Vec<u32>,
        fed: Vec<Vec<u32>>,
    }

    impl Script {
        fn forward(&mut self, t: &[u32]) -> Result<Vec<f32>, String> {
            self.fed.push(t.to_vec());
            let mut l = vec![0.0; 6];
            let id = if self.next.is_empty() {
                5
            } else {
                self.next.remove(0)
            };
            l[id as usize] = 10.0;
            Ok(l)
        }
    }

    fn run(script: &[u32], params: GenerateParams) -> (Generation, Vec<String>, Vec<Vec<u32>>) {
        let tok = tokenizer();
        let mut model = Script {
            next: script.to_vec(),
            fed: vec![],
        };
        let mut sampler = Sampler::new(SamplerConfig::greedy());
        let mut pieces = Vec::new();
        let g = generate(
            |t: &[u32]| model.forward(t),
            &tok,
            &mut sampler,
            &[0, 1],
            0,
            &params,
            |s| {
                pieces.push(s.to_owned());
                ControlFlow::Continue(())
            },
        )
        .unwrap();
        (g, pieces, model.fed)
    }

    #[test]
    fn stops_at_eos_without_emitting_it() {
        let (g, pieces, fed) = run(&[0, 2, 1], GenerateParams::default());
        assert_eq!(g.tokens, vec![0, 2, 1]);
        assert_eq!(g.text, "a b");
        assert_eq!(pieces.concat(), "a b");
        assert_eq!(g.finish, FinishReason::EndOfGeneration);
        // prompt once, then each generated token fed back
        assert_eq!(fed, vec![vec![0, 1], vec![0], vec![2], vec![1]]);
        assert_eq!(g.timings.prompt_n, 2);
    }

    #[test]
    fn max_tokens_limits_and_does_not_over_evaluate() {
        let params = GenerateParams {
            max_tokens: 2,
            ..GenerateParams::default()
        };
        let (g, _, fed) = run(&[0, 0, 0, 0], params);
        assert_eq!(g.tokens, vec![0, 0]);
        assert_eq!(g.finish, FinishReason::Length);
        assert_eq!(fed.len(), 2); // prompt + first token; the last sampled token is not fed
    }

    #[test]
    fn utf8_split_over_tokens_comes_out_whole() {
        let (g, pieces, _) = run(&[0, 3, 4, 1], GenerateParams::default());
        assert_eq!(g.text, "aéb");
        assert!(pieces.iter().all(|p| !p.contains('\u{FFFD}')));
    }

    #[test]
    fn stop_string_is_cut() {
        let params = GenerateParams {
            stop: vec!["b a".into()],
            ..GenerateParams::default()
        };
        let (g, pieces, _) = run(&[0, 1, 2, 0, 1], params);
        assert_eq!(g.text, "a");
        assert_eq!(pieces.concat(), "a");
        assert_eq!(g.finish, FinishReason::Stop(0));
    }

    #[test]
    fn context_limit() {
        let params = GenerateParams {
            n_ctx: 4,
            ..GenerateParams::default()
        };
        let (g, _, _) = run(&[0, 0, 0, 0, 0], params);
        // 2 prompt + 2 evaluated generated tokens fill 4 slots; a third is sampled from the last
        // logits but cannot be evaluated.
        assert_eq!(g.tokens.len(), 3);
        assert_eq!(g.finish, FinishReason::ContextFull);
    }

    #[test]
    fn cancel_from_callback() {
        let tok = tokenizer();
        let mut model = Script {
            next: vec![0, 0, 0, 0],
            fed: vec![],
        };
        let mut sampler = Sampler::new(SamplerConfig::greedy());
        let g = generate(
            |t: &[u32]| model.forward(t),
            &tok,
            &mut sampler,
            &[0],
            0,
            &GenerateParams::default(),
            |_| ControlFlow::Break(()),
        )
        .unwrap();
        assert_eq!(g.tokens.len(), 1);
        assert_eq!(g.finish, FinishReason::Cancelled);
    }

    #[test]
    fn errors_are_typed() {
        let tok = tokenizer();
        let mut s = Sampler::new(SamplerConfig::greedy());
        let p = GenerateParams::default();
        let cont = |_: &str| ControlFlow::Continue(());
        let fail = |_: &[u32]| Err::<Vec<f32>, _>("boom");
        assert!(matches!(
            generate(fail, &tok, &mut s, &[0], 0, &p, cont),
            Err(GenerateError::Model(_))
        ));
        let ok = |_: &[u32]| Ok::<_, String>(vec![0.0; 6]);
        assert!(matches!(
            generate(ok, &tok, &mut s, &[], 0, &p, cont),
            Err(GenerateError::EmptyPrompt)
        ));
        let short = |_: &[u32]| Ok::<_, String>(vec![0.0; 3]);
        assert!(matches!(
            generate(short, &tok, &mut s, &[0], 0, &p, cont),
            Err(GenerateError::BadLogits { .. })
        ));
    }
}
