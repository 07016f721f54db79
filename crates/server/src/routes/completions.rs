//! POST /v1/completions — the legacy text completion API, whole and streamed.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, StreamExt};

use super::chat::{observe, usage_note, Meta};
use super::sse::{done_event, error_event, json_event, response_id, unix_now};
use crate::app::{parse_body, AppState, LogNote, LoggedByStream};
use crate::error::ApiError;
use crate::generation::{collect, Generation, Step, TokenInfo};
use crate::openai::request::{CompletionRequest, Prompt};
use crate::openai::response::*;
use crate::service::InferenceService;
use crate::validate::sampling_spec;

/// Legacy completions allow up to 5 alternatives; we allow as many as chat does.
const MAX_LOGPROBS: i64 = 20;
/// OpenAI's default `max_tokens` for completions.
const DEFAULT_MAX_TOKENS: usize = 16;

fn token_ids(ids: &[i64]) -> Result<Vec<u32>, ApiError> {
    ids.iter()
        .map(|&t| {
            u32::try_from(t)
                .map_err(|_| ApiError::invalid_param("prompt", format!("{t} is not a token id")))
        })
        .collect()
}

fn prompt_tokens(service: &dyn InferenceService, prompt: &Prompt) -> Result<Vec<u32>, ApiError> {
    let one = |n: usize| {
        if n == 1 {
            Ok(())
        } else {
            Err(ApiError::invalid_param(
                "prompt",
                format!("exactly one prompt is supported, got {n}"),
            ))
        }
    };
    match prompt {
        Prompt::Text(t) => service.tokenize(t, true),
        Prompt::Texts(v) => {
            one(v.len())?;
            service.tokenize(&v[0], true)
        }
        Prompt::Tokens(ids) => token_ids(ids),
        Prompt::TokenLists(lists) => {
            one(lists.len())?;
            token_ids(&lists[0])
        }
    }
}

fn logprobs_out(
    service: &dyn InferenceService,
    tokens: &[TokenInfo],
    offset: &mut usize,
) -> CompletionLogprobs {
    let mut out = CompletionLogprobs::default();
    for t in tokens {
        let text = String::from_utf8_lossy(&t.piece).into_owned();
        out.text_offset.push(*offset);
        *offset += text.len();
        out.tokens.push(text);
        out.token_logprobs.push(t.logprob.logprob);
        let top: BTreeMap<String, f32> = t
            .logprob
            .top
            .iter()
            .map(|&(id, lp)| {
                (
                    String::from_utf8_lossy(&service.token_piece(id)).into_owned(),
                    lp,
                )
            })
            .collect();
        out.top_logprobs.push(top);
    }
    out
}

pub async fn completions(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    handle(state, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn handle(
    state: Arc<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let started = std::time::Instant::now();
    let req: CompletionRequest = parse_body(body, state.config.max_body_bytes)?;
    let service = state.service()?;
    let info = service.info().clone();
    let mut spec = sampling_spec(&req.sampling, &state.config.defaults, info.n_vocab)?;
    spec.max_tokens = Some(spec.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS));
    match req.logprobs {
        None => {}
        Some(n) if (0..=MAX_LOGPROBS).contains(&n) => spec.logprobs = Some(n as usize),
        Some(n) => {
            return Err(ApiError::invalid_param(
                "logprobs",
                format!("logprobs must be between 0 and {MAX_LOGPROBS}, got {n}"),
            ))
        }
    }
    if req.echo == Some(true) {
        return Err(ApiError::invalid_param("echo", "echo is not supported"));
    }
    if req.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::invalid_param("suffix", "suffix is not supported"));
    }
    let svc = service.clone();
    let prompt_spec = req.prompt.clone();
    let prompt = tokio::task::spawn_blocking(move || prompt_tokens(&*svc, &prompt_spec))
        .await
        .map_err(|e| ApiError::Internal(format!("prompt task failed: {e}")))??;
    let generation = Generation::start(service.clone(), prompt, &spec)?;
    let meta = Meta {
        started,
        id: response_id("cmpl"),
        created: unix_now(),
        model: info.id.clone(),
    };

    let wants_logprobs = spec.logprobs.is_some();
    if spec.stream {
        let s = TextStreamState {
            state: state.clone(),
            service,
            generation,
            meta,
            include_usage: spec.include_usage,
            wants_logprobs,
            offset: 0,
            ended: false,
        };
        let events = stream::unfold(
            s,
            |mut s| async move { s.next_events().await.map(|ev| (ev, s)) },
        )
        .flat_map(|events| stream::iter(events.into_iter().map(Ok::<Event, Infallible>)));
        let mut response = Sse::new(events)
            .keep_alive(KeepAlive::default())
            .into_response();
        response.extensions_mut().insert(LoggedByStream);
        return Ok(response);
    }

    let done = collect(generation).await?;
    observe(&state, &done.usage);
    let logprobs = wants_logprobs.then(|| logprobs_out(&*service, &done.tokens, &mut 0));
    let body = Completion {
        id: meta.id,
        object: "text_completion",
        created: meta.created,
        model: meta.model,
        system_fingerprint: SYSTEM_FINGERPRINT,
        choices: vec![CompletionChoice {
            index: 0,
            text: done.text,
            logprobs,
            finish_reason: Some(done.reason),
        }],
        usage: Some(Usage::from_engine(&done.usage)),
        timings: Some(Timings::from_engine(&done.usage)),
    };
    let mut response = Json(body).into_response();
    response
        .extensions_mut()
        .insert(LogNote(usage_note(&done.usage, done.reason)));
    Ok(response)
}

