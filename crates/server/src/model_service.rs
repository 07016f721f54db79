//! [`InferenceService`] over a loaded model: tokenizer, chat template, and the slot
//! scheduler driving `ModelOn::forward_multi` (each step: running slots' decode tokens plus
//! prompt chunks, in one pass over the weights) on any backend.

use std::sync::Arc;

use backend::Backend;
use engine::scheduler::{
    BatchModel, GenerationRequest, GenerationStream, Scheduler, SchedulerConfig, SchedulerStats,
    TokenConstraint,
};
use engine::speculative::{SlotDrafter, SpecBatch, SpecOptions};
use engine::tool_calls::ToolFamily;
use engine::{ChatTemplate, ConstraintError, ConstraintVocab, Tokenizer};
use model::{KvType, ModelOn, SeqStateOn};
use serde_json::Value;

use crate::error::ApiError;
use crate::service::{InferenceService, ModelInfo};

/// Used when the model has no chat template and none was given (llama.cpp's default too).
pub const CHATML_TEMPLATE: &str = "{%- for message in messages -%}\
{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}\
{%- endfor -%}\
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}";

/// The scheduler's view of a model on any backend (CPU, CUDA …).
struct ModelBatch<B: Backend> {
    model: Arc<ModelOn<B>>,
    kv_type: KvType,
    /// Run each scheduler step as one `forward_multi` pass (default). `REDLINE_MIXED_STEPS=0`
    /// runs prompt chunks and the decode batch as separate calls instead (the pre-mixed
    /// behaviour), an escape hatch for a backend whose mixed batches misbehave.
    mixed: bool,
    /// Token ids the scheduler samples among and normalises logprobs over: the tokenizer's
    /// vocabulary (an output head may have padding rows past it), as `engine::generate` does.
    n_use: usize,
}

impl<B: Backend> ModelBatch<B> {
    /// Keeps the first `n_use` logits of each row (`logits`: [rows, model n_vocab]).
    fn cut(&self, logits: Vec<f32>) -> Result<Vec<f32>, String> {
        engine::scheduler::cut_rows(logits, self.model.config().n_vocab, self.n_use)
    }
}

impl<B: Backend + 'static> BatchModel for ModelBatch<B> {
    type State = SeqStateOn<B>;

    fn n_vocab(&self) -> usize {
        self.n_use
    }

    fn new_state(&self, n_ctx: usize) -> Result<SeqStateOn<B>, String> {
        self.model
            .new_state(n_ctx, self.kv_type)
            .map_err(|e| e.to_string())
    }

    fn state_len(&self, state: &SeqStateOn<B>) -> usize {
        state.len()
    }

    fn truncate(&self, state: &mut SeqStateOn<B>, pos: usize) -> Result<usize, String> {
        // Attention-only models truncate anywhere; hybrid ones only to a snapshot.
        let target = if state.can_truncate(pos) {
            pos
        } else {
            state
                .snapshot_positions()
                .into_iter()
                .filter(|&p| p <= pos && state.can_truncate(p))
                .max()
                .unwrap_or(0)
        };
        state.truncate(target).map_err(|e| e.to_string())?;
        Ok(target)
    }

    fn checkpoint(&self, state: &mut SeqStateOn<B>) {
        state.snapshot();
    }

    fn prefill(&self, state: &mut SeqStateOn<B>, tokens: &[u32]) -> Result<Vec<f32>, String> {
        self.model
            .forward(state, tokens, false)
            .map_err(|e| e.to_string())
            .and_then(|l| self.cut(l))
    }

    fn decode_batch(
        &self,
        states: &mut [&mut SeqStateOn<B>],
        tokens: &[u32],
    ) -> Result<Vec<f32>, String> {
        self.model
            .forward_batch(states, tokens)
            .map_err(|e| e.to_string())
            .and_then(|l| self.cut(l))
    }

    fn forward_multi(
        &self,
        states: &mut [&mut SeqStateOn<B>],
        tokens: &[&[u32]],
    ) -> Result<Vec<f32>, String> {
        if !self.mixed {
            return engine::scheduler::forward_multi_by_parts(self, states, tokens);
        }
        // cut to the tokenizer's vocabulary on the way to the host (no pass over the rows)
        self.model
            .forward_multi_cols(states, tokens, self.n_use)
            .map_err(|e| e.to_string())
    }

    fn forward_multi_greedy(
        &self,
        states: &mut [&mut SeqStateOn<B>],
        tokens: &[&[u32]],
    ) -> Result<Vec<Option<u32>>, String> {
        if !self.mixed {
            return engine::scheduler::greedy_picks_of_logits(self, states, tokens);
        }
        // the picks among the tokenizer's vocabulary, made where the logits are
        self.model
            .forward_multi_argmax(states, tokens, self.n_use)
            .map_err(|e| e.to_string())
    }

    fn forward_multi_top(
        &self,
        states: &mut [&mut SeqStateOn<B>],
        tokens: &[&[u32]],
        k: usize,
    ) -> Result<Vec<Vec<(u32, f32)>>, String> {
        if !self.mixed {
            return engine::scheduler::top_k_of_logits(self, states, tokens, k);
        }
        // the candidates among the tokenizer's vocabulary, selected where the logits are
        self.model
            .forward_multi_top_k(states, tokens, self.n_use, k)
            .map_err(|e| e.to_string())
    }
}

