//! Partial offload: some layers on the GPU, the rest on the CPU, behind one `backend::Backend`.
//!
//! ```ignore
//! use cuda::hybrid::{HybridBackend, Placement};
//! let file = Arc::new(gguf::GgufFile::open(path)?);
//! let placement = Placement::from_ngl_gguf(&file, ngl)         // llama.cpp's -ngl N
//!     .expect("block_count");                                   // or Placement::from_ngl(n_layer, ngl)
//! let backend = HybridBackend::new(CpuBackend::new(n_threads)?, CudaBackend::new(&opts)?, placement);
//! let model = model::ModelOn::load_on(backend, file, &load_opts)?;   // ModelOn<HybridBackend>
//! let (x, y) = model.backend().placement().offloaded();        // "offloaded X/Y layers to GPU"
//! ```
//!
//! [`Placement`] says which device each layer is on (llama.cpp's `-ngl` convention: the GPU
//! takes the *last* N of the `n_layer + 1` positions, the output layer counting as the last;
//! the input embedding stays on the CPU; see [`placement`]). [`Hybrid`] delegates every op to
//! one of its two backends:
//!
//! - weights are loaded by name where their layer lives (`blk.N.*` → layer N's device);
//! - an op runs where its weight, KV cache or recurrent state lives; ops with none of those
//!   (add, rope, swiglu, copy_cols, …) run where their first placed operand already is;
//! - an activation on the other device is moved there (download + upload) and *stays*, so the
//!   residual stream crosses once per device boundary per forward pass, not once per op;
//!   every move is counted ([`Hybrid::transfers`]);
//! - KV caches and recurrent states are created on the device of the layer the model names
//!   through [`backend::Backend::set_layer`] just before (the output layer's device if none).
//!
//! `Hybrid<C, G>` is generic so the placement logic runs in CI without a GPU (a second
//! `CpuBackend` standing in for the GPU); [`HybridBackend`] is the real CPU + CUDA pair.

pub mod placement;
pub mod resident;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;

use backend::cpu::CpuBackend;
use backend::{
    AttentionParams, Backend, BackendError, ColumnCopy, GgufFile, KvType, RecurrentShape,
    RopeParams, Row,
};

use crate::backend::CudaBackend;
pub use placement::{Device, Placement, WeightHome};
use resident::{common_device, cpu_caches, cpu_states, gpu_caches, gpu_states};
pub use resident::{HybridKvCache, HybridRecurrentState, HybridTensor, HybridWeight, Resident};

/// The CPU + CUDA partial-offload backend.
pub type HybridBackend = Hybrid<CpuBackend, CudaBackend>;

/// Counts of activation moves between the devices since the backend was made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Transfers {
    /// Tensors moved CPU → GPU by an op that needed them there.
    pub to_gpu: u64,
    /// Tensors moved GPU → CPU by an op that needed them there.
    pub to_cpu: u64,
    /// f32 bytes those moves carried.
    pub bytes: u64,
    /// `Backend::download` calls that read a GPU tensor back (the logits).
    pub gpu_downloads: u64,
}

impl Transfers {
    /// Device-to-device crossings of activations (`to_gpu + to_cpu`).
    pub fn crossings(&self) -> u64 {
        self.to_gpu + self.to_cpu
    }

    /// The counts accumulated since `earlier`.
    pub fn since(&self, earlier: &Transfers) -> Transfers {
        Transfers {
            to_gpu: self.to_gpu - earlier.to_gpu,
            to_cpu: self.to_cpu - earlier.to_cpu,
            bytes: self.bytes - earlier.bytes,
            gpu_downloads: self.gpu_downloads - earlier.gpu_downloads,
        }
    }
}

/// A backend that runs each layer on the CPU backend `C` or the GPU backend `G`.
pub struct Hybrid<C: Backend, G: Backend> {
    cpu: C,
    gpu: G,
    placement: Placement,
    /// The layer each thread last named through `set_layer` (per thread, so two threads
    /// building states at once cannot mix their layers up).
    current_layer: Mutex<Vec<(ThreadId, usize)>>,
    to_gpu: AtomicU64,
    to_cpu: AtomicU64,
    bytes: AtomicU64,
    gpu_downloads: AtomicU64,
}

impl<C: Backend, G: Backend> Hybrid<C, G> {
    /// `cpu` runs the layers `placement` leaves on the CPU, `gpu` the others.
    pub fn new(cpu: C, gpu: G, placement: Placement) -> Self {
        Hybrid {
            cpu,
            gpu,
            placement,
            current_layer: Mutex::new(Vec::new()),
            to_gpu: AtomicU64::new(0),
            to_cpu: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            gpu_downloads: AtomicU64::new(0),
        }
    }

