//! Layer split over several cards (`--split-mode layer`): each card holds a consecutive run
//! of layers, behind one `backend::Backend`.
//!
//! ```ignore
//! use cuda::multi::{LayerSplit, MultiBackend};
//! let split = LayerSplit::from_counts(n_layer, &[33, 32]).unwrap();   // or LayerSplit::new(..)
//! let cards = vec![CudaBackend::new(&opts0)?, CudaBackend::new(&opts1)?];
//! let model = model::ModelOn::load_on(MultiBackend::new(cards, split)?, file, &load_opts)?;
//! ```
//!
//! One backend per card, each with its own context, stream, step arena and CUDA graphs. Two
//! instances on one GPU (two *logical* cards) work the same way, which is how the split is
//! tested on one card. Like [`crate::hybrid`], ops go to one of the backends:
//!
//! - weights are loaded by name on their layer's card ([`LayerSplit::weight_cards`]);
//! - an op runs where its weight, KV cache or recurrent state lives; other ops (add, rope,
//!   swiglu …) where their first placed operand already is;
//! - an activation on another card is copied there ([`CardLink::copy_to`]: peer-to-peer,
//!   device-to-device on one GPU) and *stays*, so the hidden state crosses once per card
//!   boundary per forward pass; every crossing is counted ([`Multi::crossings`]);
//! - KV caches and recurrent states are created on the card of the layer named through
//!   [`backend::Backend::set_layer`] (the output card if none).
//!
//! Decode steps (`begin_step`/`end_step`) are recorded per card: every active card opens the
//! step (so each records its own ops, and a crossing into a card is recorded in that card's
//! graph), and `end_step` launches the cards' graphs in order, each card's stream waiting on
//! the previous one (the first capture waits on the host instead: a capturing stream cannot
//! wait on an outside event). That needs the hidden state to visit the cards in order within
//! a step, which the layer split guarantees; a step that goes back to an earlier card is an
//! error. Where a copy between two cards cannot be recorded (two GPUs: until verified on
//! several GPUs, see [`CardLink::can_record_copies_to`] for `CudaBackend`), steps run eagerly
//! (`begin_step` answers `Eager` and the cards see no step at all).

pub mod link;
pub mod resident;
pub mod split;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::ThreadId;

use backend::{
    AttentionParams, Backend, BackendError, ColumnCopy, GgufFile, KvType, RecurrentShape,
    RopeParams, Row, StepMode,
};

use crate::backend::CudaBackend;
pub use link::{enable_peer_access, CardLink};
use resident::{caches_on, common_card, states_on};
pub use resident::{MultiKvCache, MultiRecurrentState, MultiTensor, MultiWeight, Resident};
pub use split::LayerSplit;

/// The layer-split backend over CUDA cards.
pub type MultiBackend = Multi<CudaBackend>;

/// The open decode step.
#[derive(Debug, Clone, Copy)]
struct Step {
    /// What the cards answered (all the same).
    mode: StepMode,
    /// Position in `active` of the last card an op ran on.
    reached: usize,
}

/// A backend that runs each layer on one of several backends of the same kind.
pub struct Multi<B: CardLink> {
    cards: Vec<B>,
    split: LayerSplit,
    /// Cards holding a position, in order (the only ones that open steps).
    active: Vec<usize>,
    /// Whether decode steps are forwarded to the cards (copies between every pair of
    /// consecutive active cards can be recorded).
    record_steps: bool,
    /// The cards have different device contexts (several GPUs): each op first makes its
    /// card's context current.
    bind_contexts: bool,
    /// The layer each thread last named through `set_layer`.
    current_layer: Mutex<Vec<(ThreadId, usize)>>,
    step: Mutex<Option<Step>>,
    crossings: AtomicU64,
    bytes: AtomicU64,
}

