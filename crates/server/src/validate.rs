//! Checks request fields and turns them into what the scheduler takes. Every limit
//! violation is a 400 naming the field; nothing here can panic on any input.

use engine::scheduler::SamplingParams;
use serde_json::{json, Map, Value};

use crate::error::ApiError;
use crate::openai::request::{
    ChatCompletionRequest, ChatMessage, MessageContent, OneOrMany, ResponseFormat, SamplingFields,
};

/// OpenAI allows at most this many stop sequences.
pub const MAX_STOP_SEQUENCES: usize = 4;
pub const MAX_TOP_LOGPROBS: usize = 20;

/// How the output must be shaped.
#[derive(Debug, Clone, PartialEq)]
pub enum OutputFormat {
    Text,
    /// Any JSON object.
    JsonObject,
    /// JSON matching this schema.
    JsonSchema(Value),
}

/// The validated, model-independent part of a completion request.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationSpec {
    pub sampling: SamplingParams,
    /// `None`: until the context is full.
    pub max_tokens: Option<usize>,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    pub format: OutputFormat,
    /// Alternatives per token to report; `None` reports no log-probabilities.
    pub logprobs: Option<usize>,
    pub ignore_eos: bool,
}

fn check_range(param: &str, v: Option<f64>, lo: f64, hi: f64) -> Result<Option<f32>, ApiError> {
    match v {
        None => Ok(None),
        Some(x) if x.is_finite() && (lo..=hi).contains(&x) => Ok(Some(x as f32)),
        Some(x) => Err(ApiError::invalid_param(
            param,
            format!("{param} must be between {lo} and {hi}, got {x}"),
        )),
    }
}

fn positive_count(param: &str, v: Option<i64>) -> Result<Option<usize>, ApiError> {
    match v {
        None => Ok(None),
        Some(x) if x >= 1 => Ok(Some(usize::try_from(x).unwrap_or(usize::MAX))),
        Some(x) => Err(ApiError::invalid_param(
            param,
            format!("{param} must be at least 1, got {x}"),
        )),
    }
}

/// Validates the sampling fields common to chat and text completions.
pub fn sampling_spec(
    f: &SamplingFields,
    defaults: &SamplingParams,
    n_vocab: usize,
) -> Result<GenerationSpec, ApiError> {
    let mut s = defaults.clone();
    if let Some(t) = check_range("temperature", f.temperature, 0.0, 2.0)? {
        s.temperature = t;
    }
    if let Some(p) = check_range("top_p", f.top_p, 0.0, 1.0)? {
        s.top_p = p;
    }
    if let Some(p) = check_range("min_p", f.min_p, 0.0, 1.0)? {
        s.min_p = p;
    }
    if let Some(p) = check_range("presence_penalty", f.presence_penalty, -2.0, 2.0)? {
        s.presence_penalty = p;
    }
    if let Some(p) = check_range("frequency_penalty", f.frequency_penalty, -2.0, 2.0)? {
        s.frequency_penalty = p;
    }
    match f.top_k {
        None => {}
        Some(k) if k >= 0 => s.top_k = usize::try_from(k).unwrap_or(usize::MAX).min(n_vocab),
        Some(k) => {
            return Err(ApiError::invalid_param(
                "top_k",
                format!("top_k must be >= 0, got {k}"),
            ))
        }
    }
    if let Some(bias) = &f.logit_bias {
        s.logit_bias.clear();
        for (key, &value) in bias {
            let id = key
                .trim()
                .parse::<u32>()
                .ok()
                .filter(|&id| (id as usize) < n_vocab)
                .ok_or_else(|| {
                    ApiError::invalid_param(
                        "logit_bias",
                        format!("logit_bias key {key:?} is not a token id below {n_vocab}"),
                    )
                })?;
            if !(value.is_finite() && (-100.0..=100.0).contains(&value)) {
                return Err(ApiError::invalid_param(
                    "logit_bias",
                    format!("logit_bias values must be between -100 and 100, got {value}"),
                ));
            }
            s.logit_bias.push((id, value as f32));
        }
    }
    if let Some(seed) = f.seed {
        s.seed = Some(seed as u64);
    }
    match f.n {
        None | Some(1) => {}
        Some(n) => {
            return Err(ApiError::invalid_param(
                "n",
                format!("only n=1 is supported, got {n}"),
            ))
        }
    }
    let stop = match &f.stop {
        None => Vec::new(),
        Some(OneOrMany::One(s)) => vec![s.clone()],
        Some(OneOrMany::Many(v)) => v.clone(),
    };
    if stop.len() > MAX_STOP_SEQUENCES {
        return Err(ApiError::invalid_param(
            "stop",
            format!(
                "at most {MAX_STOP_SEQUENCES} stop sequences, got {}",
                stop.len()
            ),
        ));
    }
    let format = match &f.response_format {
        None | Some(ResponseFormat::Text) => OutputFormat::Text,
        Some(ResponseFormat::JsonObject) => OutputFormat::JsonObject,
        Some(ResponseFormat::JsonSchema { json_schema }) => match &json_schema.schema {
            Some(schema @ (Value::Object(_) | Value::Bool(true))) => {
                OutputFormat::JsonSchema(schema.clone())
            }
            None => OutputFormat::JsonObject,
            Some(_) => {
                return Err(ApiError::invalid_param(
                    "response_format",
                    "response_format.json_schema.schema must be a JSON object",
                ))
            }
        },
    };
    Ok(GenerationSpec {
        sampling: s,
        max_tokens: positive_count("max_tokens", f.max_tokens)?,
        stop,
        stream: f.stream.unwrap_or(false),
        include_usage: f.stream_options.as_ref().is_some_and(|o| o.include_usage),
        format,
        logprobs: None,
        ignore_eos: f.ignore_eos.unwrap_or(false),
    })
}

