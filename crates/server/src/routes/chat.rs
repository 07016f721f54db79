//! POST /v1/chat/completions — whole responses and SSE streams, tool calls, logprobs.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use engine::tool_calls::{parse_tool_calls_with_tools, ToolFamily};
use futures_util::stream::{self, StreamExt};
use serde_json::{json, Value};

use super::sse::{done_event, error_event, json_event, response_id, unix_now};
use crate::app::{parse_body, AppState, LogNote, LoggedByStream};
use crate::error::ApiError;
use crate::generation::{collect, Generation, Step, TokenInfo};
use crate::openai::request::ChatCompletionRequest;
use crate::openai::response::*;
use crate::service::InferenceService;
use crate::validate::{chat_input, OutputFormat, ToolChoice};

/// JSON schema of a forced tool call `{"name": ..., "arguments": {...}}`, one branch per allowed tool.
fn forced_call_schema(tools: &[Value], only: Option<&str>) -> Value {
    let branches: Vec<Value> = tools
        .iter()
        .filter(|t| {
            only.is_none_or(|n| t.pointer("/function/name").and_then(Value::as_str) == Some(n))
        })
        .map(|t| {
            let params = t
                .pointer("/function/parameters")
                .cloned()
                .unwrap_or_else(|| json!({"type": "object"}));
            json!({
                "type": "object",
                "properties": {"name": {"const": t.pointer("/function/name")}, "arguments": params},
                "required": ["name", "arguments"],
                "additionalProperties": false
            })
        })
        .collect();
    if branches.len() == 1 {
        branches.into_iter().next().unwrap_or_default()
    } else {
        json!({"anyOf": branches})
    }
}

pub fn logprobs_out(service: &dyn InferenceService, tokens: &[TokenInfo]) -> Vec<TokenLogprobOut> {
    tokens
        .iter()
        .map(|t| TokenLogprobOut {
            token: String::from_utf8_lossy(&t.piece).into_owned(),
            logprob: t.logprob.logprob,
            bytes: t.piece.clone(),
            top_logprobs: t
                .logprob
                .top
                .iter()
                .map(|&(id, logprob)| {
                    let bytes = service.token_piece(id);
                    TopLogprob {
                        token: String::from_utf8_lossy(&bytes).into_owned(),
                        logprob,
                        bytes,
                    }
                })
                .collect(),
        })
        .collect()
}

/// How the generated text is read back: plain, plain after a leading `<think>` block
/// (reasoning templates without tools), or as tool calls of some family.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Reading {
    Text,
    Think,
    Tools(ToolFamily),
}

/// Whether the rendered prompt ends inside an opened `<think>` block (QwQ, DeepSeek-R1 and
/// Qwen3.5 templates write `<think>\n` after the assistant header): the reply then starts
/// with reasoning and has no opening tag of its own.
fn prompt_opens_think(service: &dyn InferenceService, prompt: &[u32]) -> bool {
    let tail = &prompt[prompt.len().saturating_sub(8)..];
    service.detokenize(tail).trim_end().ends_with("<think>")
}

/// Splits a whole reply into (reasoning, answer), as the stream does: a leading `<think>`
/// (or a block the prompt opened) up to `</think>`; an unterminated block is all reasoning.
fn split_think(text: &str, opened: bool) -> (Option<String>, String) {
    let body = if opened {
        text
    } else {
        match text.strip_prefix("<think>") {
            Some(rest) => rest,
            None => return (None, text.to_string()),
        }
    };
    match body.find("</think>") {
        Some(end) => (
            Some(body[..end].trim().to_string()),
            body[end + "</think>".len()..].trim_start().to_string(),
        ),
        None => (Some(body.trim().to_string()), String::new()),
    }
}

/// A reply read as tool calls, in OpenAI's shape.
struct ToolReply {
    content: Option<String>,
    reasoning: Option<String>,
    calls: Vec<ToolCallOut>,
}