impl<B: CardLink> Multi<B> {
    /// `cards[d]` runs the positions `split` gives card `d`. Errors when the split is for
    /// another number of cards.
    pub fn new(cards: Vec<B>, split: LayerSplit) -> Result<Self, BackendError> {
        if cards.len() != split.n_cards() || cards.is_empty() {
            return Err(BackendError::Device(format!(
                "multi: a split over {} cards given {} backends",
                split.n_cards(),
                cards.len()
            )));
        }
        let active = split.active_cards();
        let record_steps = active
            .windows(2)
            .all(|w| cards[w[0]].can_record_copies_to(&cards[w[1]]));
        let bind_contexts = cards.iter().any(|c| !c.shares_context_with(&cards[0]));
        Ok(Multi {
            cards,
            split,
            active,
            record_steps,
            bind_contexts,
            current_layer: Mutex::new(Vec::new()),
            step: Mutex::new(None),
            crossings: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
        })
    }

    pub fn split(&self) -> &LayerSplit {
        &self.split
    }

    pub fn cards(&self) -> &[B] {
        &self.cards
    }

    /// Whether decode steps are recorded per card (see the module notes).
    pub fn records_steps(&self) -> bool {
        self.record_steps
    }

    /// Turns forwarding of decode steps to the cards off (every step eager, no arena); on
    /// again only where copies can be recorded.
    pub fn set_record_steps(&mut self, on: bool) {
        self.record_steps = on
            && self
                .active
                .windows(2)
                .all(|w| self.cards[w[0]].can_record_copies_to(&self.cards[w[1]]));
    }

    /// `(crossings, f32 bytes moved)` between cards so far.
    pub fn crossings(&self) -> (u64, u64) {
        (
            self.crossings.load(Ordering::Relaxed),
            self.bytes.load(Ordering::Relaxed),
        )
    }

    /// Card `d`, its context made current when the cards have several.
    fn card(&self, d: usize) -> &B {
        let c = &self.cards[d];
        if self.bind_contexts {
            c.make_current();
        }
        c
    }

    fn step_state(&self) -> MutexGuard<'_, Option<Step>> {
        self.step.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Moves `t` to card `d` (or materializes an unplaced tensor there); it stays there.
    fn place(&self, t: &MultiTensor<B>, d: usize) -> Result<(), BackendError> {
        let mut r = t.0.borrow_mut();
        let next = match &*r {
            Resident::On(c, _) if *c == d => return Ok(()),
            &Resident::Zeros { rows, cols } => Resident::On(d, self.card(d).zeros(rows, cols)),
            Resident::Host { data, rows, cols } => {
                Resident::On(d, self.card(d).upload(data, *rows, *cols)?)
            }
            Resident::On(c, src) => {
                let c = *c;
                let step = self.enter(c, d)?;
                let moved = self.card(c).copy_to(src, self.card(d), step)?;
                let (rows, cols) = self.card(d).shape(&moved);
                self.crossings.fetch_add(1, Ordering::Relaxed);
                self.bytes
                    .fetch_add(4 * (rows * cols) as u64, Ordering::Relaxed);
                Resident::On(d, moved)
            }
        };
        *r = next;
        Ok(())
    }

    /// Notes that an open recorded step goes from card `from` to card `to`, and returns its
    /// mode (`None`: no step is forwarded). Going back to an earlier card breaks the launch
    /// order of recorded steps.
    fn enter(&self, from: usize, to: usize) -> Result<Option<StepMode>, BackendError> {
        let mut st = self.step_state();
        let Some(s) = st.as_mut() else {
            return Ok(None);
        };
        let pos = |d: usize| self.active.iter().position(|&a| a == d);
        let (Some(pf), Some(pt)) = (pos(from), pos(to)) else {
            return Err(BackendError::Device(format!(
                "multi: a decode step moved a tensor between cards {from} and {to}, which hold no layer"
            )));
        };
        if s.mode != StepMode::Eager && (pt < pf || pt < s.reached) {
            return Err(BackendError::Device(format!(
                "multi: a recorded decode step went back from card {from} to card {to}"
            )));
        }
        s.reached = s.reached.max(pt);
        Ok(Some(s.mode))
    }

    fn place_all(&self, ts: &[&MultiTensor<B>], d: usize) -> Result<(), BackendError> {
        ts.iter().try_for_each(|t| self.place(t, d))
    }

    /// Where an op without a weight or state runs: the card of its first placed operand,
    /// else the input card.
    fn home(&self, ts: &[&MultiTensor<B>]) -> usize {
        ts.iter()
            .find_map(|t| t.card())
            .unwrap_or(self.split.input_card())
    }