    pub fn placement(&self) -> &Placement {
        &self.placement
    }

    pub fn cpu(&self) -> &C {
        &self.cpu
    }

    pub fn gpu(&self) -> &G {
        &self.gpu
    }

    /// Activation moves so far (a snapshot; take two and [`Transfers::since`] for a step).
    pub fn transfers(&self) -> Transfers {
        Transfers {
            to_gpu: self.to_gpu.load(Ordering::Relaxed),
            to_cpu: self.to_cpu.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            gpu_downloads: self.gpu_downloads.load(Ordering::Relaxed),
        }
    }

    /// Moves `t` to `d` (or allocates an unplaced zero tensor there); it stays there.
    fn place(&self, t: &HybridTensor<C, G>, d: Device) -> Result<(), BackendError> {
        let mut r = t.0.borrow_mut();
        let next = match (&*r, d) {
            (Resident::Cpu(_), Device::Cpu) | (Resident::Gpu(_), Device::Gpu) => return Ok(()),
            (&Resident::Zeros { rows, cols }, Device::Cpu) => {
                Resident::Cpu(self.cpu.zeros(rows, cols))
            }
            (&Resident::Zeros { rows, cols }, Device::Gpu) => {
                Resident::Gpu(self.gpu.zeros(rows, cols))
            }
            (Resident::Gpu(g), Device::Cpu) => {
                let (rows, cols) = self.gpu.shape(g);
                let v = self.gpu.download(g);
                self.count(&self.to_cpu, v.len());
                Resident::Cpu(self.cpu.upload(&v, rows, cols)?)
            }
            (Resident::Cpu(c), Device::Gpu) => {
                let (rows, cols) = self.cpu.shape(c);
                let v = self.cpu.download(c);
                self.count(&self.to_gpu, v.len());
                Resident::Gpu(self.gpu.upload(&v, rows, cols)?)
            }
        };
        *r = next;
        Ok(())
    }

    fn count(&self, direction: &AtomicU64, n_f32: usize) {
        direction.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(4 * n_f32 as u64, Ordering::Relaxed);
    }

    /// Places every tensor of `ts` on `d`.
    fn place_all(&self, ts: &[&HybridTensor<C, G>], d: Device) -> Result<(), BackendError> {
        ts.iter().try_for_each(|t| self.place(t, d))
    }

    /// Where an op without a weight or state runs: the device of its first placed operand
    /// (the tensor it updates comes first), the CPU if none is placed yet.
    fn home(ts: &[&HybridTensor<C, G>]) -> Device {
        ts.iter().find_map(|t| t.device()).unwrap_or(Device::Cpu)
    }

    /// The device new caches and states go to: the layer named by `set_layer` on this thread,
    /// else the output layer's.
    fn alloc_device(&self) -> Device {
        let me = std::thread::current().id();
        let layers = self.current_layer.lock().unwrap_or_else(|e| e.into_inner());
        match layers.iter().find(|(t, _)| *t == me) {
            Some(&(_, il)) => self.placement.layer_device(il),
            None => self.placement.output_device(),
        }
    }
}

/// Runs `$cpu` with `$b` = the CPU backend or `$gpu` with `$b` = the GPU backend.
macro_rules! on {
    ($self:ident, $d:expr, $b:ident => cpu: $cpu:expr, gpu: $gpu:expr) => {
        match $d {
            Device::Cpu => {
                let $b = &$self.cpu;
                $cpu
            }
            Device::Gpu => {
                let $b = &$self.gpu;
                $gpu
            }
        }
    };
}

impl<C: Backend, G: Backend> Backend for Hybrid<C, G> {
    type Tensor = HybridTensor<C, G>;
    type Weight = HybridWeight<C, G>;
    type KvCache = HybridKvCache<C, G>;
    type RecurrentState = HybridRecurrentState<C, G>;

    fn name(&self) -> String {
        format!(
            "hybrid ({} + {}, {})",
            self.cpu.name(),
            self.gpu.name(),
            self.placement
        )
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
        self.cpu.set_layer(layer);
        self.gpu.set_layer(layer);
    }

    // ---- memory ------------------------------------------------------------------------

