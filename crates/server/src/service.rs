//! The boundary between HTTP and inference (TGI-router style): routes see only this trait.
//! `model_service.rs` implements it over the real model, tokenizer and scheduler; tests use
//! a small fake.

use engine::scheduler::{GenerationRequest, GenerationStream, SchedulerStats, TokenConstraint};
use serde_json::Value;

use crate::error::ApiError;
use engine::tool_calls::ToolFamily;

/// What `/v1/models` and validation need to know about the loaded model.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    /// The name clients see (`--alias`, else the file stem).
    pub id: String,
    /// Unix seconds when loading finished.
    pub created: u64,
    /// Context of one slot, in tokens.
    pub n_ctx: usize,
    pub n_vocab: usize,
    pub n_slots: usize,
    /// Tool-call syntax of the chat template.
    pub tool_family: ToolFamily,
    /// The chat template knows `<think>` blocks (Qwen3, QwQ, Qwen3.5, DeepSeek-R1): a leading
    /// block of a chat reply is returned as `reasoning_content`, with or without tools.
    pub reasoning: bool,
}

pub trait InferenceService: Send + Sync + 'static {
    fn info(&self) -> &ModelInfo;
    /// Renders messages (OpenAI shape, content already plain text) with the chat template
    /// and tokenizes the result.
    fn chat_prompt(
        &self,
        messages: &[Value],
        tools: Option<&[Value]>,
    ) -> Result<Vec<u32>, ApiError>;
    /// Tokenizes raw text; special-token text is parsed as special tokens.
    fn tokenize(&self, text: &str, add_special: bool) -> Result<Vec<u32>, ApiError>;
    /// The raw bytes of one token (may be part of a UTF-8 character).
    fn token_piece(&self, id: u32) -> Vec<u8>;
    fn detokenize(&self, ids: &[u32]) -> String;
    /// A constraint that forces JSON output matching `schema` (any JSON object if `None`).
    fn json_constraint(&self, schema: Option<&Value>)
        -> Result<Box<dyn TokenConstraint>, ApiError>;
    fn submit(&self, request: GenerationRequest) -> Result<GenerationStream, ApiError>;
    fn stats(&self) -> SchedulerStats;
    /// Stops accepting requests; running ones finish.
    fn shutdown(&self);
    /// After [`InferenceService::shutdown`]: waits up to `timeout` for the generation thread
    /// to exit; true once it has (a service without one has nothing to wait for).
    fn wait_stopped(&self, _timeout: std::time::Duration) -> bool {
        true
    }
}
