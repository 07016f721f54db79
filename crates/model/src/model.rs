//! Loading a GGUF model onto a backend and running forward passes.

use std::path::Path;
use std::sync::Arc;

use backend::cpu::CpuBackend;
use backend::{Backend, KvType, Row};
use gguf::GgufFile;

use crate::arch::qwen35_mtp::{self, MtpBlock, MtpOutput, MtpState};
use crate::arch::{self, qwen35};
use crate::blocks::{linear, Batch, DenseLayer};
use crate::config::{Arch, ModelConfig};
use crate::loader::Loader;
use crate::state::{LayerState, SeqStateOn};
use crate::ModelError;

/// How to load and run a model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadOptions {
    /// CPU worker threads (0 = one per core).
    pub n_threads: usize,
    /// Most tokens per forward micro-batch during prefill.
    pub ubatch_size: usize,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            n_threads: 0,
            ubatch_size: 512,
        }
    }
}

enum Layers<B: Backend> {
    Dense(Vec<DenseLayer<B>>),
    Qwen35(Vec<qwen35::Layer<B>>),
}

/// A model loaded on backend `B`; weights stay in the GGUF mapping (CPU) and are read in place.
pub struct ModelOn<B: Backend> {
    backend: B,
    file: Arc<GgufFile>,
    config: ModelConfig,
    ubatch_size: usize,
    tok_embd: B::Weight,
    output_norm: B::Weight,
    /// `None`: tied to `tok_embd`.
    output: Option<B::Weight>,
    layers: Layers<B>,
    /// The multi-token-prediction block, once [`ModelOn::load_mtp`] loaded it.
    mtp: std::sync::OnceLock<MtpBlock<B>>,
}

/// The CPU model.
pub type Model = ModelOn<CpuBackend>;
/// The per-sequence state of the CPU model.
pub type SeqState = SeqStateOn<CpuBackend>;

impl ModelOn<CpuBackend> {
    /// Opens (memory-maps) a GGUF file and loads it for CPU inference.
    pub fn load(path: &Path, opts: &LoadOptions) -> Result<Model, ModelError> {
        let file = GgufFile::open(path)?;
        Self::load_from_gguf(file, opts)
    }

    /// Loads an already opened GGUF file for CPU inference.
    pub fn load_from_gguf(file: GgufFile, opts: &LoadOptions) -> Result<Model, ModelError> {
        let backend = CpuBackend::new(opts.n_threads)?;
        ModelOn::load_on(backend, Arc::new(file), opts)
    }
}