/// Parses `text` with the engine's parser (`tools`: the request's, so declared-string
/// parameters stay strings). Ids are `call_<response id>_<n>`, unique across responses.
fn read_tool_reply(
    text: &str,
    family: ToolFamily,
    tools: &[Value],
    response_id: &str,
) -> ToolReply {
    let parsed = parse_tool_calls_with_tools(family, text, tools);
    let calls = parsed
        .tool_calls
        .into_iter()
        .enumerate()
        .map(|(n, c)| ToolCallOut {
            index: None,
            id: format!("call_{response_id}_{n}"),
            kind: "function",
            function: FunctionCallOut {
                name: c.name,
                arguments: c.arguments,
            },
        })
        .collect();
    ToolReply {
        content: parsed.content,
        reasoning: parsed.reasoning,
        calls,
    }
}

pub async fn chat_completions(
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
    let req: ChatCompletionRequest = parse_body(body, state.config.max_body_bytes)?;
    let service = state.service()?;
    let info = service.info().clone();
    let input = chat_input(&req, &state.config.defaults, info.n_vocab)?;
    let mut spec = input.spec;

    let tools = if input.tool_choice == ToolChoice::None {
        None
    } else {
        input.tools.as_deref()
    };
    let reading = match (&input.tool_choice, tools) {
        (ToolChoice::Required | ToolChoice::Function(_), Some(t)) => {
            if spec.format != OutputFormat::Text {
                return Err(ApiError::invalid_param(
                    "response_format",
                    "response_format cannot be combined with a forced tool_choice",
                ));
            }
            let only = match &input.tool_choice {
                ToolChoice::Function(n) => Some(n.as_str()),
                _ => None,
            };
            spec.format = OutputFormat::JsonSchema(forced_call_schema(t, only));
            // The constrained output is the bare call object.
            Reading::Tools(ToolFamily::Llama3)
        }
        (_, Some(_)) => Reading::Tools(info.tool_family),
        _ if info.reasoning && spec.format == OutputFormat::Text => Reading::Think,
        _ => Reading::Text,
    };

    let messages = input.messages;
    let tools_owned = tools.map(<[Value]>::to_vec).unwrap_or_default();
    let svc = service.clone();
    let prompt_tools = tools.map(<[Value]>::to_vec);
    let prompt =
        tokio::task::spawn_blocking(move || svc.chat_prompt(&messages, prompt_tools.as_deref()))
            .await
            .map_err(|e| ApiError::Internal(format!("prompt task failed: {e}")))??;
    let opens_think = reading != Reading::Text && prompt_opens_think(&*service, &prompt);
    let generation = Generation::start(service.clone(), prompt, &spec)?;
    let meta = Meta {
        started,
        id: response_id("chatcmpl"),
        created: unix_now(),
        model: info.id.clone(),
    };

    if spec.stream {
        let stream = ChatStream {
            state: state.clone(),
            service,
            generation,
            meta,
            reading,
            tools: tools_owned,
            include_usage: spec.include_usage,
            buffered: String::new(),
            forced: matches!(
                input.tool_choice,
                ToolChoice::Required | ToolChoice::Function(_)
            ),
            calls_started: false,
            think: if opens_think {
                Think::Inside
            } else {
                Think::Unknown
            },
            trim_leading: opens_think,
            started: false,
            ended: false,
        };
        let events = stream::unfold(stream, |mut s| async move {
            s.next_events().await.map(|ev| (ev, s))
        })
        .flat_map(|events| stream::iter(events.into_iter().map(Ok::<Event, Infallible>)));
        let mut response = Sse::new(events)
            .keep_alive(KeepAlive::default())
            .into_response();
        response.extensions_mut().insert(LoggedByStream);
        return Ok(response);
    }

    let done = collect(generation).await?;
    observe(&state, &done.usage);
    let (content, reasoning_content, calls) = match reading {
        Reading::Text => (Some(done.text), None, None),
        Reading::Think => {
            let (reasoning, answer) = split_think(&done.text, opens_think);
            (Some(answer), reasoning, None)
        }
        Reading::Tools(family) => {
            let reply = read_tool_reply(&done.text, family, &tools_owned, &meta.id);
            match (reply.calls.is_empty(), reply.reasoning) {
                // Plain text: kept exactly as generated.
                (true, None) => (Some(done.text), None, None),
                (true, Some(r)) => (reply.content, Some(r), None),
                (false, r) => (reply.content, r, Some(reply.calls)),
            }
        }
    };
    let finish_reason = if calls.is_some() {
        "tool_calls"
    } else {
        done.reason
    };
    let logprobs = spec.logprobs.map(|_| ChoiceLogprobs {
        content: logprobs_out(&*service, &done.tokens),
    });
    let body = ChatCompletion {
        id: meta.id,
        object: "chat.completion",
        created: meta.created,
        model: meta.model,
        system_fingerprint: SYSTEM_FINGERPRINT,
        choices: vec![ChatChoice {
            index: 0,
            message: AssistantMessage {
                role: "assistant",
                content,
                reasoning_content,
                tool_calls: calls,
            },
            logprobs,
            finish_reason,
        }],
        usage: Usage::from_engine(&done.usage),
        timings: Timings::from_engine(&done.usage),
    };
    let mut response = Json(body).into_response();
    response
        .extensions_mut()
        .insert(LogNote(usage_note(&done.usage, finish_reason)));
    Ok(response)
}