struct TextStreamState {
    state: Arc<AppState>,
    service: Arc<dyn InferenceService>,
    generation: Generation,
    meta: Meta,
    include_usage: bool,
    wants_logprobs: bool,
    /// Bytes of text sent so far (for `text_offset`).
    offset: usize,
    ended: bool,
}

impl Drop for TextStreamState {
    fn drop(&mut self) {
        if !self.ended {
            tracing::info!(
                "POST /v1/completions 499 {:.1}ms stream closed by the client",
                self.meta.elapsed_ms()
            );
        }
    }
}

impl TextStreamState {
    fn chunk(
        &mut self,
        text: String,
        tokens: &[TokenInfo],
        finish_reason: Option<&'static str>,
        usage: Option<Usage>,
    ) -> Event {
        let logprobs = self
            .wants_logprobs
            .then(|| logprobs_out(&*self.service, tokens, &mut self.offset));
        json_event(&Completion {
            id: self.meta.id.clone(),
            object: "text_completion",
            created: self.meta.created,
            model: self.meta.model.clone(),
            system_fingerprint: SYSTEM_FINGERPRINT,
            choices: vec![CompletionChoice {
                index: 0,
                text,
                logprobs,
                finish_reason,
            }],
            usage,
            timings: None,
        })
    }

    async fn next_events(&mut self) -> Option<Vec<Event>> {
        if self.ended {
            return None;
        }
        let mut out = Vec::new();
        match self.generation.next().await {
            None => {
                self.ended = true;
                return None;
            }
            Some(Err(e)) => {
                self.ended = true;
                tracing::warn!("POST /v1/completions stream failed: {e}");
                out.push(error_event(&e));
                out.push(done_event());
            }
            Some(Ok(Step::Text(text, tokens))) => {
                if !text.is_empty() || !tokens.is_empty() {
                    out.push(self.chunk(text, &tokens, None, None));
                }
            }
            Some(Ok(Step::Finished {
                tail,
                tail_tokens,
                reason,
                usage,
            })) => {
                self.ended = true;
                // OpenAI puts the finish reason on the last text chunk and usage on a final one.
                out.push(self.chunk(tail, &tail_tokens, Some(reason), None));
                if self.include_usage {
                    let mut last = Completion {
                        id: self.meta.id.clone(),
                        object: "text_completion",
                        created: self.meta.created,
                        model: self.meta.model.clone(),
                        system_fingerprint: SYSTEM_FINGERPRINT,
                        choices: vec![],
                        usage: Some(Usage::from_engine(&usage)),
                        timings: Some(Timings::from_engine(&usage)),
                    };
                    last.choices.clear();
                    out.push(json_event(&last));
                }
                out.push(done_event());
                observe(&self.state, &usage);
                tracing::info!(
                    "POST /v1/completions 200 {:.1}ms stream {}",
                    self.meta.elapsed_ms(),
                    usage_note(&usage, reason)
                );
            }
        }
        Some(out)
    }
}