    /// The card new caches and states go to: the layer named by `set_layer` on this thread,
    /// else the output card.
    fn alloc_card(&self) -> usize {
        let me = std::thread::current().id();
        let layers = self.current_layer.lock().unwrap_or_else(|e| e.into_inner());
        match layers.iter().find(|(t, _)| *t == me) {
            Some(&(_, il)) => self.split.layer_card(il),
            None => self.split.output_card(),
        }
    }
}

impl<B: CardLink> Backend for Multi<B> {
    type Tensor = MultiTensor<B>;
    type Weight = MultiWeight<B>;
    type KvCache = MultiKvCache<B>;
    type RecurrentState = MultiRecurrentState<B>;

    fn name(&self) -> String {
        let names: Vec<String> = self.cards.iter().map(|c| c.name()).collect();
        format!("layer split ({}; {})", names.join(" + "), self.split)
    }

    fn set_layer(&self, layer: Option<usize>) {
        let me = std::thread::current().id();
        {
            let mut layers = self.current_layer.lock().unwrap_or_else(|e| e.into_inner());
            layers.retain(|(t, _)| *t != me);
            if let Some(il) = layer {
                layers.push((me, il));
            }
        }
        for c in &self.cards {
            c.set_layer(layer);
        }
    }

    fn begin_step(&self, key: u64) -> StepMode {
        let mut st = self.step_state();
        if st.is_some() {
            drop(st);
            self.abort_step();
            st = self.step_state();
        }
        if !self.record_steps {
            return StepMode::Eager;
        }
        // Every card's previous step has finished before any card records or replays into
        // its arena again (a later card's graph reads an earlier card's arena). Decode has
        // already waited for the logits, so these are cheap.
        for &d in &self.active {
            let _ = self.card(d).finish();
        }
        let modes: Vec<StepMode> = self
            .active
            .iter()
            .map(|&d| self.card(d).begin_step(key))
            .collect();
        if modes.iter().any(|&m| m != modes[0]) {
            // One card recorded this key and another did not (a capture failed on one): drop
            // the step everywhere (the failed key stays eager from now on) and run it eagerly.
            for &d in &self.active {
                self.card(d).abort_step();
            }
            return StepMode::Eager;
        }
        *st = Some(Step {
            mode: modes[0],
            reached: 0,
        });
        modes[0]
    }

    fn end_step(&self) -> Result<(), BackendError> {
        let Some(s) = self.step_state().take() else {
            return Ok(());
        };
        let mut result = Ok(());
        for (i, &d) in self.active.iter().enumerate() {
            if i > 0 && result.is_ok() {
                let prev = &self.cards[self.active[i - 1]];
                result = match s.mode {
                    // The graph just launched must finish before this card's, which reads its
                    // output: this card's stream is still capturing and cannot wait on it.
                    StepMode::Capture => prev.finish(),
                    _ => prev.order_before(&self.cards[d]),
                };
            }
            if result.is_ok() {
                result = self.card(d).end_step();
            } else {
                self.card(d).abort_step();
            }
        }
        result
    }

    fn abort_step(&self) {
        if self.step_state().take().is_some() {
            for &d in &self.active {
                self.card(d).abort_step();
            }
        }
    }

    // ---- memory ------------------------------------------------------------------------

    fn load_weight(&self, file: &Arc<GgufFile>, name: &str) -> Result<Self::Weight, BackendError> {
        let has_output = file.tensor("output.weight").is_some();
        let copies = self
            .split
            .weight_cards(name, has_output)
            .into_iter()
            .map(|d| Ok((d, self.card(d).load_weight(file, name)?)))
            .collect::<Result<Vec<_>, BackendError>>()?;
        Ok(MultiWeight { copies })
    }

    fn weight_shape(&self, w: &Self::Weight) -> (usize, usize) {
        let (d, w) = &w.copies[0];
        self.cards[*d].weight_shape(w)
    }

    fn zeros(&self, rows: usize, cols: usize) -> Self::Tensor {
        MultiTensor::new(Resident::Zeros { rows, cols })
    }