    fn load_weight(&self, file: &Arc<GgufFile>, name: &str) -> Result<Self::Weight, BackendError> {
        let has_output = file.tensor("output.weight").is_some();
        Ok(match self.placement.weight_home(name, has_output) {
            WeightHome::Cpu => HybridWeight::Cpu(self.cpu.load_weight(file, name)?),
            WeightHome::Gpu => HybridWeight::Gpu(self.gpu.load_weight(file, name)?),
            WeightHome::CpuAndGpu => HybridWeight::Both {
                cpu: self.cpu.load_weight(file, name)?,
                gpu: self.gpu.load_weight(file, name)?,
            },
        })
    }

    fn weight_shape(&self, w: &Self::Weight) -> (usize, usize) {
        match w {
            HybridWeight::Cpu(w) | HybridWeight::Both { cpu: w, .. } => self.cpu.weight_shape(w),
            HybridWeight::Gpu(w) => self.gpu.weight_shape(w),
        }
    }

    fn zeros(&self, rows: usize, cols: usize) -> Self::Tensor {
        HybridTensor::new(Resident::Zeros { rows, cols })
    }

    /// Host data lands on the CPU (free) and moves to the GPU when an op there reads it.
    fn upload(&self, data: &[f32], rows: usize, cols: usize) -> Result<Self::Tensor, BackendError> {
        Ok(HybridTensor::new(Resident::Cpu(
            self.cpu.upload(data, rows, cols)?,
        )))
    }

    fn download(&self, t: &Self::Tensor) -> Vec<f32> {
        match &*t.0.borrow() {
            Resident::Cpu(c) => self.cpu.download(c),
            Resident::Gpu(g) => {
                self.gpu_downloads.fetch_add(1, Ordering::Relaxed);
                self.gpu.download(g)
            }
            &Resident::Zeros { rows, cols } => vec![0.0; rows * cols],
        }
    }

    fn shape(&self, t: &Self::Tensor) -> (usize, usize) {
        match &*t.0.borrow() {
            Resident::Cpu(c) => self.cpu.shape(c),
            Resident::Gpu(g) => self.gpu.shape(g),
            &Resident::Zeros { rows, cols } => (rows, cols),
        }
    }

    // ---- dense ops ---------------------------------------------------------------------

    fn embed(
        &self,
        table: &Self::Weight,
        tokens: &[u32],
        out: &mut Self::Tensor,
    ) -> Result<(), BackendError> {
        let d = table.device(Device::Cpu);
        self.place(out, d)?;
        on!(self, d, b => cpu: b.embed(table.cpu()?, tokens, out.cpu_mut()?),
                         gpu: b.embed(table.gpu()?, tokens, out.gpu_mut()?))
    }

    fn matmul(
        &self,
        w: &Self::Weight,
        x: &Self::Tensor,
        out: &mut Self::Tensor,
    ) -> Result<(), BackendError> {
        let d = w.device(Device::Gpu);
        self.place_all(&[x, out], d)?;
        on!(self, d, b => cpu: b.matmul(w.cpu()?, &*x.cpu()?, out.cpu_mut()?),
                         gpu: b.matmul(w.gpu()?, &*x.gpu()?, out.gpu_mut()?))
    }

    fn add_bias(&self, x: &mut Self::Tensor, bias: &Self::Weight) -> Result<(), BackendError> {
        let d = bias.device(Device::Gpu);
        self.place(x, d)?;
        on!(self, d, b => cpu: b.add_bias(x.cpu_mut()?, bias.cpu()?),
                         gpu: b.add_bias(x.gpu_mut()?, bias.gpu()?))
    }

    fn add(&self, x: &mut Self::Tensor, y: &Self::Tensor) -> Result<(), BackendError> {
        let d = Self::home(&[x, y]);
        self.place_all(&[x, y], d)?;
        on!(self, d, b => cpu: b.add(x.cpu_mut()?, &*y.cpu()?),
                         gpu: b.add(x.gpu_mut()?, &*y.gpu()?))
    }

    fn prefetch(&self, weights: &[&Self::Weight]) -> Result<(), BackendError> {
        // the GPU copies, in order, up to the first weight that has none
        let gpu: Vec<&G::Weight> = weights.iter().map_while(|w| w.gpu().ok()).collect();
        if gpu.is_empty() {
            return Ok(());
        }
        self.gpu.prefetch(&gpu)
    }

    fn rms_norm(
        &self,
        x: &Self::Tensor,
        w: &Self::Weight,
        eps: f32,
        out: &mut Self::Tensor,
    ) -> Result<(), BackendError> {
        let d = w.device(Device::Gpu);
        self.place_all(&[x, out], d)?;
        on!(self, d, b => cpu: b.rms_norm(&*x.cpu()?, w.cpu()?, eps, out.cpu_mut()?),
                         gpu: b.rms_norm(&*x.gpu()?, w.gpu()?, eps, out.gpu_mut()?))
    }

