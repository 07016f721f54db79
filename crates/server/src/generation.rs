//! One request's generation as the routes see it: scheduler events turned into text
//! deltas (stop sequences applied), log-probabilities, and a final finish reason + usage.

use std::sync::Arc;
use std::time::Instant;

use engine::scheduler::{
    FinishReason, GenerationEvent, GenerationRequest, GenerationStream, TokenLogprob, Usage,
};

use crate::error::ApiError;
use crate::service::InferenceService;
use crate::text_stream::TextStream;
use crate::validate::{resolve_max_tokens, GenerationSpec, OutputFormat};

/// One generated token with its log-probabilities, for reporting.
#[derive(Debug, Clone)]
pub struct TokenInfo {
    pub piece: Vec<u8>,
    pub logprob: TokenLogprob,
}

#[derive(Debug)]
pub enum Step {
    /// Text that may be sent (possibly empty while a stop sequence is pending or a UTF-8
    /// character is incomplete) and the tokens that produced it, if log-probabilities were asked.
    Text(String, Vec<TokenInfo>),
    /// The end: any text still held back, why it ended, and the counts.
    Finished {
        tail: String,
        tail_tokens: Vec<TokenInfo>,
        reason: &'static str,
        usage: Usage,
    },
}

pub struct Generation {
    service: Arc<dyn InferenceService>,
    events: Option<GenerationStream>,
    text: TextStream,
    prompt_tokens: usize,
    generated: usize,
    started: Instant,
    first_token: Option<Instant>,
    finished: bool,
}

impl Generation {
    /// Validates the prompt against the context and queues the request.
    pub fn start(
        service: Arc<dyn InferenceService>,
        prompt: Vec<u32>,
        spec: &GenerationSpec,
    ) -> Result<Generation, ApiError> {
        let info = service.info();
        if let Some(&bad) = prompt.iter().find(|&&t| t as usize >= info.n_vocab) {
            return Err(ApiError::invalid_param(
                "prompt",
                format!(
                    "token id {bad} is not below the vocabulary size {}",
                    info.n_vocab
                ),
            ));
        }
        let max_tokens = resolve_max_tokens(spec.max_tokens, prompt.len(), info.n_ctx)?;
        let constraint = match &spec.format {
            OutputFormat::Text => None,
            OutputFormat::JsonObject => Some(service.json_constraint(None)?),
            OutputFormat::JsonSchema(schema) => Some(service.json_constraint(Some(schema))?),
        };
        let prompt_tokens = prompt.len();
        let events = service.submit(GenerationRequest {
            prompt,
            sampling: spec.sampling.clone(),
            max_tokens,
            logprobs: spec.logprobs,
            ignore_eos: spec.ignore_eos,
            constraint,
        })?;
        Ok(Generation {
            service,
            events: Some(events),
            text: TextStream::new(spec.stop.clone()),
            prompt_tokens,
            generated: 0,
            started: Instant::now(),
            first_token: None,
            finished: false,
        })
    }

    /// Seconds from start to the first token, once there is one.
    pub fn time_to_first_token(&self) -> Option<f64> {
        self.first_token.map(|t| (t - self.started).as_secs_f64())
    }

    /// The next step; `None` after `Finished`. Errors end the generation.
    pub async fn next(&mut self) -> Option<Result<Step, ApiError>> {
        if self.finished {
            return None;
        }
        let event = match self.events.as_mut() {
            Some(rx) => rx.recv().await,
            None => None,
        };
        let step = match event {
            Some(GenerationEvent::Token { id, logprob }) => {
                self.generated += 1;
                self.first_token.get_or_insert_with(Instant::now);
                let piece = self.service.token_piece(id);
                let pushed = self.text.push(&piece);
                let infos = logprob
                    .map(|logprob| vec![TokenInfo { piece, logprob }])
                    .unwrap_or_default();
                if pushed.stopped {
                    // Dropping the receiver frees the slot before the next step.
                    self.events = None;
                    self.finished = true;
                    let usage = Usage {
                        prompt_tokens: self.prompt_tokens,
                        completion_tokens: self.generated,
                        prefill_seconds: self.time_to_first_token().unwrap_or(0.0),
                        decode_seconds: self.first_token.map_or(0.0, |t| t.elapsed().as_secs_f64()),
                        ..Default::default()
                    };
                    // The stopping token's text is cut right before the stop sequence.
                    return Some(Ok(Step::Finished {
                        tail: pushed.text,
                        tail_tokens: infos,
                        reason: "stop",
                        usage,
                    }));
                }
                Ok(Step::Text(pushed.text, infos))
            }
            Some(GenerationEvent::Done { reason, usage }) => {
                self.finished = true;
                let reason = match reason {
                    FinishReason::Stop => "stop",
                    FinishReason::Length => "length",
                };
                Ok(Step::Finished {
                    tail: self.text.finish(),
                    tail_tokens: Vec::new(),
                    reason,
                    usage,
                })
            }
            Some(GenerationEvent::Error(e)) => {
                self.finished = true;
                Err(ApiError::Internal(format!("generation failed: {e}")))
            }
            None => {
                self.finished = true;
                Err(ApiError::Internal(
                    "the scheduler dropped the request".into(),
                ))
            }
        };
        Some(step)
    }
}

/// Everything a non-streaming response needs.
pub struct Collected {
    pub text: String,
    pub reason: &'static str,
    pub usage: Usage,
    pub tokens: Vec<TokenInfo>,
}

pub async fn collect(mut g: Generation) -> Result<Collected, ApiError> {
    let mut text = String::new();
    let mut tokens = Vec::new();
    while let Some(step) = g.next().await {
        match step? {
            Step::Text(t, infos) => {
                text.push_str(&t);
                tokens.extend(infos);
            }
            Step::Finished {
                tail,
                tail_tokens,
                reason,
                usage,
            } => {
                text.push_str(&tail);
                tokens.extend(tail_tokens);
                return Ok(Collected {
                    text,
                    reason,
                    usage,
                    tokens,
                });
            }
        }
    }
    Err(ApiError::Internal(
        "generation ended without a result".into(),
    ))
}