    /// Host data stays on the host until an op on some card reads it.
    fn upload(&self, data: &[f32], rows: usize, cols: usize) -> Result<Self::Tensor, BackendError> {
        if data.len() != rows * cols {
            return Err(BackendError::Shape {
                op: "upload",
                detail: format!("{} values for [{rows}, {cols}]", data.len()),
            });
        }
        Ok(MultiTensor::new(Resident::Host {
            data: data.to_vec(),
            rows,
            cols,
        }))
    }

    fn download(&self, t: &Self::Tensor) -> Vec<f32> {
        match &*t.0.borrow() {
            Resident::On(d, x) => self.card(*d).download(x),
            &Resident::Zeros { rows, cols } => vec![0.0; rows * cols],
            Resident::Host { data, .. } => data.clone(),
        }
    }

    fn shape(&self, t: &Self::Tensor) -> (usize, usize) {
        match &*t.0.borrow() {
            Resident::On(d, x) => self.cards[*d].shape(x),
            &Resident::Zeros { rows, cols } | &Resident::Host { rows, cols, .. } => (rows, cols),
        }
    }

    // ---- dense ops ---------------------------------------------------------------------

    fn embed(
        &self,
        table: &Self::Weight,
        tokens: &[u32],
        out: &mut Self::Tensor,
    ) -> Result<(), BackendError> {
        let d = table.first_card();
        self.place(out, d)?;
        self.card(d).embed(table.on(d)?, tokens, out.on_mut(d)?)
    }

    fn matmul(
        &self,
        w: &Self::Weight,
        x: &Self::Tensor,
        out: &mut Self::Tensor,
    ) -> Result<(), BackendError> {
        let d = w.card_for(x.card());
        self.place_all(&[x, out], d)?;
        self.card(d).matmul(w.on(d)?, &*x.on(d)?, out.on_mut(d)?)
    }

    /// On the card of the first weight when every weight and bias has a copy there (one
    /// layer's projections always do), so the card's fused product runs; else one by one.
    fn matmul_many(
        &self,
        ws: &[&Self::Weight],
        biases: &[Option<&Self::Weight>],
        x: &Self::Tensor,
        outs: &mut [&mut Self::Tensor],
    ) -> Result<(), BackendError> {
        let Some(first) = ws.first() else {
            return backend::matmul_many_each(self, ws, biases, x, outs);
        };
        let d = first.card_for(x.card());
        let here =
            ws.iter().all(|w| w.on(d).is_ok()) && biases.iter().flatten().all(|b| b.on(d).is_ok());
        if !here || ws.len() != outs.len() {
            return backend::matmul_many_each(self, ws, biases, x, outs);
        }
        self.place(x, d)?;
        for o in outs.iter() {
            self.place(o, d)?;
        }
        let wd = ws.iter().map(|w| w.on(d)).collect::<Result<Vec<_>, _>>()?;
        let bd = biases
            .iter()
            .map(|b| b.map(|b| b.on(d)).transpose())
            .collect::<Result<Vec<_>, _>>()?;
        let xd = x.on(d)?;
        let mut od = outs
            .iter_mut()
            .map(|o| o.on_mut(d))
            .collect::<Result<Vec<_>, _>>()?;
        self.card(d).matmul_many(&wd, &bd, &xd, &mut od)
    }

    fn matmul_add(
        &self,
        w: &Self::Weight,
        x: &Self::Tensor,
        out: &mut Self::Tensor,
    ) -> Result<(), BackendError> {
        let d = w.card_for(x.card());
        self.place_all(&[x, out], d)?;
        self.card(d)
            .matmul_add(w.on(d)?, &*x.on(d)?, out.on_mut(d)?)
    }

    fn add_bias(&self, x: &mut Self::Tensor, bias: &Self::Weight) -> Result<(), BackendError> {
        let d = bias.card_for(x.card());
        self.place(x, d)?;
        self.card(d).add_bias(x.on_mut(d)?, bias.on(d)?)
    }

    fn add(&self, x: &mut Self::Tensor, y: &Self::Tensor) -> Result<(), BackendError> {
        let d = self.home(&[x, y]);
        self.place_all(&[x, y], d)?;
        self.card(d).add(x.on_mut(d)?, &*y.on(d)?)
    }