    fn rms_norm_inplace(
        &self,
        x: &mut Self::Tensor,
        w: &Self::Weight,
        eps: f32,
    ) -> Result<(), BackendError> {
        let d = w.device(Device::Gpu);
        self.place(x, d)?;
        on!(self, d, b => cpu: b.rms_norm_inplace(x.cpu_mut()?, w.cpu()?, eps),
                         gpu: b.rms_norm_inplace(x.gpu_mut()?, w.gpu()?, eps))
    }

    fn l2_norm(
        &self,
        x: &mut Self::Tensor,
        col0: usize,
        len: usize,
        group: usize,
        eps: f32,
    ) -> Result<(), BackendError> {
        let d = Self::home(&[x]);
        self.place(x, d)?;
        on!(self, d, b => cpu: b.l2_norm(x.cpu_mut()?, col0, len, group, eps),
                         gpu: b.l2_norm(x.gpu_mut()?, col0, len, group, eps))
    }

    fn rope(
        &self,
        x: &mut Self::Tensor,
        positions: &[u32],
        head_dim: usize,
        p: &RopeParams,
    ) -> Result<(), BackendError> {
        let d = Self::home(&[x]);
        self.place(x, d)?;
        on!(self, d, b => cpu: b.rope(x.cpu_mut()?, positions, head_dim, p),
                         gpu: b.rope(x.gpu_mut()?, positions, head_dim, p))
    }

    fn swiglu(
        &self,
        gate: &Self::Tensor,
        up: &Self::Tensor,
        out: &mut Self::Tensor,
    ) -> Result<(), BackendError> {
        let d = Self::home(&[gate, up, out]);
        self.place_all(&[gate, up, out], d)?;
        on!(self, d, b => cpu: b.swiglu(&*gate.cpu()?, &*up.cpu()?, out.cpu_mut()?),
                         gpu: b.swiglu(&*gate.gpu()?, &*up.gpu()?, out.gpu_mut()?))
    }

    fn silu(&self, x: &mut Self::Tensor) -> Result<(), BackendError> {
        let d = Self::home(&[x]);
        self.place(x, d)?;
        on!(self, d, b => cpu: b.silu(x.cpu_mut()?), gpu: b.silu(x.gpu_mut()?))
    }

    fn mul_sigmoid(&self, x: &mut Self::Tensor, gate: &Self::Tensor) -> Result<(), BackendError> {
        let d = Self::home(&[x, gate]);
        self.place_all(&[x, gate], d)?;
        on!(self, d, b => cpu: b.mul_sigmoid(x.cpu_mut()?, &*gate.cpu()?),
                         gpu: b.mul_sigmoid(x.gpu_mut()?, &*gate.gpu()?))
    }

    fn gated_rms_norm(
        &self,
        x: &mut Self::Tensor,
        w: &Self::Weight,
        z: &Self::Tensor,
        eps: f32,
    ) -> Result<(), BackendError> {
        let d = w.device(Device::Gpu);
        self.place_all(&[x, z], d)?;
        on!(self, d, b => cpu: b.gated_rms_norm(x.cpu_mut()?, w.cpu()?, &*z.cpu()?, eps),
                         gpu: b.gated_rms_norm(x.gpu_mut()?, w.gpu()?, &*z.gpu()?, eps))
    }

    fn copy_cols(
        &self,
        src: &Self::Tensor,
        dst: &mut Self::Tensor,
        c: &ColumnCopy,
    ) -> Result<(), BackendError> {
        let d = Self::home(&[src, dst]);
        self.place_all(&[src, dst], d)?;
        on!(self, d, b => cpu: b.copy_cols(&*src.cpu()?, dst.cpu_mut()?, c),
                         gpu: b.copy_cols(&*src.gpu()?, dst.gpu_mut()?, c))
    }

    fn get_rows(
        &self,
        x: &Self::Tensor,
        rows: &[usize],
        out: &mut Self::Tensor,
    ) -> Result<(), BackendError> {
        let d = Self::home(&[x, out]);
        self.place_all(&[x, out], d)?;
        on!(self, d, b => cpu: b.get_rows(&*x.cpu()?, rows, out.cpu_mut()?),
                         gpu: b.get_rows(&*x.gpu()?, rows, out.gpu_mut()?))
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
        Ok(match self.alloc_device() {
            Device::Cpu => HybridKvCache::Cpu(
                self.cpu
                    .new_kv_cache(n_ctx, n_kv_head, head_dim_k, head_dim_v, kv_type)?,
            ),
            Device::Gpu => HybridKvCache::Gpu(
                self.gpu
                    .new_kv_cache(n_ctx, n_kv_head, head_dim_k, head_dim_v, kv_type)?,
            ),
        })
    }

