//! OpenAI response bodies: whole completions, stream chunks, usage, log-probabilities.

use serde::Serialize;

#[derive(Debug, Clone, Copy, Serialize, PartialEq, Default)]
pub struct PromptTokensDetails {
    pub cached_tokens: usize,
}

#[derive(Debug, Clone, Copy, Serialize, PartialEq, Default)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    pub prompt_tokens_details: PromptTokensDetails,
}

/// llama.cpp-style speed report; OpenAI clients ignore it, the chat page shows it.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Default)]
pub struct Timings {
    pub prompt_n: usize,
    pub prompt_ms: f64,
    pub predicted_n: usize,
    pub predicted_ms: f64,
    pub predicted_per_second: f64,
    /// Speculative decoding (llama.cpp's names): draft tokens proposed and kept; absent when
    /// the server does not speculate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub draft_n: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub draft_n_accepted: Option<usize>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct FunctionCallOut {
    pub name: String,
    /// JSON text.
    pub arguments: String,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ToolCallOut {
    /// Position in the message's list; only in stream deltas.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index: Option<usize>,
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: FunctionCallOut,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TopLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TokenLogprobOut {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    pub top_logprobs: Vec<TopLogprob>,
}

#[derive(Debug, Clone, Serialize, PartialEq, Default)]
pub struct ChoiceLogprobs {
    pub content: Vec<TokenLogprobOut>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct AssistantMessage {
    pub role: &'static str,
    pub content: Option<String>,
    /// The `<think>` block of a reasoning model (llama.cpp / vLLM field name).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallOut>>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ChatChoice {
    pub index: usize,
    pub message: AssistantMessage,
    pub logprobs: Option<ChoiceLogprobs>,
    pub finish_reason: &'static str,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ChatCompletion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub system_fingerprint: &'static str,
    pub choices: Vec<ChatChoice>,
    pub usage: Usage,
    pub timings: Timings,
}

#[derive(Debug, Clone, Serialize, PartialEq, Default)]
pub struct ChatDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallOut>>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ChatChunkChoice {
    pub index: usize,
    pub delta: ChatDelta,
    pub logprobs: Option<ChoiceLogprobs>,
    pub finish_reason: Option<&'static str>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ChatCompletionChunk {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub system_fingerprint: &'static str,
    pub choices: Vec<ChatChunkChoice>,
    /// Present (null) on every chunk when the client asked for usage; the last chunk carries it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<Usage>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timings: Option<Timings>,
}

/// Legacy completions log-probabilities.
#[derive(Debug, Clone, Serialize, PartialEq, Default)]
pub struct CompletionLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<f32>,
    pub top_logprobs: Vec<std::collections::BTreeMap<String, f32>>,
    pub text_offset: Vec<usize>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CompletionChoice {
    pub index: usize,
    pub text: String,
    pub logprobs: Option<CompletionLogprobs>,
    pub finish_reason: Option<&'static str>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Completion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub system_fingerprint: &'static str,
    pub choices: Vec<CompletionChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timings: Option<Timings>,
}

pub const SYSTEM_FINGERPRINT: &str = concat!("redline-", env!("CARGO_PKG_VERSION"));

impl Usage {
    pub fn from_engine(u: &engine::scheduler::Usage) -> Usage {
        Usage {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
            total_tokens: u.prompt_tokens + u.completion_tokens,
            prompt_tokens_details: PromptTokensDetails {
                cached_tokens: u.cached_tokens,
            },
        }
    }
}

impl Timings {
    pub fn from_engine(u: &engine::scheduler::Usage) -> Timings {
        let computed = u.prompt_tokens - u.cached_tokens.min(u.prompt_tokens);
        // The first token comes out of the prefill; the rest are decode steps.
        let decoded = u.completion_tokens.saturating_sub(1);
        Timings {
            prompt_n: computed,
            prompt_ms: u.prefill_seconds * 1e3,
            predicted_n: u.completion_tokens,
            predicted_ms: u.decode_seconds * 1e3,
            predicted_per_second: if u.decode_seconds > 0.0 {
                decoded as f64 / u.decode_seconds
            } else {
                0.0
            },
            draft_n: u.speculative.map(|s| s.drafted),
            draft_n_accepted: u.speculative.map(|s| s.accepted),
        }
    }
}