    fn rms_norm(
        &self,
        x: &Self::Tensor,
        w: &Self::Weight,
        eps: f32,
        out: &mut Self::Tensor,
    ) -> Result<(), BackendError> {
        let d = w.card_for(x.card());
        self.place_all(&[x, out], d)?;
        self.card(d)
            .rms_norm(&*x.on(d)?, w.on(d)?, eps, out.on_mut(d)?)
    }

    fn rms_norm_inplace(
        &self,
        x: &mut Self::Tensor,
        w: &Self::Weight,
        eps: f32,
    ) -> Result<(), BackendError> {
        let d = w.card_for(x.card());
        self.place(x, d)?;
        self.card(d).rms_norm_inplace(x.on_mut(d)?, w.on(d)?, eps)
    }

    fn l2_norm(
        &self,
        x: &mut Self::Tensor,
        col0: usize,
        len: usize,
        group: usize,
        eps: f32,
    ) -> Result<(), BackendError> {
        let d = self.home(&[x]);
        self.place(x, d)?;
        self.card(d).l2_norm(x.on_mut(d)?, col0, len, group, eps)
    }

    fn rope(
        &self,
        x: &mut Self::Tensor,
        positions: &[u32],
        head_dim: usize,
        p: &RopeParams,
    ) -> Result<(), BackendError> {
        let d = self.home(&[x]);
        self.place(x, d)?;
        self.card(d).rope(x.on_mut(d)?, positions, head_dim, p)
    }

    fn rope_qk(
        &self,
        q: &mut Self::Tensor,
        k: &mut Self::Tensor,
        positions: &[u32],
        head_dim: usize,
        p: &RopeParams,
    ) -> Result<(), BackendError> {
        let d = self.home(&[q, k]);
        self.place_all(&[q, k], d)?;
        self.card(d)
            .rope_qk(q.on_mut(d)?, k.on_mut(d)?, positions, head_dim, p)
    }

    fn swiglu(
        &self,
        gate: &Self::Tensor,
        up: &Self::Tensor,
        out: &mut Self::Tensor,
    ) -> Result<(), BackendError> {
        let d = self.home(&[gate, up, out]);
        self.place_all(&[gate, up, out], d)?;
        self.card(d)
            .swiglu(&*gate.on(d)?, &*up.on(d)?, out.on_mut(d)?)
    }

    fn silu(&self, x: &mut Self::Tensor) -> Result<(), BackendError> {
        let d = self.home(&[x]);
        self.place(x, d)?;
        self.card(d).silu(x.on_mut(d)?)
    }

    fn mul_sigmoid(&self, x: &mut Self::Tensor, gate: &Self::Tensor) -> Result<(), BackendError> {
        let d = self.home(&[x, gate]);
        self.place_all(&[x, gate], d)?;
        self.card(d).mul_sigmoid(x.on_mut(d)?, &*gate.on(d)?)
    }

    fn gated_rms_norm(
        &self,
        x: &mut Self::Tensor,
        w: &Self::Weight,
        z: &Self::Tensor,
        eps: f32,
    ) -> Result<(), BackendError> {
        let d = w.card_for(x.card());
        self.place_all(&[x, z], d)?;
        self.card(d)
            .gated_rms_norm(x.on_mut(d)?, w.on(d)?, &*z.on(d)?, eps)
    }

    fn copy_cols(
        &self,
        src: &Self::Tensor,
        dst: &mut Self::Tensor,
        c: &ColumnCopy,
    ) -> Result<(), BackendError> {
        let d = self.home(&[src, dst]);
        self.place_all(&[src, dst], d)?;
        self.card(d).copy_cols(&*src.on(d)?, dst.on_mut(d)?, c)
    }

    fn split_cols(
        &self,
        src: &Self::Tensor,
        offsets: &[usize],
        dsts: &mut [&mut Self::Tensor],
    ) -> Result<(), BackendError> {
        let d = self.home(&[src]);
        self.place(src, d)?;
        for t in dsts.iter() {
            self.place(t, d)?;
        }
        let sd = src.on(d)?;
        let mut dd = dsts
            .iter_mut()
            .map(|t| t.on_mut(d))
            .collect::<Result<Vec<_>, _>>()?;
        self.card(d).split_cols(&sd, offsets, &mut dd)
    }