/// How to set the service up.
#[derive(Debug, Clone)]
pub struct ModelServiceOptions {
    /// Model name shown to clients.
    pub id: String,
    pub n_slots: usize,
    pub n_ctx_per_slot: usize,
    pub kv_type: KvType,
    pub max_queue: usize,
    pub prefill_chunk: usize,
    /// Chat template source overriding the model's.
    pub chat_template: Option<String>,
}

/// The drafter the slots speculate with (`redline serve --md DRAFT.gguf` or `--mtp`).
pub struct DraftOptions<B: Backend> {
    /// A draft model, or the model's own MTP layer (loaded with `ModelOn::load_mtp`).
    pub drafter: SlotDrafter<B>,
    /// KV cache type of the drafter's per-slot caches.
    pub kv_type: KvType,
    pub spec: SpecOptions,
}

pub struct ModelService {
    info: ModelInfo,
    tokenizer: Arc<Tokenizer>,
    template: ChatTemplate,
    scheduler: Scheduler,
    /// Token trie + grammar factory for `response_format` / forced tool calls (built once).
    constraints: ConstraintVocab,
}

impl ModelService {
    /// Starts the scheduler over `model` on any backend (`model::Model` is the CPU one).
    pub fn new<B: Backend + 'static>(
        model: Arc<ModelOn<B>>,
        opts: ModelServiceOptions,
    ) -> Result<ModelService, ApiError> {
        Self::with_drafter(model, None, opts)
    }

    /// [`ModelService::new`], with every slot speculating with `draft` when given: each
    /// scheduler step drafts for all decoding slots in batched draft steps and verifies them
    /// inside the step's one mixed forward (`engine::speculative::SpecBatch`).
    pub fn with_drafter<B: Backend + 'static>(
        model: Arc<ModelOn<B>>,
        draft: Option<DraftOptions<B>>,
        opts: ModelServiceOptions,
    ) -> Result<ModelService, ApiError> {
        let meta = model.gguf().metadata();
        let tokenizer = Tokenizer::from_gguf(meta)
            .map_err(|e| ApiError::Internal(format!("tokenizer: {e}")))?;
        let from_file = ChatTemplate::from_gguf(meta)
            .map_err(|e| ApiError::Internal(format!("chat template: {e}")))?;
        let template = match (&opts.chat_template, from_file) {
            (Some(source), file) => {
                let (bos, eos) = file.as_ref().map_or((None, None), |t| {
                    (
                        t.bos_token().map(str::to_string),
                        t.eos_token().map(str::to_string),
                    )
                });
                ChatTemplate::new(source)
                    .map_err(|e| ApiError::Internal(format!("--chat-template-file: {e}")))?
                    .with_special_tokens(bos.as_deref(), eos.as_deref())
            }
            (None, Some(t)) => t,
            (None, None) => {
                tracing::warn!("the model has no chat template; chat requests use ChatML");
                ChatTemplate::new(CHATML_TEMPLATE)
                    .map_err(|e| ApiError::Internal(format!("ChatML template: {e}")))?
            }
        };
        let tool_family = ToolFamily::detect(template.source());
        // The tokenizer's vocabulary; a padded output head's extra rows are never sampled.
        let n_vocab = tokenizer.n_vocab().clamp(1, model.config().n_vocab);
        let config = SchedulerConfig {
            n_slots: opts.n_slots,
            n_ctx_per_slot: opts.n_ctx_per_slot,
            max_queue: opts.max_queue,
            prefill_chunk: opts.prefill_chunk,
            eog_tokens: tokenizer.eog_ids().collect(),
        };
        let scheduler = match draft {
            None => Scheduler::start(
                Arc::new(ModelBatch {
                    model,
                    kv_type: opts.kv_type,
                    mixed: std::env::var("REDLINE_MIXED_STEPS").map_or(true, |v| v != "0"),
                    n_use: n_vocab,
                }),
                config,
            )?,
            Some(d) => {
                let batch =
                    SpecBatch::new(model, d.drafter, opts.kv_type, d.kv_type, n_vocab, d.spec)
                        .map_err(|e| ApiError::Internal(format!("speculative decoding: {e}")))?;
                Scheduler::start(Arc::new(batch), config)?
            }
        };
        let created = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let info = ModelInfo {
            id: opts.id,
            created,
            n_ctx: opts.n_ctx_per_slot,
            n_vocab,
            n_slots: opts.n_slots,
            tool_family,
            reasoning: template.source().contains("</think>"),
        };
        let constraints = ConstraintVocab::new(&tokenizer)
            .map_err(|e| ApiError::Internal(format!("constrained decoding: {e}")))?;
        let tokenizer = Arc::new(tokenizer);
        Ok(ModelService {
            info,
            tokenizer,
            template,
            scheduler,
            constraints,
        })
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }
}

