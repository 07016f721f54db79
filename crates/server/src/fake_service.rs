//! A byte-level stand-in for the model service, driving the real scheduler, for HTTP tests.
//! Token ids 0..=255 are bytes, 256 is end-of-generation; greedy output follows `SCRIPT`.

use std::sync::Arc;
use std::time::Duration;

use engine::scheduler::{
    BatchModel, GenerationRequest, GenerationStream, Scheduler, SchedulerConfig, SchedulerStats,
    TokenConstraint,
};
use serde_json::Value;

use crate::error::ApiError;
use crate::service::{InferenceService, ModelInfo};
use engine::tool_calls::ToolFamily;

pub const EOS: u32 = 256;
pub const SCRIPT: &[u8] = b"Once upon a time, a little robot sang. The end! ";

pub struct ByteModel {
    pub delay: Duration,
    /// Greedy output: byte `len % script.len()` follows a sequence of length `len`.
    pub script: &'static [u8],
    /// A sequence that reaches this length favours EOS.
    pub eos_at: usize,
}

impl BatchModel for ByteModel {
    type State = Vec<u32>;
    fn n_vocab(&self) -> usize {
        257
    }
    fn new_state(&self, _n_ctx: usize) -> Result<Vec<u32>, String> {
        Ok(Vec::new())
    }
    fn state_len(&self, s: &Vec<u32>) -> usize {
        s.len()
    }
    fn truncate(&self, s: &mut Vec<u32>, pos: usize) -> Result<usize, String> {
        s.truncate(pos);
        Ok(s.len())
    }
    fn prefill(&self, s: &mut Vec<u32>, tokens: &[u32]) -> Result<Vec<f32>, String> {
        std::thread::sleep(self.delay);
        s.extend_from_slice(tokens);
        Ok(self.logits(s.len()))
    }
    fn decode_batch(
        &self,
        states: &mut [&mut Vec<u32>],
        tokens: &[u32],
    ) -> Result<Vec<f32>, String> {
        std::thread::sleep(self.delay);
        let mut out = Vec::new();
        for (s, &t) in states.iter_mut().zip(tokens) {
            s.push(t);
            out.extend(self.logits(s.len()));
        }
        Ok(out)
    }
}

impl ByteModel {
    fn logits(&self, len: usize) -> Vec<f32> {
        let mut l = vec![0.0f32; 257];
        let next = if len >= self.eos_at {
            EOS
        } else {
            self.script[len % self.script.len()] as u32
        };
        l[next as usize] = 10.0;
        l
    }
}

/// Forces one exact byte string.
struct ForceText {
    text: Vec<u8>,
    pos: usize,
}

impl TokenConstraint for ForceText {
    fn mask(&mut self, logits: &mut [f32]) {
        let want = self.text.get(self.pos).map(|&b| b as usize);
        for (i, l) in logits.iter_mut().enumerate() {
            if Some(i) != want {
                *l = f32::NEG_INFINITY;
            }
        }
    }
    fn commit(&mut self, token: u32) -> bool {
        let ok = self.text.get(self.pos) == Some(&(token as u8)) && token < 256;
        self.pos += 1;
        ok
    }
    fn is_finished(&self) -> bool {
        self.pos >= self.text.len()
    }
}

pub struct FakeService {
    info: ModelInfo,
    scheduler: Scheduler,
    /// Appended to every chat prompt (e.g. `<think>\n`, as templates that open the block).
    prompt_suffix: &'static str,
}

impl FakeService {
    pub fn new(
        n_slots: usize,
        n_ctx: usize,
        max_queue: usize,
        delay: Duration,
    ) -> Arc<FakeService> {
        Self::with_script(n_slots, n_ctx, max_queue, delay, SCRIPT, 200)
    }

    pub fn with_script(
        n_slots: usize,
        n_ctx: usize,
        max_queue: usize,
        delay: Duration,
        script: &'static [u8],
        eos_at: usize,
    ) -> Arc<FakeService> {
        Self::build(n_slots, n_ctx, max_queue, delay, script, eos_at, None)
    }

    /// A service whose template knows `<think>` blocks (`ModelInfo::reasoning`); with
    /// `prompt_suffix` the chat prompt ends with it (templates that open the block themselves).
    pub fn with_reasoning_script(
        script: &'static [u8],
        eos_at: usize,
        prompt_suffix: &'static str,
    ) -> Arc<FakeService> {
        Self::build(
            1,
            512,
            4,
            Duration::ZERO,
            script,
            eos_at,
            Some(prompt_suffix),
        )
    }

    fn build(
        n_slots: usize,
        n_ctx: usize,
        max_queue: usize,
        delay: Duration,
        script: &'static [u8],
        eos_at: usize,
        reasoning: Option<&'static str>,
    ) -> Arc<FakeService> {
        let model = Arc::new(ByteModel {
            delay,
            script,
            eos_at,
        });
        let config = SchedulerConfig {
            n_slots,
            n_ctx_per_slot: n_ctx,
            max_queue,
            prefill_chunk: 64,
            eog_tokens: vec![EOS],
        };
        let scheduler = Scheduler::start(model, config).expect("scheduler starts");
        let info = ModelInfo {
            id: "fake-bytes".into(),
            created: 1,
            n_ctx,
            n_vocab: 257,
            n_slots,
            tool_family: ToolFamily::Qwen,
            reasoning: reasoning.is_some(),
        };
        Arc::new(FakeService {
            info,
            scheduler,
            prompt_suffix: reasoning.unwrap_or(""),
        })
    }
}

impl InferenceService for FakeService {
    fn info(&self) -> &ModelInfo {
        &self.info
    }
    fn chat_prompt(
        &self,
        messages: &[Value],
        _tools: Option<&[Value]>,
    ) -> Result<Vec<u32>, ApiError> {
        let mut text = String::new();
        for m in messages {
            text.push_str(&format!(
                "{}: {}\n",
                m["role"].as_str().unwrap_or(""),
                m["content"].as_str().unwrap_or("")
            ));
        }
        text.push_str("assistant: ");
        text.push_str(self.prompt_suffix);
        self.tokenize(&text, false)
    }
    fn tokenize(&self, text: &str, _add_special: bool) -> Result<Vec<u32>, ApiError> {
        Ok(text.bytes().map(u32::from).collect())
    }
    fn token_piece(&self, id: u32) -> Vec<u8> {
        if id < 256 {
            vec![id as u8]
        } else {
            Vec::new()
        }
    }
    fn detokenize(&self, ids: &[u32]) -> String {
        String::from_utf8_lossy(
            &ids.iter()
                .flat_map(|&i| self.token_piece(i))
                .collect::<Vec<u8>>(),
        )
        .into_owned()
    }
    fn json_constraint(
        &self,
        schema: Option<&Value>,
    ) -> Result<Box<dyn TokenConstraint>, ApiError> {
        let forced = match schema {
            Some(s) if s.to_string().contains("get_weather") => {
                r#"{"name": "get_weather", "arguments": {"city": "Paris"}}"#
            }
            _ => r#"{"a": 1}"#,
        };
        Ok(Box::new(ForceText {
            text: forced.as_bytes().to_vec(),
            pos: 0,
        }))
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