    fn get_rows(
        &self,
        x: &Self::Tensor,
        rows: &[usize],
        out: &mut Self::Tensor,
    ) -> Result<(), BackendError> {
        let d = self.home(&[x, out]);
        self.place_all(&[x, out], d)?;
        self.card(d).get_rows(&*x.on(d)?, rows, out.on_mut(d)?)
    }

    // ---- attention over a KV cache -----------------------------------------------------

    fn new_kv_cache(
        &self,
        n_ctx: usize,
        n_kv_head: usize,
        head_dim_k: usize,
        head_dim_v: usize,
        kv_type: KvType,
    ) -> Result<Self::KvCache, BackendError> {
        let d = self.alloc_card();
        Ok(MultiKvCache {
            card: d,
            cache: self
                .card(d)
                .new_kv_cache(n_ctx, n_kv_head, head_dim_k, head_dim_v, kv_type)?,
        })
    }

    fn kv_cache_bytes(&self, cache: &Self::KvCache) -> usize {
        self.cards[cache.card].kv_cache_bytes(&cache.cache)
    }

    fn attention(
        &self,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
        rows: &[Row],
        caches: &mut [&mut Self::KvCache],
        p: &AttentionParams,
        out: &mut Self::Tensor,
    ) -> Result<(), BackendError> {
        let d =
            common_card("attention", caches, |c| c.card)?.unwrap_or_else(|| self.home(&[q, k, v]));
        self.place_all(&[q, k, v, out], d)?;
        self.card(d).attention(
            &*q.on(d)?,
            &*k.on(d)?,
            &*v.on(d)?,
            rows,
            &mut caches_on(caches, d)?,
            p,
            out.on_mut(d)?,
        )
    }

    // ---- Gated DeltaNet (linear attention) ---------------------------------------------

    fn new_recurrent_state(
        &self,
        shape: &RecurrentShape,
    ) -> Result<Self::RecurrentState, BackendError> {
        let d = self.alloc_card();
        Ok(MultiRecurrentState {
            card: d,
            state: self.card(d).new_recurrent_state(shape)?,
        })
    }

    fn recurrent_state_bytes(&self, s: &Self::RecurrentState) -> usize {
        self.cards[s.card].recurrent_state_bytes(&s.state)
    }

    fn reset_recurrent_state(&self, s: &mut Self::RecurrentState) {
        self.card(s.card).reset_recurrent_state(&mut s.state)
    }

    fn conv1d(
        &self,
        x: &Self::Tensor,
        w: &Self::Weight,
        rows: &[Row],
        states: &mut [&mut Self::RecurrentState],
        out: &mut Self::Tensor,
    ) -> Result<(), BackendError> {
        let d = common_card("conv1d", states, |s| s.card)?.unwrap_or(w.card_for(x.card()));
        self.place_all(&[x, out], d)?;
        self.card(d).conv1d(
            &*x.on(d)?,
            w.on(d)?,
            rows,
            &mut states_on(states, d)?,
            out.on_mut(d)?,
        )
    }

    fn delta_rule_gates(
        &self,
        alpha: &mut Self::Tensor,
        beta: &mut Self::Tensor,
        dt_bias: &Self::Weight,
        a: &Self::Weight,
    ) -> Result<(), BackendError> {
        let d = dt_bias.card_for(alpha.card());
        self.place_all(&[alpha, beta], d)?;
        self.card(d)
            .delta_rule_gates(alpha.on_mut(d)?, beta.on_mut(d)?, dt_bias.on(d)?, a.on(d)?)
    }

    fn delta_rule(
        &self,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
        g: &Self::Tensor,
        beta: &Self::Tensor,
        rows: &[Row],
        states: &mut [&mut Self::RecurrentState],
        out: &mut Self::Tensor,
    ) -> Result<(), BackendError> {
        let d = common_card("delta_rule", states, |s| s.card)?
            .unwrap_or_else(|| self.home(&[q, k, v, g, beta]));
        self.place_all(&[q, k, v, g, beta, out], d)?;
        self.card(d).delta_rule(
            &*q.on(d)?,
            &*k.on(d)?,
            &*v.on(d)?,
            &*g.on(d)?,
            &*beta.on(d)?,
            rows,
            &mut states_on(states, d)?,
            out.on_mut(d)?,
        )
    }
}