impl InferenceService for ModelService {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn chat_prompt(
        &self,
        messages: &[Value],
        tools: Option<&[Value]>,
    ) -> Result<Vec<u32>, ApiError> {
        let text = self
            .template
            .render(messages, tools, true, &serde_json::Map::new())
            .map_err(|e| {
                ApiError::invalid_param(
                    "messages",
                    format!("the chat template failed on these messages: {e}"),
                )
            })?;
        // A template that writes BOS itself must not get a second one.
        let has_bos = self
            .template
            .bos_token()
            .is_some_and(|b| !b.is_empty() && text.starts_with(b));
        self.tokenizer
            .encode(&text, !has_bos, true)
            .map_err(|e| ApiError::invalid_param("messages", format!("cannot tokenize: {e}")))
    }

    fn tokenize(&self, text: &str, add_special: bool) -> Result<Vec<u32>, ApiError> {
        self.tokenizer
            .encode(text, add_special, true)
            .map_err(|e| ApiError::invalid(format!("cannot tokenize: {e}")))
    }

    fn token_piece(&self, id: u32) -> Vec<u8> {
        // Control tokens print nothing, as in llama.cpp's default output.
        self.tokenizer.piece(id, false)
    }

    fn detokenize(&self, ids: &[u32]) -> String {
        self.tokenizer.decode(ids, false)
    }

    fn json_constraint(
        &self,
        schema: Option<&Value>,
    ) -> Result<Box<dyn TokenConstraint>, ApiError> {
        let constraint = match schema {
            None => self.constraints.json_object(),
            Some(schema) => self.constraints.json_schema(schema),
        };
        match constraint {
            Ok(c) => Ok(Box::new(c)),
            Err(e @ ConstraintError::UnsupportedSchema(_)) => Err(ApiError::invalid_param(
                "response_format",
                format!("unusable JSON schema: {e}"),
            )),
            Err(e) => Err(ApiError::Internal(format!("constrained decoding: {e}"))),
        }
    }

    fn submit(&self, request: GenerationRequest) -> Result<GenerationStream, ApiError> {
        Ok(self.scheduler.submit(request)?)
    }

    fn stats(&self) -> SchedulerStats {
        self.scheduler.stats()
    }

    fn shutdown(&self) {
        self.scheduler.shutdown()
    }
    fn wait_stopped(&self, timeout: std::time::Duration) -> bool {
        self.scheduler.wait_stopped(timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use model::{LoadOptions, Model};

    /// A padded output head: the scheduler sees only the first `n_use` logits of every row,
    /// in each of the three calls, equal to the model's own.
    #[test]
    fn logits_are_cut_to_the_tokenizers_vocabulary() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/stories260K.gguf");
        let model = Arc::new(Model::load(path.as_ref(), &LoadOptions::default()).unwrap());
        let n = model.config().n_vocab;
        let batch = ModelBatch {
            model: model.clone(),
            kv_type: KvType::F32,
            mixed: true,
            n_use: n - 12,
        };
        let mut reference = model.new_state(64, KvType::F32).unwrap();
        let full = model.forward(&mut reference, &[1, 400, 30], true).unwrap();
        let row = |i: usize| full[i * n..i * n + n - 12].to_vec();
        // `got` is `rows` rows of n - 12, each the reference's last row within 1e-4
        let rows_match = |got: &[f32], rows: usize| {
            assert_eq!(got.len(), rows * (n - 12));
            for r in got.chunks_exact(n - 12) {
                let d = r
                    .iter()
                    .zip(row(2))
                    .map(|(a, b)| (a - b).abs())
                    .fold(0f32, f32::max);
                assert!(d < 1e-4, "{d}");
            }
        };

        let mut s = batch.new_state(64).unwrap();
        assert_eq!(batch.prefill(&mut s, &[1, 400]).unwrap(), row(1));
        assert_eq!(batch.decode_batch(&mut [&mut s], &[30]).unwrap(), row(2));
        let mut t = batch.new_state(64).unwrap();
        let got = batch
            .forward_multi(&mut [&mut t], &[&[1, 400, 30]])
            .unwrap();
        rows_match(&got, 1);
        // forward_multi over two sequences: each row cut on its way to the host, in order
        let (mut c, mut e) = (batch.new_state(64).unwrap(), batch.new_state(64).unwrap());
        let two = batch
            .forward_multi(&mut [&mut c, &mut e], &[&[1, 400, 30], &[1, 400, 30]])
            .unwrap();
        rows_match(&two, 2);
        // several rows (a batched decode step): each row cut in place, in order
        let (mut a, mut b) = (batch.new_state(64).unwrap(), batch.new_state(64).unwrap());
        batch.prefill(&mut a, &[1, 400]).unwrap();
        batch.prefill(&mut b, &[1, 400]).unwrap();
        let both = batch
            .decode_batch(&mut [&mut a, &mut b], &[30, 30])
            .unwrap();
        rows_match(&both, 2);
    }
}