impl<B: Backend> ModelOn<B> {
    /// Loads `file` onto `backend`.
    pub fn load_on(
        backend: B,
        file: Arc<GgufFile>,
        opts: &LoadOptions,
    ) -> Result<Self, ModelError> {
        let mut config = ModelConfig::from_gguf(&file)?;
        if let Some(info) = file.tensor("rope_freqs.weight") {
            // Llama 3.1 frequency factors: n_rot / 2 f32 values.
            let n = (config.rope.n_rot / 2) as u64;
            if info.n_elements() != n {
                return Err(ModelError::TensorShape {
                    name: info.name.clone(),
                    found: info.dims.clone(),
                    expected: vec![n],
                });
            }
            let mut f = vec![0.0f32; n as usize];
            quant::dequantize_row(info.ty, file.tensor_data(info), &mut f)
                .map_err(|e| ModelError::Backend(backend::BackendError::Quant(e.to_string())))?;
            config.rope.freq_factors = Some(f);
        }
        let l = Loader {
            backend: &backend,
            file: &file,
        };
        let tok_embd = l.tensor("token_embd.weight", &[config.n_embd, config.n_vocab])?;
        let output_norm = l.tensor("output_norm.weight", &[config.n_embd])?;
        let output = l.optional("output.weight", &[config.n_embd, config.n_vocab])?;
        let layers = match config.arch {
            Arch::Llama => Layers::Dense(arch::llama::load(&l, &config)?),
            Arch::Qwen2 => Layers::Dense(arch::qwen2::load(&l, &config)?),
            Arch::Qwen3 => Layers::Dense(arch::qwen3::load(&l, &config)?),
            Arch::Qwen35 => Layers::Qwen35(arch::qwen35::load(&l, &config)?),
        };
        tracing::info!(
            arch = config.arch.name(),
            n_layer = config.n_layer,
            n_embd = config.n_embd,
            n_vocab = config.n_vocab,
            tied_output = output.is_none(),
            backend = %backend.name(),
            "model loaded"
        );
        Ok(ModelOn {
            backend,
            file,
            config,
            ubatch_size: opts.ubatch_size.max(1),
            tok_embd,
            output_norm,
            output,
            layers,
            mtp: std::sync::OnceLock::new(),
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The GGUF file (tokenizer and chat-template metadata).
    pub fn gguf(&self) -> &GgufFile {
        &self.file
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// Loads the file's multi-token-prediction block (Qwen3.5 `nextn` layers) for
    /// self-speculative decoding. Returns false if the file has none. Not loaded by default:
    /// on a GPU it costs memory that plain decoding does not need.
    pub fn load_mtp(&self) -> Result<bool, ModelError> {
        if self.mtp.get().is_some() {
            return Ok(true);
        }
        if self.config.arch != Arch::Qwen35 {
            return Ok(false);
        }
        let l = Loader {
            backend: &self.backend,
            file: &self.file,
        };
        match qwen35_mtp::load(&l, &self.config)? {
            // A concurrent caller may have won the race; either block is the same weights.
            Some(block) => {
                let _ = self.mtp.set(block);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// True once [`ModelOn::load_mtp`] loaded an MTP block.
    pub fn has_mtp(&self) -> bool {
        self.mtp.get().is_some()
    }

    /// A fresh MTP KV cache (needs [`ModelOn::load_mtp`]).
    pub fn new_mtp_state(&self, n_ctx: usize, kv_type: KvType) -> Result<MtpState<B>, ModelError> {
        let mtp = self.mtp.get().ok_or(ModelError::NoMtp)?;
        mtp.new_state(&self.backend, &self.config, n_ctx, kv_type)
    }

    /// One MTP pass (see [`crate::arch::qwen35_mtp`]): `tokens[r]` at main position
    /// `st.len() + 1 + r` with `hidden[r]` (`[n, n_embd]`, the main model's or the previous MTP
    /// step's hidden state of the position before). Logits of the last row or of every row.
    pub fn mtp_forward(
        &self,
        st: &mut MtpState<B>,
        tokens: &[u32],
        hidden: &[f32],
        all_logits: bool,
    ) -> Result<MtpOutput, ModelError> {
        let mtp = self.mtp.get().ok_or(ModelError::NoMtp)?;
        let head = self.output.as_ref().unwrap_or(&self.tok_embd);
        mtp.forward(
            &self.backend,
            &self.config,
            &self.tok_embd,
            head,
            st,
            tokens,
            hidden,
            all_logits,
        )
    }

    /// Like [`ModelOn::forward`], also returning the final hidden state of every token (after
    /// `output_norm`, what the head reads): `(logits [1 or n, n_vocab], hidden [n, n_embd])`.
    /// The MTP draft step consumes these.
    pub fn forward_hidden(
        &self,
        state: &mut SeqStateOn<B>,
        tokens: &[u32],
        all_logits: bool,
    ) -> Result<(Vec<f32>, Vec<f32>), ModelError> {
        if tokens.is_empty() {
            return Err(ModelError::EmptyInput);
        }
        self.check_state(state, tokens.len())?;
        self.check_tokens(tokens)?;
        let n = tokens.len();
        let n_out = if all_logits { n } else { 1 };
        let mut logits = Vec::with_capacity(n_out * self.config.n_vocab);
        let mut hidden = Vec::with_capacity(n * self.config.n_embd);
        let n_chunks = n.div_ceil(self.ubatch_size);
        for (ci, chunk) in tokens.chunks(self.ubatch_size).enumerate() {
            let start = state.len;
            let rows: Vec<Row> = (0..chunk.len())
                .map(|i| Row {
                    seq: 0,
                    pos: start + i,
                })
                .collect();
            let out_rows: Vec<usize> = if all_logits {
                (0..chunk.len()).collect()
            } else if ci + 1 == n_chunks {
                vec![chunk.len() - 1]
            } else {
                Vec::new()
            };
            let mut states = [&mut *state];
            let (l, h) = self.run_with_hidden(
                &mut states,
                chunk,
                Batch::new(rows),
                &out_rows,
                true,
                self.config.n_vocab,
            )?;
            logits.extend(l);
            hidden.extend(h);
            state.len += chunk.len();
        }
        Ok((logits, hidden))
    }

    /// A fresh sequence state holding `n_ctx` positions, KV stored as `kv_type`.
    pub fn new_state(&self, n_ctx: usize, kv_type: KvType) -> Result<SeqStateOn<B>, ModelError> {
        if n_ctx == 0 {
            return Err(ModelError::BadContext(n_ctx));
        }
        let c = &self.config;
        let mut layers = Vec::with_capacity(c.n_layer);
        let mut bytes = 0;
        for il in 0..c.n_layer {
            // Partial offload: each layer's cache/state on that layer's device.
            self.backend.set_layer(Some(il));
            if c.recurrent_layers[il] {
                let ssm = c
                    .ssm
                    .as_ref()
                    .ok_or_else(|| ModelError::MissingKey("ssm.*".into()))?;
                let s = self
                    .backend
                    .new_recurrent_state(&qwen35::recurrent_shape(ssm))?;
                bytes += self.backend.recurrent_state_bytes(&s);
                layers.push(LayerState::Recurrent(s));
            } else {
                let kv = self.backend.new_kv_cache(
                    n_ctx,
                    c.n_head_kv,
                    c.head_dim_k,
                    c.head_dim_v,
                    kv_type,
                )?;
                bytes += self.backend.kv_cache_bytes(&kv);
                layers.push(LayerState::Kv(kv));
            }
        }
        self.backend.set_layer(None);
        tracing::debug!(n_ctx, %kv_type, bytes, "sequence state allocated");
        Ok(SeqStateOn::new(n_ctx, layers, bytes))
    }

    /// Runs `tokens` at positions `state.len()..`, appending to the state, in micro-batches of
    /// `ubatch_size`. Returns logits `[1, n_vocab]` for the last token (`all_logits == false`)
    /// or `[tokens.len(), n_vocab]`. A prompt that does not fit in the context is an error
    /// and leaves the state untouched.
    pub fn forward(
        &self,
        state: &mut SeqStateOn<B>,
        tokens: &[u32],
        all_logits: bool,
    ) -> Result<Vec<f32>, ModelError> {
        if tokens.is_empty() {
            return Err(ModelError::EmptyInput);
        }
        self.check_state(state, tokens.len())?;
        self.check_tokens(tokens)?;
        let mut logits =
            Vec::with_capacity(if all_logits { tokens.len() } else { 1 } * self.config.n_vocab);
        let n_chunks = tokens.len().div_ceil(self.ubatch_size);
        for (ci, chunk) in tokens.chunks(self.ubatch_size).enumerate() {
            let start = state.len;
            let rows: Vec<Row> = (0..chunk.len())
                .map(|i| Row {
                    seq: 0,
                    pos: start + i,
                })
                .collect();
            let out_rows: Vec<usize> = if all_logits {
                (0..chunk.len()).collect()
            } else if ci + 1 == n_chunks {
                vec![chunk.len() - 1]
            } else {
                Vec::new()
            };
            let mut states = [&mut *state];
            logits.extend(self.run_cols(
                &mut states,
                chunk,
                Batch::new(rows),
                &out_rows,
                self.config.n_vocab,
            )?);
            state.len += chunk.len();
        }
        Ok(logits)
    }

    /// One decode step for many sequences at once (weights read once): `tokens[i]` goes to
    /// `states[i]` at its current length. Returns logits `[states.len(), n_vocab]`.
    pub fn forward_batch(
        &self,
        states: &mut [&mut SeqStateOn<B>],
        tokens: &[u32],
    ) -> Result<Vec<f32>, ModelError> {
        if states.len() != tokens.len() {
            return Err(ModelError::BatchMismatch {
                n_states: states.len(),
                n_tokens: tokens.len(),
            });
        }
        let per_state: Vec<&[u32]> = tokens.chunks(1).collect();
        self.forward_multi(states, &per_state)
    }

    /// Mixed batch: appends `tokens[i]` (one or more tokens) to `states[i]`, all sequences in
    /// the same passes over the weights (micro-batches of at most `ubatch_size` rows), so a
    /// scheduler can run chunked prefills and decode steps together. Returns the logits of
    /// each sequence's last token, `[states.len(), n_vocab]`. Every sequence is checked
    /// (context room, token ids) before anything runs.
    pub fn forward_multi(
        &self,
        states: &mut [&mut SeqStateOn<B>],
        tokens: &[&[u32]],
    ) -> Result<Vec<f32>, ModelError> {
        self.forward_multi_cols(states, tokens, self.config.n_vocab)
    }

    /// [`ModelOn::forward_multi`] with only the first `cols` logits of each row, `[states.len(),
    /// cols]` (a server samples among its tokenizer's vocabulary; an output head may be padded
    /// past it): cut on the way to the host rather than after.
    pub fn forward_multi_cols(
        &self,
        states: &mut [&mut SeqStateOn<B>],
        tokens: &[&[u32]],
        cols: usize,
    ) -> Result<Vec<f32>, ModelError> {
        self.forward_multi_fetch(states, tokens, |b, l| b.download_cols(l, cols))
    }

    /// [`ModelOn::forward_multi_cols`] for callers that sample greedily: each sequence's
    /// greedy pick ([`backend::greedy_pick`]) among the first `cols` logits of its last token,
    /// reduced where the logits are (on a GPU, a few bytes come down instead of the rows).
    pub fn forward_multi_argmax(
        &self,
        states: &mut [&mut SeqStateOn<B>],
        tokens: &[&[u32]],
        cols: usize,
    ) -> Result<Vec<Option<u32>>, ModelError> {
        self.forward_multi_fetch(states, tokens, |b, l| b.argmax_cols(l, cols))
    }

    /// [`ModelOn::forward_multi_cols`] for callers that draw from the best logits alone
    /// (top-k sampling): each sequence's [`backend::top_k_row`] of the first `cols` logits of
    /// its last token (`k` at most [`backend::MAX_TOP_K`]), selected where the logits are.
    pub fn forward_multi_top_k(
        &self,
        states: &mut [&mut SeqStateOn<B>],
        tokens: &[&[u32]],
        cols: usize,
        k: usize,
    ) -> Result<Vec<Vec<(u32, f32)>>, ModelError> {
        let k = k.min(backend::MAX_TOP_K);
        self.forward_multi_fetch(states, tokens, |b, l| b.top_k_cols(l, cols, k))
    }

    /// The mixed batch of [`ModelOn::forward_multi`], each micro-batch's last-token logits
    /// brought to the host by `fetch` (values per row: `cols` logits, or one pick).
    fn forward_multi_fetch<T>(
        &self,
        states: &mut [&mut SeqStateOn<B>],
        tokens: &[&[u32]],
        fetch: impl Fn(&B, &B::Tensor) -> Vec<T>,
    ) -> Result<Vec<T>, ModelError> {
        if states.len() != tokens.len() {
            return Err(ModelError::BatchMismatch {
                n_states: states.len(),
                n_tokens: tokens.len(),
            });
        }
        if tokens.is_empty() || tokens.iter().any(|t| t.is_empty()) {
            return Err(ModelError::EmptyInput);
        }
        for (s, t) in states.iter().zip(tokens) {
            self.check_state(s, t.len())?;
            self.check_tokens(t)?;
        }
        // Flat rows in sequence order (rows of one sequence consecutive, as the ops require).
        let mut flat: Vec<(Row, u32, bool)> = Vec::new();
        for (i, (s, t)) in states.iter().zip(tokens).enumerate() {
            for (j, &tok) in t.iter().enumerate() {
                flat.push((
                    Row {
                        seq: i,
                        pos: s.len + j,
                    },
                    tok,
                    j + 1 == t.len(),
                ));
            }
        }
        let mut logits = Vec::new();
        for chunk in flat.chunks(self.ubatch_size) {
            let rows: Vec<Row> = chunk.iter().map(|c| c.0).collect();
            let toks: Vec<u32> = chunk.iter().map(|c| c.1).collect();
            let out_rows: Vec<usize> = (0..chunk.len()).filter(|&r| chunk[r].2).collect();
            let (l, _) =
                self.run_fetch(states, &toks, Batch::new(rows), &out_rows, false, &fetch)?;
            // (one micro-batch, a decode step: its vector as it is, not a copy of 20 MB at 32
            // sequences of a 152k vocabulary)
            if logits.is_empty() {
                logits = l;
            } else {
                logits.extend(l);
            }
        }
        for (s, t) in states.iter_mut().zip(tokens) {
            s.len += t.len();
        }
        Ok(logits)
    }

    /// [`ModelOn::forward_multi`] with chosen outputs, for speculative verify passes inside a
    /// scheduler step: sequence `i` gets the logits of every one of its tokens when `all[i]`,
    /// else of its last token only (rows in sequence order, `[Σ rows, n_vocab]`). With
    /// `want_hidden` also the final (normed) hidden state of every token of every sequence,
    /// `[Σ tokens.len(), n_embd]`, which the MTP drafter reads.
    pub fn forward_multi_rows(
        &self,
        states: &mut [&mut SeqStateOn<B>],
        tokens: &[&[u32]],
        all: &[bool],
        want_hidden: bool,
    ) -> Result<(Vec<f32>, Vec<f32>), ModelError> {
        if states.len() != tokens.len() || all.len() != tokens.len() {
            return Err(ModelError::BatchMismatch {
                n_states: states.len(),
                n_tokens: tokens.len(),
            });
        }
        if tokens.is_empty() || tokens.iter().any(|t| t.is_empty()) {
            return Err(ModelError::EmptyInput);
        }
        for (s, t) in states.iter().zip(tokens) {
            self.check_state(s, t.len())?;
            self.check_tokens(t)?;
        }
        // (row, token, gives logits), rows of one sequence consecutive.
        let mut flat: Vec<(Row, u32, bool)> = Vec::new();
        for (i, (s, t)) in states.iter().zip(tokens).enumerate() {
            for (j, &tok) in t.iter().enumerate() {
                let row = Row {
                    seq: i,
                    pos: s.len + j,
                };
                flat.push((row, tok, all[i] || j + 1 == t.len()));
            }
        }
        let mut logits = Vec::new();
        let mut hidden = Vec::new();
        for chunk in flat.chunks(self.ubatch_size) {
            let rows: Vec<Row> = chunk.iter().map(|c| c.0).collect();
            let toks: Vec<u32> = chunk.iter().map(|c| c.1).collect();
            let out_rows: Vec<usize> = (0..chunk.len()).filter(|&r| chunk[r].2).collect();
            let (l, h) = self.run_with_hidden(
                states,
                &toks,
                Batch::new(rows),
                &out_rows,
                want_hidden,
                self.config.n_vocab,
            )?;
            logits.extend(l);
            hidden.extend(h);
        }
        for (s, t) in states.iter_mut().zip(tokens) {
            s.len += t.len();
        }
        Ok((logits, hidden))
    }

    fn check_tokens(&self, tokens: &[u32]) -> Result<(), ModelError> {
        match tokens.iter().find(|&&t| t as usize >= self.config.n_vocab) {
            Some(&token) => Err(ModelError::TokenOutOfRange {
                token,
                n_vocab: self.config.n_vocab,
            }),
            None => Ok(()),
        }
    }

    fn check_state(&self, s: &SeqStateOn<B>, n_new: usize) -> Result<(), ModelError> {
        let c = &self.config;
        let matches = s.layers.len() == c.n_layer
            && s.layers
                .iter()
                .zip(&c.recurrent_layers)
                .all(|(l, &r)| matches!(l, LayerState::Recurrent(_)) == r);
        if !matches {
            return Err(ModelError::ForeignState {
                found: s.layers.len(),
                expected: c.n_layer,
            });
        }
        if s.len + n_new > s.n_ctx {
            return Err(ModelError::ContextFull {
                needed: n_new,
                used: s.len,
                n_ctx: s.n_ctx,
            });
        }
        Ok(())
    }

    /// One micro-batch through every layer; the first `cols` logits of each of `out_rows`
    /// (batch row indices).
    fn run_cols(
        &self,
        states: &mut [&mut SeqStateOn<B>],
        tokens: &[u32],
        batch: Batch,
        out_rows: &[usize],
        cols: usize,
    ) -> Result<Vec<f32>, ModelError> {
        Ok(self
            .run_with_hidden(states, tokens, batch, out_rows, false, cols)?
            .0)
    }

    /// [`Self::run_cols`], also returning the normed hidden state of every row when
    /// `want_hidden` (`[tokens.len(), n_embd]`, else empty).
    fn run_with_hidden(
        &self,
        states: &mut [&mut SeqStateOn<B>],
        tokens: &[u32],
        batch: Batch,
        out_rows: &[usize],
        want_hidden: bool,
        cols: usize,
    ) -> Result<(Vec<f32>, Vec<f32>), ModelError> {
        self.run_fetch(states, tokens, batch, out_rows, want_hidden, |b, l| {
            b.download_cols(l, cols)
        })
    }

    /// One micro-batch through every layer; `fetch` brings the logits of `out_rows` (a tensor
    /// `[out_rows.len(), n_vocab]`, after the step has ended) to the host in whatever form the
    /// caller wants (rows, or only each row's greedy pick), plus the normed hidden state of
    /// every row when `want_hidden` (`[tokens.len(), n_embd]`, else empty).
    fn run_fetch<T>(
        &self,
        states: &mut [&mut SeqStateOn<B>],
        tokens: &[u32],
        batch: Batch,
        out_rows: &[usize],
        want_hidden: bool,
        fetch: impl FnOnce(&B, &B::Tensor) -> Vec<T>,
    ) -> Result<(Vec<T>, Vec<f32>), ModelError> {
        let b = &self.backend;
        let c = &self.config;
        for s in states.iter_mut() {
            if s.needs_reset {
                for l in &mut s.layers {
                    if let LayerState::Recurrent(r) = l {
                        b.reset_recurrent_state(r);
                    }
                }
                s.needs_reset = false;
            }
        }
        // Small batches (decode: one row per sequence; speculative verify: a few rows per
        // sequence) may be recorded and replayed by the backend; the guard ends the step before
        // anything is downloaded.
        let recordable = tokens.len() <= MAX_STEP_ROWS && step_shape(&batch, states.len());
        let mut step = StepGuard::begin(
            b,
            recordable.then(|| step_key(states, &batch, out_rows, want_hidden)),
        );
        let mut x = b.zeros(tokens.len(), c.n_embd);
        b.embed(&self.tok_embd, tokens, &mut x)?;
        match &self.layers {
            Layers::Dense(layers) => {
                for (il, layer) in layers.iter().enumerate() {
                    let mut caches = kv_caches(states, il);
                    // its norm reads little: the first product's weights may move meanwhile
                    b.prefetch(&[layer.first_product()])?;
                    layer.forward(b, c, &batch, &mut caches, &mut x)?;
                    b.step_mark()?;
                }
            }
            Layers::Qwen35(layers) => {
                for (il, layer) in layers.iter().enumerate() {
                    let ls = if c.recurrent_layers[il] {
                        qwen35::LayerStates::Recurrent(recurrent_states(states, il))
                    } else {
                        qwen35::LayerStates::Kv(kv_caches(states, il))
                    };
                    b.prefetch(&[layer.first_product()])?;
                    layer.forward(b, c, &batch, ls, &mut x)?;
                    b.step_mark()?;
                }
            }
        }
        let head = self.output.as_ref().unwrap_or(&self.tok_embd);
        if want_hidden {
            // Every row after the final norm (the MTP drafter reads them); logits of out_rows.
            let mut xn = b.zeros(tokens.len(), c.n_embd);
            b.rms_norm(&x, &self.output_norm, c.rms_eps, &mut xn)?;
            let logits = if out_rows.is_empty() {
                None
            } else {
                let mut sel = b.zeros(out_rows.len(), c.n_embd);
                b.get_rows(&xn, out_rows, &mut sel)?;
                Some(linear(b, head, &sel)?)
            };
            step.end()?;
            let logits = logits.map(|l| fetch(b, &l)).unwrap_or_default();
            return Ok((logits, b.download(&xn)));
        }
        if out_rows.is_empty() {
            step.end()?;
            return Ok((Vec::new(), Vec::new()));
        }
        let mut sel = b.zeros(out_rows.len(), c.n_embd);
        b.get_rows(&x, out_rows, &mut sel)?;
        b.rms_norm_inplace(&mut sel, &self.output_norm, c.rms_eps)?;
        let logits = linear(b, head, &sel)?;
        step.end()?;
        Ok((fetch(b, &logits), Vec::new()))
    }
}

/// Most rows of a batch the backend may record as a step.
const MAX_STEP_ROWS: usize = 64;

/// Most rows of one sequence in a recorded step (a speculative verify pass of `--draft-max`
/// drafts has draft-max + 1; longer runs are prompt chunks, which rarely repeat a shape).
const MAX_STEP_ROWS_PER_SEQ: usize = 16;

/// Whether multi-row steps may be recorded (`REDLINE_MULTI_ROW_STEPS=0` keeps them eager,
/// recording only one-row-per-sequence decode steps, for A/B and debugging). Read once.
fn multi_row_steps() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("REDLINE_MULTI_ROW_STEPS").map_or(true, |v| v != "0"))
}

/// Whether `batch` has the shape of a recordable step over `n_seq` sequences: every sequence
/// has at least one row, its rows consecutive and at most [`MAX_STEP_ROWS_PER_SEQ`] of them
/// (exactly one each when multi-row steps are off).
fn step_shape(batch: &Batch, n_seq: usize) -> bool {
    step_shape_with(
        batch,
        n_seq,
        if multi_row_steps() {
            MAX_STEP_ROWS_PER_SEQ
        } else {
            1
        },
    )
}

fn step_shape_with(batch: &Batch, n_seq: usize, max_per_seq: usize) -> bool {
    let mut count = vec![0usize; n_seq];
    let mut last: Option<usize> = None;
    for r in &batch.rows {
        if r.seq >= n_seq {
            return false;
        }
        // rows of one sequence are consecutive: a sequence seen before may only continue
        if last != Some(r.seq) && count[r.seq] > 0 {
            return false;
        }
        count[r.seq] += 1;
        if count[r.seq] > max_per_seq {
            return false;
        }
        last = Some(r.seq);
    }
    count.iter().all(|&c| c > 0)
}

/// The `Backend::begin_step` key of a step: which state buffers it reads and writes, the
/// sequence of each row, and which rows give logits (every shape follows from these).
fn step_key<B: Backend>(
    states: &[&mut SeqStateOn<B>],
    batch: &Batch,
    out_rows: &[usize],
    want_hidden: bool,
) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    want_hidden.hash(&mut h);
    for s in states {
        s.buffers_id.hash(&mut h);
    }
    for r in &batch.rows {
        r.seq.hash(&mut h);
    }
    out_rows.hash(&mut h);
    h.finish()
}

/// An open `Backend::begin_step`: `end` closes it; dropped still open (an op failed), it
/// aborts it.
struct StepGuard<'a, B: Backend> {
    b: &'a B,
    open: bool,
}

impl<'a, B: Backend> StepGuard<'a, B> {
    fn begin(b: &'a B, key: Option<u64>) -> Self {
        if let Some(key) = key {
            b.begin_step(key);
        }
        StepGuard {
            b,
            open: key.is_some(),
        }
    }

    fn end(&mut self) -> Result<(), ModelError> {
        if std::mem::take(&mut self.open) {
            self.b.end_step()?;
        }
        Ok(())
    }
}

impl<B: Backend> Drop for StepGuard<'_, B> {
    fn drop(&mut self) {
        if self.open {
            self.b.abort_step();
        }
    }
}

/// Layer `il`'s KV cache of every state (the caller checked the layer kinds).
fn kv_caches<'a, B: Backend>(
    states: &'a mut [&mut SeqStateOn<B>],
    il: usize,
) -> Vec<&'a mut B::KvCache> {
    states
        .iter_mut()
        .filter_map(|s| match &mut s.layers[il] {
            LayerState::Kv(c) => Some(c),
            LayerState::Recurrent(_) => None,
        })
        .collect()
}