/// The number of tokens to generate for a prompt of `prompt_len` in a context of `n_ctx`,
/// or a 400 saying what does not fit.
pub fn resolve_max_tokens(
    requested: Option<usize>,
    prompt_len: usize,
    n_ctx: usize,
) -> Result<usize, ApiError> {
    if prompt_len == 0 {
        return Err(ApiError::invalid_param("prompt", "the prompt is empty"));
    }
    if prompt_len >= n_ctx {
        return Err(ApiError::ContextLengthExceeded(format!(
            "the prompt has {prompt_len} tokens but the context is {n_ctx} tokens; shorten the prompt (or start the server with a larger -c)"
        )));
    }
    let room = n_ctx - prompt_len;
    match requested {
        None => Ok(room),
        Some(m) if m <= room => Ok(m),
        Some(m) => Err(ApiError::ContextLengthExceeded(format!(
            "the prompt has {prompt_len} tokens and max_tokens is {m}, but the context is {n_ctx} tokens; at most {room} tokens can be generated"
        ))),
    }
}

/// What the model may do with tools.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolChoice {
    None,
    Auto,
    Required,
    Function(String),
}

/// A validated chat request: spec, messages and tools in the shape chat templates expect.
#[derive(Debug, Clone)]
pub struct ChatInput {
    pub spec: GenerationSpec,
    pub messages: Vec<Value>,
    /// `[{"type": "function", "function": {name, description, parameters}}]`
    pub tools: Option<Vec<Value>>,
    pub tool_choice: ToolChoice,
}

fn message_text(m: &ChatMessage, i: usize) -> Result<Option<String>, ApiError> {
    match &m.content {
        None => Ok(None),
        Some(MessageContent::Text(s)) => Ok(Some(s.clone())),
        Some(MessageContent::Parts(parts)) => {
            let mut text = String::new();
            for p in parts {
                match (p.kind.as_str(), &p.text) {
                    ("text", Some(t)) => text.push_str(t),
                    (kind, _) => {
                        return Err(ApiError::invalid_param(
                            &format!("messages[{i}].content"),
                            format!("content part type {kind:?} is not supported (text only)"),
                        ))
                    }
                }
            }
            Ok(Some(text))
        }
    }
}