pub struct Meta {
    pub id: String,
    pub created: u64,
    pub model: String,
    /// When the request was read, for the stream's log line.
    pub started: std::time::Instant,
}

impl Meta {
    pub fn elapsed_ms(&self) -> f64 {
        self.started.elapsed().as_secs_f64() * 1e3
    }
}

/// A short usage summary for the request's log line.
pub fn usage_note(u: &engine::scheduler::Usage, reason: &str) -> String {
    let t = Timings::from_engine(u);
    let mut note = format!(
        "prompt={} cached={} gen={} ttft={:.0}ms decode={:.1}tok/s finish={reason}",
        u.prompt_tokens, u.cached_tokens, u.completion_tokens, t.prompt_ms, t.predicted_per_second
    );
    if let Some(s) = &u.speculative {
        // Speculative acceptance of this request: drafts kept / proposed, verify passes.
        note.push_str(&format!(
            " spec={}/{} accepted ({:.1}%) in {} verify passes",
            s.accepted,
            s.drafted,
            100.0 * s.acceptance_rate(),
            s.verify_passes
        ));
    }
    note
}

/// Records time to first token in the metrics histogram.
pub fn observe(state: &AppState, u: &engine::scheduler::Usage) {
    if u.completion_tokens > 0 {
        if let Ok(mut h) = state.metrics.ttft.lock() {
            h.observe(u.prefill_seconds);
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Think {
    /// Not enough text yet to tell whether the reply opens with `<think>`.
    Unknown,
    Inside,
    Done,
}

struct ChatStream {
    state: Arc<AppState>,
    service: Arc<dyn InferenceService>,
    generation: Generation,
    meta: Meta,
    reading: Reading,
    /// The request's tools (declared parameter types guide parsing).
    tools: Vec<Value>,
    include_usage: bool,
    /// Text held back because it is (or may become) a tool call.
    buffered: String,
    /// The output is a constrained tool call: hold everything until the end.
    forced: bool,
    /// A tool call has begun: hold the rest until the end.
    calls_started: bool,
    /// Where the stream is relative to a leading `<think>` block.
    think: Think,
    /// Drop whitespace at the front of the buffer (right after a think tag).
    trim_leading: bool,
    started: bool,
    ended: bool,
}

impl Drop for ChatStream {
    fn drop(&mut self) {
        if !self.ended {
            tracing::info!(
                "POST /v1/chat/completions 499 {:.1}ms stream closed by the client",
                self.meta.elapsed_ms()
            );
        }
    }
}

impl ChatStream {
    fn chunk(
        &self,
        delta: ChatDelta,
        logprobs: Option<ChoiceLogprobs>,
        finish_reason: Option<&'static str>,
    ) -> Event {
        json_event(&ChatCompletionChunk {
            id: self.meta.id.clone(),
            object: "chat.completion.chunk",
            created: self.meta.created,
            model: self.meta.model.clone(),
            system_fingerprint: SYSTEM_FINGERPRINT,
            choices: vec![ChatChunkChoice {
                index: 0,
                delta,
                logprobs,
                finish_reason,
            }],
            usage: self.include_usage.then_some(None),
            timings: None,
        })
    }

    fn content_chunk(&self, text: String, tokens: &[TokenInfo]) -> Option<Event> {
        if text.is_empty() && tokens.is_empty() {
            return None;
        }
        let logprobs = (!tokens.is_empty()).then(|| ChoiceLogprobs {
            content: logprobs_out(&*self.service, tokens),
        });
        Some(self.chunk(
            ChatDelta {
                content: Some(text),
                ..Default::default()
            },
            logprobs,
            None,
        ))
    }

    /// Sends buffered text that cannot be part of a tool call, so content streams even when
    /// tools are offered; keeps the rest once a call may have begun. A leading `<think>`
    /// block streams as `reasoning_content`.
    fn release_content(&mut self, family: ToolFamily) -> Vec<Event> {
        let mut out = Vec::new();
        match family {
            ToolFamily::Qwen => {
                if !self.release_reasoning(&mut out) {
                    return out;
                }
                const MARK: &str = "<tool_call>";
                let cut = match self.buffered.find(MARK) {
                    Some(at) => {
                        self.calls_started = true;
                        at
                    }
                    None => {
                        self.buffered.len()
                            - crate::text_stream::longest_suffix_prefix(&self.buffered, MARK)
                    }
                };
                let text: String = self.buffered.drain(..cut).collect();
                out.extend(self.content_chunk(text, &[]));
            }
            ToolFamily::Llama3 => {
                // A Llama 3 call is the whole reply: JSON, or the python tag, at the start.
                const TAG: &str = "<|python_tag|>";
                let head = self.buffered.trim_start();
                if head.is_empty() || (TAG.starts_with(head) && head.len() < TAG.len()) {
                    return out;
                }
                if head.starts_with('{') || head.starts_with(TAG) {
                    self.calls_started = true;
                    return out;
                }
                self.reading = Reading::Text;
                let text = std::mem::take(&mut self.buffered);
                out.extend(self.content_chunk(text, &[]));
            }
        }
        out
    }

    /// Streams a leading `<think>…</think>` block as `reasoning_content` deltas (whitespace
    /// right after either tag dropped, as the whole-response parser trims). Returns true once
    /// the rest of the buffer is past any reasoning.
    fn release_reasoning(&mut self, out: &mut Vec<Event>) -> bool {
        const OPEN: &str = "<think>";
        const CLOSE: &str = "</think>";
        if self.trim_leading {
            let start = self.buffered.len() - self.buffered.trim_start().len();
            self.buffered.drain(..start);
            if self.buffered.is_empty() {
                return false;
            }
            self.trim_leading = false;
        }
        if self.think == Think::Unknown {
            let head = self.buffered.as_str();
            if OPEN.starts_with(head) && head.len() < OPEN.len() {
                return false;
            }
            if head.starts_with(OPEN) {
                self.buffered.drain(..OPEN.len());
                self.think = Think::Inside;
                self.trim_leading = true;
                return self.release_reasoning(out);
            }
            self.think = Think::Done;
        }
        if self.think == Think::Inside {
            let (cut, closed) = match self.buffered.find(CLOSE) {
                Some(at) => (at, true),
                None => (
                    self.buffered.len()
                        - crate::text_stream::longest_suffix_prefix(&self.buffered, CLOSE),
                    false,
                ),
            };
            let text: String = self.buffered.drain(..cut).collect();
            out.extend(self.reasoning_chunk(text));
            if !closed {
                return false;
            }
            self.buffered.drain(..CLOSE.len());
            self.think = Think::Done;
            self.trim_leading = true;
            return self.release_reasoning(out);
        }
        true
    }

    fn reasoning_chunk(&self, text: String) -> Option<Event> {
        (!text.is_empty()).then(|| {
            self.chunk(
                ChatDelta {
                    reasoning_content: Some(text),
                    ..Default::default()
                },
                None,
                None,
            )
        })
    }

    /// The events for the next generation step; `None` when the stream is over.
    async fn next_events(&mut self) -> Option<Vec<Event>> {
        if self.ended {
            return None;
        }
        let mut out = Vec::new();
        if !self.started {
            self.started = true;
            let role = ChatDelta {
                role: Some("assistant"),
                content: Some(String::new()),
                ..Default::default()
            };
            out.push(self.chunk(role, None, None));
            return Some(out);
        }
        match self.generation.next().await {
            None => {
                self.ended = true;
                return None;
            }
            Some(Err(e)) => {
                self.ended = true;
                tracing::warn!("POST /v1/chat/completions stream failed: {e}");
                out.push(error_event(&e));
                out.push(done_event());
            }
            Some(Ok(Step::Text(text, tokens))) => match self.reading {
                Reading::Tools(family) => {
                    self.buffered.push_str(&text);
                    if !self.forced && !self.calls_started {
                        let events = self.release_content(family);
                        out.extend(events);
                    }
                }
                Reading::Text => out.extend(self.content_chunk(text, &tokens)),
                Reading::Think => {
                    self.buffered.push_str(&text);
                    let past = self.release_reasoning(&mut out);
                    let text = if past {
                        std::mem::take(&mut self.buffered)
                    } else {
                        String::new()
                    };
                    // The step's logprobs ride on its content chunk (empty while reasoning).
                    out.extend(self.content_chunk(text, &tokens));
                }
            },
            Some(Ok(Step::Finished {
                tail,
                tail_tokens,
                reason,
                usage,
            })) => {
                self.ended = true;
                let mut finish = reason;
                match self.reading {
                    Reading::Text => out.extend(self.content_chunk(tail, &tail_tokens)),
                    Reading::Think => {
                        self.buffered.push_str(&tail);
                        let past = self.release_reasoning(&mut out);
                        let rest = std::mem::take(&mut self.buffered);
                        if !past && self.think == Think::Inside {
                            // Unterminated reasoning (cut off by max_tokens or a stop).
                            out.extend(self.reasoning_chunk(rest));
                        } else {
                            out.extend(self.content_chunk(rest, &[]));
                        }
                    }
                    Reading::Tools(family) => {
                        self.buffered.push_str(&tail);
                        let mut text = std::mem::take(&mut self.buffered);
                        if self.think == Think::Inside {
                            // Unterminated reasoning (cut off by max_tokens or a stop).
                            let end = text.find("</think>").unwrap_or(text.len());
                            let reasoning: String = text.drain(..end).collect();
                            out.extend(self.reasoning_chunk(reasoning));
                            text = text.trim_start_matches("</think>").to_string();
                        }
                        let reply = read_tool_reply(&text, family, &self.tools, &self.meta.id);
                        if reply.calls.is_empty() {
                            out.extend(self.content_chunk(text, &[]));
                        } else {
                            finish = "tool_calls";
                            if let Some(r) = reply.reasoning {
                                out.extend(self.reasoning_chunk(r));
                            }
                            if let Some(c) = reply.content {
                                out.extend(self.content_chunk(c, &[]));
                            }
                            let calls = reply
                                .calls
                                .into_iter()
                                .enumerate()
                                .map(|(i, c)| ToolCallOut {
                                    index: Some(i),
                                    ..c
                                })
                                .collect();
                            out.push(self.chunk(
                                ChatDelta {
                                    tool_calls: Some(calls),
                                    ..Default::default()
                                },
                                None,
                                None,
                            ));
                        }
                    }
                }
                out.push(self.chunk(ChatDelta::default(), None, Some(finish)));
                if self.include_usage {
                    out.push(json_event(&ChatCompletionChunk {
                        id: self.meta.id.clone(),
                        object: "chat.completion.chunk",
                        created: self.meta.created,
                        model: self.meta.model.clone(),
                        system_fingerprint: SYSTEM_FINGERPRINT,
                        choices: vec![],
                        usage: Some(Some(Usage::from_engine(&usage))),
                        timings: Some(Timings::from_engine(&usage)),
                    }));
                }
                out.push(done_event());
                observe(&self.state, &usage);
                tracing::info!(
                    "POST /v1/chat/completions 200 {:.1}ms stream {}",
                    self.meta.elapsed_ms(),
                    usage_note(&usage, finish)
                );
            }
        }
        Some(out)
    }
}