/// Layer `il`'s recurrent state of every state.
fn recurrent_states<'a, B: Backend>(
    states: &'a mut [&mut SeqStateOn<B>],
    il: usize,
) -> Vec<&'a mut B::RecurrentState> {
    states
        .iter_mut()
        .filter_map(|s| match &mut s.layers[il] {
            LayerState::Recurrent(r) => Some(r),
            LayerState::Kv(_) => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_is_shareable_and_states_move_between_threads() {
        fn send_sync<T: Send + Sync>() {}
        fn send<T: Send>() {}
        send_sync::<Model>();
        send::<SeqState>();
    }

    /// A recordable step gives every sequence at least one row, rows of one sequence
    /// consecutive, at most `max_per_seq` of them (1: plain decode steps only).
    #[test]
    fn recordable_step_shapes() {
        let rows =
            |seqs: &[usize]| Batch::new(seqs.iter().map(|&seq| Row { seq, pos: 7 }).collect());
        assert!(step_shape_with(&rows(&[0]), 1, 1));
        assert!(step_shape_with(&rows(&[1, 0, 2]), 3, 1));
        assert!(!step_shape_with(&rows(&[0, 0]), 2, 1));
        assert!(!step_shape_with(&rows(&[0, 0]), 1, 1));
        assert!(step_shape_with(&rows(&[0, 0]), 1, 16));
        assert!(step_shape_with(&rows(&[0, 0, 0, 1, 1]), 2, 16));
        assert!(step_shape_with(&rows(&[1, 1, 0]), 2, 2));
        assert!(!step_shape_with(&rows(&[1, 1, 0]), 2, 1));
        // a sequence without rows (a micro-batch of a mixed step), rows not consecutive,
        // too many rows of one sequence, a row of no sequence
        assert!(!step_shape_with(&rows(&[0, 0]), 2, 16));
        assert!(!step_shape_with(&rows(&[0, 2]), 2, 16));
        assert!(!step_shape_with(&rows(&[0, 1, 0]), 2, 16));
        assert!(!step_shape_with(&rows(&[0; 17]), 1, 16));
        assert!(!step_shape_with(&rows(&[0]), 2, 16));
    }

    /// Decode-step keys name the state buffers and the batch structure, never positions; a
    /// snapshot restore gives a new key on a backend whose restore replaces the buffers (the
    /// CPU's; the CUDA backend copies in place and keeps the key).
    #[test]
    fn step_keys_follow_state_buffers_not_positions() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/data/fixtures/qwen35/model-f32.gguf"
        );
        let m = Model::load(path.as_ref(), &LoadOptions::default()).unwrap();
        let mut a = m.new_state(64, KvType::F32).unwrap();
        let mut b = m.new_state(64, KvType::F32).unwrap();
        let one = |pos| Batch::new(vec![Row { seq: 0, pos }]);
        let ka = step_key(&[&mut a], &one(0), &[0], false);
        m.forward(&mut a, &[1, 2, 3], false).unwrap();
        assert_eq!(step_key(&[&mut a], &one(3), &[0], false), ka);
        assert_ne!(step_key(&[&mut b], &one(3), &[0], false), ka);
        a.snapshot();
        m.forward(&mut a, &[4], false).unwrap();
        a.truncate(3).unwrap();
        assert_ne!(step_key(&[&mut a], &one(3), &[0], false), ka);
        let two = |s0, s1| Batch::new(vec![Row { seq: s0, pos: 3 }, Row { seq: s1, pos: 3 }]);
        let kab = step_key(&[&mut a, &mut b], &two(0, 1), &[0, 1], false);
        assert_ne!(step_key(&[&mut b, &mut a], &two(0, 1), &[0, 1], false), kab);
        assert_ne!(step_key(&[&mut a, &mut b], &two(0, 1), &[1], false), kab);
        assert_ne!(step_key(&[&mut a, &mut b], &two(0, 1), &[0, 1], true), kab);
    }
}