    fn kv_cache_bytes(&self, cache: &Self::KvCache) -> usize {
        match cache {
            HybridKvCache::Cpu(c) => self.cpu.kv_cache_bytes(c),
            HybridKvCache::Gpu(c) => self.gpu.kv_cache_bytes(c),
        }
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
        let d = common_device("attention", caches, HybridKvCache::device)?
            .unwrap_or_else(|| Self::home(&[q, k, v]));
        self.place_all(&[q, k, v, out], d)?;
        on!(self, d, b =>
            cpu: b.attention(&*q.cpu()?, &*k.cpu()?, &*v.cpu()?, rows,
                             &mut cpu_caches(caches)?, p, out.cpu_mut()?),
            gpu: b.attention(&*q.gpu()?, &*k.gpu()?, &*v.gpu()?, rows,
                             &mut gpu_caches(caches)?, p, out.gpu_mut()?))
    }

    // ---- Gated DeltaNet (linear attention) ---------------------------------------------

    fn new_recurrent_state(
        &self,
        shape: &RecurrentShape,
    ) -> Result<Self::RecurrentState, BackendError> {
        Ok(match self.alloc_device() {
            Device::Cpu => HybridRecurrentState::Cpu(self.cpu.new_recurrent_state(shape)?),
            Device::Gpu => HybridRecurrentState::Gpu(self.gpu.new_recurrent_state(shape)?),
        })
    }

    fn recurrent_state_bytes(&self, s: &Self::RecurrentState) -> usize {
        match s {
            HybridRecurrentState::Cpu(s) => self.cpu.recurrent_state_bytes(s),
            HybridRecurrentState::Gpu(s) => self.gpu.recurrent_state_bytes(s),
        }
    }

    fn reset_recurrent_state(&self, s: &mut Self::RecurrentState) {
        match s {
            HybridRecurrentState::Cpu(s) => self.cpu.reset_recurrent_state(s),
            HybridRecurrentState::Gpu(s) => self.gpu.reset_recurrent_state(s),
        }
    }

    fn conv1d(
        &self,
        x: &Self::Tensor,
        w: &Self::Weight,
        rows: &[Row],
        states: &mut [&mut Self::RecurrentState],
        out: &mut Self::Tensor,
    ) -> Result<(), BackendError> {
        let d = common_device("conv1d", states, HybridRecurrentState::device)?
            .unwrap_or_else(|| w.device(Device::Gpu));
        self.place_all(&[x, out], d)?;
        on!(self, d, b =>
            cpu: b.conv1d(&*x.cpu()?, w.cpu()?, rows, &mut cpu_states(states)?, out.cpu_mut()?),
            gpu: b.conv1d(&*x.gpu()?, w.gpu()?, rows, &mut gpu_states(states)?, out.gpu_mut()?))
    }

    fn delta_rule_gates(
        &self,
        alpha: &mut Self::Tensor,
        beta: &mut Self::Tensor,
        dt_bias: &Self::Weight,
        a: &Self::Weight,
    ) -> Result<(), BackendError> {
        let d = dt_bias.device(Device::Gpu);
        self.place_all(&[alpha, beta], d)?;
        on!(self, d, b =>
            cpu: b.delta_rule_gates(alpha.cpu_mut()?, beta.cpu_mut()?, dt_bias.cpu()?, a.cpu()?),
            gpu: b.delta_rule_gates(alpha.gpu_mut()?, beta.gpu_mut()?, dt_bias.gpu()?, a.gpu()?))
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
        let d = common_device("delta_rule", states, HybridRecurrentState::device)?
            .unwrap_or_else(|| Self::home(&[q, k, v, g, beta]));
        self.place_all(&[q, k, v, g, beta, out], d)?;
        on!(self, d, b =>
            cpu: b.delta_rule(&*q.cpu()?, &*k.cpu()?, &*v.cpu()?, &*g.cpu()?, &*beta.cpu()?, rows,
                              &mut cpu_states(states)?, out.cpu_mut()?),
            gpu: b.delta_rule(&*q.gpu()?, &*k.gpu()?, &*v.gpu()?, &*g.gpu()?, &*beta.gpu()?, rows,
                              &mut gpu_states(states)?, out.gpu_mut()?))
    }
}