/// Normalizes one message for the template: content as plain text, tool-call arguments as
/// JSON values (templates print them with `tojson`), `developer` as `system`.
fn template_message(m: &ChatMessage, i: usize) -> Result<Value, ApiError> {
    let param = format!("messages[{i}]");
    let role = match m.role.as_str() {
        "developer" => "system",
        r @ ("system" | "user" | "assistant" | "tool") => r,
        other => {
            return Err(ApiError::invalid_param(
                &format!("{param}.role"),
                format!("unknown role {other:?} (system, developer, user, assistant, tool)"),
            ))
        }
    };
    let content = message_text(m, i)?;
    let mut out = Map::new();
    out.insert("role".into(), json!(role));
    if content.is_none() && !(role == "assistant" && m.tool_calls.is_some()) {
        return Err(ApiError::invalid_param(
            &format!("{param}.content"),
            format!("{param} ({role}) has no content"),
        ));
    }
    out.insert("content".into(), json!(content.unwrap_or_default()));
    if let Some(name) = &m.name {
        out.insert("name".into(), json!(name));
    }
    if let Some(calls) = &m.tool_calls {
        let calls: Vec<Value> = calls
            .iter()
            .map(|c| {
                let args = serde_json::from_str::<Value>(&c.function.arguments).unwrap_or_else(|_| json!(c.function.arguments));
                json!({"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": args}})
            })
            .collect();
        out.insert("tool_calls".into(), Value::Array(calls));
    }
    if let Some(id) = &m.tool_call_id {
        out.insert("tool_call_id".into(), json!(id));
    }
    Ok(Value::Object(out))
}

pub fn chat_input(
    req: &ChatCompletionRequest,
    defaults: &SamplingParams,
    n_vocab: usize,
) -> Result<ChatInput, ApiError> {
    let mut spec = sampling_spec(&req.sampling, defaults, n_vocab)?;
    if let Some(m) = positive_count("max_completion_tokens", req.max_completion_tokens)? {
        spec.max_tokens = Some(m);
    }
    if req.messages.is_empty() {
        return Err(ApiError::invalid_param(
            "messages",
            "messages must not be empty",
        ));
    }
    let messages = req
        .messages
        .iter()
        .enumerate()
        .map(|(i, m)| template_message(m, i))
        .collect::<Result<Vec<_>, _>>()?;

    match (req.logprobs.unwrap_or(false), req.top_logprobs) {
        (false, Some(n)) if n > 0 => {
            return Err(ApiError::invalid_param(
                "top_logprobs",
                "top_logprobs requires logprobs to be true",
            ))
        }
        (false, _) => {}
        (true, n) => {
            let n = n.unwrap_or(0);
            if !(0..=MAX_TOP_LOGPROBS as i64).contains(&n) {
                return Err(ApiError::invalid_param(
                    "top_logprobs",
                    format!("top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {n}"),
                ));
            }
            spec.logprobs = Some(n as usize);
        }
    }

    let tools: Option<Vec<Value>> = match &req.tools {
        None => None,
        Some(t) if t.is_empty() => None,
        Some(tools) => Some(
            tools
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    if t.kind != "function" {
                        return Err(ApiError::invalid_param(
                            &format!("tools[{i}].type"),
                            "only function tools are supported",
                        ));
                    }
                    if t.function.name.is_empty() {
                        return Err(ApiError::invalid_param(
                            &format!("tools[{i}].function.name"),
                            "a tool needs a name",
                        ));
                    }
                    let mut f = Map::new();
                    f.insert("name".into(), json!(t.function.name));
                    if let Some(d) = &t.function.description {
                        f.insert("description".into(), json!(d));
                    }
                    f.insert(
                        "parameters".into(),
                        t.function
                            .parameters
                            .clone()
                            .unwrap_or_else(|| json!({"type": "object", "properties": {}})),
                    );
                    Ok(json!({"type": "function", "function": f}))
                })
                .collect::<Result<_, _>>()?,
        ),
    };
    let tool_names: Vec<&str> = req
        .tools
        .iter()
        .flatten()
        .map(|t| t.function.name.as_str())
        .collect();
    let tool_choice = match &req.tool_choice {
        None => ToolChoice::Auto,
        Some(Value::String(s)) if s == "none" => ToolChoice::None,
        Some(Value::String(s)) if s == "auto" => ToolChoice::Auto,
        Some(Value::String(s)) if s == "required" => ToolChoice::Required,
        Some(v) => match v.pointer("/function/name").and_then(Value::as_str) {
            Some(name) if tool_names.contains(&name) => ToolChoice::Function(name.to_string()),
            _ => {
                return Err(ApiError::invalid_param(
                    "tool_choice",
                    "tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": <a tool's name>}}",
                ))
            }
        },
    };
    if tools.is_none() && matches!(tool_choice, ToolChoice::Required | ToolChoice::Function(_)) {
        return Err(ApiError::invalid_param(
            "tool_choice",
            "tool_choice needs tools",
        ));
    }
    Ok(ChatInput {
        spec,
        messages,
        tools,
        tool_choice,
    })
}

#[cfg(test)]
mod tests;
