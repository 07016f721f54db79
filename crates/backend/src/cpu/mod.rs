//! CPU backend: the op set on host memory, threaded with a private rayon pool.
//!
//! Weights are read in place from the GGUF mapping (matrices are never copied or
//! dequantized whole); only small tensors (norm weights, biases, conv kernels) are also kept
//! as an f32 copy for the element-wise ops. Each op family lives in its own file, with a slow
//! obviously-correct reference beside every fast path.

pub mod attention;
pub mod bandwidth;
pub mod delta_net;
pub mod elementwise;
pub mod matmul;
pub mod rope;

use std::sync::{Arc, OnceLock};

use gguf::{GgmlType, GgufFile};

use crate::{
    AttentionParams, Backend, BackendError, ColumnCopy, KvType, RecurrentShape, RopeParams, Row,
};
pub use attention::CpuKvCache;
pub use delta_net::CpuRecurrentState;

/// Tensors up to this many elements also keep an f32 copy (norms, biases, conv kernels).
const SMALL_TENSOR_ELEMENTS: usize = 1 << 16;

/// f32 activations `[rows, cols]`, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct CpuTensor {
    pub rows: usize,
    pub cols: usize,
    pub data: Vec<f32>,
}

impl CpuTensor {
    pub fn zeros(rows: usize, cols: usize) -> CpuTensor {
        CpuTensor {
            rows,
            cols,
            data: vec![0.0; rows * cols],
        }
    }

    pub fn from_vec(rows: usize, cols: usize, data: Vec<f32>) -> Result<CpuTensor, BackendError> {
        if data.len() != rows * cols {
            return Err(shape_err(
                "upload",
                format!("{} values for [{rows}, {cols}]", data.len()),
            ));
        }
        Ok(CpuTensor { rows, cols, data })
    }

    pub fn row(&self, r: usize) -> &[f32] {
        &self.data[r * self.cols..(r + 1) * self.cols]
    }
}

/// A weight read in place from the GGUF file.
#[derive(Debug, Clone)]
pub struct CpuWeight {
    file: Arc<GgufFile>,
    index: usize,
    pub ty: GgmlType,
    /// Number of rows (product of ggml dims[1..]).
    pub rows: usize,
    /// Row length (ggml dims[0]).
    pub cols: usize,
    /// f32 copy of small tensors, for element-wise ops.
    small: Option<Vec<f32>>,
    /// The matrix repacked into 16-row interleaved groups (`quant::packed`), made at its
    /// first matmul (so a table only ever read by `embed` is never copied) and shared by
    /// clones. `None` inside when the type/shape/CPU has no packed kernel.
    packed: Arc<OnceLock<Option<quant::PackedMatrix>>>,
}

impl CpuWeight {
    /// The raw bytes in the file (zero-copy).
    pub fn bytes(&self) -> &[u8] {
        self.file.tensor_data(&self.file.tensors()[self.index])
    }

    /// The whole tensor as f32, for small tensors only.
    pub fn values(&self, op: &'static str) -> Result<&[f32], BackendError> {
        self.small.as_deref().ok_or_else(|| {
            shape_err(
                op,
                format!(
                    "weight of {} elements is too large for an element-wise op",
                    self.rows * self.cols
                ),
            )
        })
    }
}

pub(crate) fn shape_err(op: &'static str, detail: String) -> BackendError {
    BackendError::Shape { op, detail }
}

pub(crate) fn check_shape(
    op: &'static str,
    t: &CpuTensor,
    rows: usize,
    cols: usize,
) -> Result<(), BackendError> {
    if t.rows != rows || t.cols != cols || t.data.len() != rows * cols {
        return Err(shape_err(
            op,
            format!(
                "tensor is [{}, {}], expected [{rows}, {cols}]",
                t.rows, t.cols
            ),
        ));
    }
    Ok(())
}

/// The CPU backend. `n_threads` workers run every op (0 = one per core).
pub struct CpuBackend {
    pool: rayon::ThreadPool,
    /// The caller plus `n_threads - 1` spinning helpers, for one-token matvecs (decode):
    /// no rayon hand-off per call (see `quant::team`). `None` with `REDLINE_CPU_TEAM=0`
    /// (for A/B measurements).
    team: Option<quant::Team>,
    /// Use the slow reference kernels (f32 activations, f64 accumulation) for matmul.
    reference: bool,
    /// Repack Q4_0 / Q8_0 / Q4_K / Q6_K matrices at first use for the interleaved kernels
    /// (`quant::packed`); `REDLINE_CPU_REPACK=0` reads every weight in place instead (A/B).
    repack: bool,
}

impl CpuBackend {
    pub fn new(n_threads: usize) -> Result<CpuBackend, BackendError> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(n_threads)
            .thread_name(|i| format!("redline-cpu-{i}"))
            .build()
            .map_err(|e| BackendError::ThreadPool(e.to_string()))?;
        let team = (std::env::var("REDLINE_CPU_TEAM").as_deref() != Ok("0"))
            .then(|| quant::Team::new(pool.current_num_threads()));
        let repack = std::env::var("REDLINE_CPU_REPACK").as_deref() != Ok("0");
        Ok(CpuBackend {
            pool,
            team,
            reference: false,
            repack,
        })
    }

    /// A backend whose matmul is the slow reference (weights dequantized row by row, f32
    /// activations, f64 sums): the oracle for conformance tests of the fast kernels.
    pub fn reference(n_threads: usize) -> Result<CpuBackend, BackendError> {
        Ok(CpuBackend {
            reference: true,
            ..CpuBackend::new(n_threads)?
        })
    }

    pub fn n_threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    /// The instruction-set path of the element-wise activations: the scalar libm loop for
    /// the reference backend, else the fastest this CPU has.
    fn isa(&self) -> quant::Isa {
        if self.reference {
            quant::Isa::Scalar
        } else {
            quant::dot::best_isa()
        }
    }

    /// `w` repacked for the interleaved kernels (packing it now if this is its first use),
    /// or `None` where there is no packed kernel for it.
    fn packed<'w>(&self, w: &'w CpuWeight) -> Option<&'w quant::PackedMatrix> {
        if !self.repack || !quant::packed::supports(w.ty, w.rows, w.cols) {
            return None;
        }
        w.packed
            .get_or_init(|| {
                let p = self.run(|| quant::PackedMatrix::pack(w.ty, w.bytes(), w.rows, w.cols));
                Some(p)
            })
            .as_ref()
    }

    /// Runs `f` on this backend's pool (so rayon inside uses our threads).
    fn run<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.pool.install(f)
    }
}

impl Backend for CpuBackend {
    type Tensor = CpuTensor;
    type Weight = CpuWeight;
    type KvCache = CpuKvCache;
    type RecurrentState = CpuRecurrentState;

    fn name(&self) -> String {
        format!("cpu ({} threads)", self.n_threads())
    }

    fn load_weight(&self, file: &Arc<GgufFile>, name: &str) -> Result<CpuWeight, BackendError> {
        let index = file
            .tensors()
            .iter()
            .position(|t| t.name == name)
            .ok_or_else(|| BackendError::MissingTensor(name.to_owned()))?;
        let info = &file.tensors()[index];
        let cols = info.dims.first().copied().unwrap_or(1) as usize;
        let rows = info.n_rows() as usize;
        let n = rows
            .checked_mul(cols)
            .ok_or_else(|| shape_err("load_weight", format!("{name}: size overflows")))?;
        let small = if n <= SMALL_TENSOR_ELEMENTS {
            let mut v = vec![0.0f32; n];
            let bytes = file.tensor_data(info);
            quant::dequantize_row(info.ty, bytes, &mut v)
                .map_err(|e| BackendError::Quant(format!("{name}: {e}")))?;
            Some(v)
        } else {
            None
        };
        Ok(CpuWeight {
            file: Arc::clone(file),
            index,
            ty: info.ty,
            rows,
            cols,
            small,
            packed: Arc::default(),
        })
    }

    fn weight_shape(&self, w: &CpuWeight) -> (usize, usize) {
        (w.rows, w.cols)
    }

    fn zeros(&self, rows: usize, cols: usize) -> CpuTensor {
        CpuTensor::zeros(rows, cols)
    }

    fn upload(&self, data: &[f32], rows: usize, cols: usize) -> Result<CpuTensor, BackendError> {
        CpuTensor::from_vec(rows, cols, data.to_vec())
    }

    fn download(&self, t: &CpuTensor) -> Vec<f32> {
        t.data.clone()
    }

    fn shape(&self, t: &CpuTensor) -> (usize, usize) {
        (t.rows, t.cols)
    }

    fn embed(
        &self,
        table: &CpuWeight,
        tokens: &[u32],
        out: &mut CpuTensor,
    ) -> Result<(), BackendError> {
        if tokens.len() <= 1 {
            return matmul::embed(table, tokens, out);
        }
        self.run(|| matmul::embed(table, tokens, out))
    }

    fn matmul(
        &self,
        w: &CpuWeight,
        x: &CpuTensor,
        out: &mut CpuTensor,
    ) -> Result<(), BackendError> {
        if self.reference {
            return matmul::matmul_reference(w, x, out);
        }
        if let Some(p) = self.packed(w) {
            // One token on the team from the calling thread (no pool hand-off); anything
            // else inside our pool, so rayon work lands on our threads.
            if x.rows == 1 && self.team.is_some() {
                return matmul::matmul_packed(p, self.team.as_ref(), x, out);
            }
            return self.run(|| matmul::matmul_packed(p, self.team.as_ref(), x, out));
        }
        if let (Some(team), 1) = (&self.team, x.rows) {
            return matmul::matvec_on(team, w, x, out);
        }
        self.run(|| matmul::matmul(w, x, out))
    }

    fn matmul_many(
        &self,
        ws: &[&CpuWeight],
        biases: &[Option<&CpuWeight>],
        x: &CpuTensor,
        outs: &mut [&mut CpuTensor],
    ) -> Result<(), BackendError> {
        // One token through several packed matrices (Q/K/V, gate/up): x prepared once and
        // one team run for all of them, instead of one run per matrix.
        if let (Some(team), 1, false) = (&self.team, x.rows, self.reference) {
            let packed: Option<Vec<&quant::PackedMatrix>> =
                ws.iter().map(|w| self.packed(w)).collect();
            if let Some(ms) = packed.filter(|ms| {
                ms.len() >= 2
                    && ms.len() == outs.len()
                    && (biases.is_empty() || biases.len() == ms.len())
                    && ms.iter().zip(outs.iter()).all(|(m, o)| {
                        let (rows, cols) = m.shape();
                        cols == x.cols && (o.rows, o.cols) == (1, rows)
                    })
            }) {
                let mut ys: Vec<&mut [f32]> = outs.iter_mut().map(|o| &mut o.data[..]).collect();
                quant::packed::matvec_many(Some(team), &ms, &x.data, &mut ys);
                for (out, bias) in outs.iter_mut().zip(biases) {
                    if let Some(b) = bias {
                        self.add_bias(out, b)?;
                    }
                }
                return Ok(());
            }
        }
        crate::matmul_many_each(self, ws, biases, x, outs)
    }

    fn add_bias(&self, x: &mut CpuTensor, bias: &CpuWeight) -> Result<(), BackendError> {
        elementwise::add_bias(x, bias.values("add_bias")?)
    }

    fn add(&self, x: &mut CpuTensor, y: &CpuTensor) -> Result<(), BackendError> {
        elementwise::add(x, y)
    }

    fn rms_norm(
        &self,
        x: &CpuTensor,
        w: &CpuWeight,
        eps: f32,
        out: &mut CpuTensor,
    ) -> Result<(), BackendError> {
        check_shape("rms_norm", out, x.rows, x.cols)?;
        out.data.copy_from_slice(&x.data);
        self.rms_norm_inplace(out, w, eps)
    }

    fn rms_norm_inplace(
        &self,
        x: &mut CpuTensor,
        w: &CpuWeight,
        eps: f32,
    ) -> Result<(), BackendError> {
        let w = w.values("rms_norm")?;
        if x.rows <= 1 {
            // Serial for one row: no pool hand-off.
            return elementwise::rms_norm(x, w, eps);
        }
        self.run(|| elementwise::rms_norm(x, w, eps))
    }

    fn l2_norm(
        &self,
        x: &mut CpuTensor,
        col0: usize,
        len: usize,
        group: usize,
        eps: f32,
    ) -> Result<(), BackendError> {
        elementwise::l2_norm(x, col0, len, group, eps)
    }

    fn rope(
        &self,
        x: &mut CpuTensor,
        positions: &[u32],
        head_dim: usize,
        p: &RopeParams,
    ) -> Result<(), BackendError> {
        if positions.len() <= 1 {
            // Serial for one row: no pool hand-off.
            return rope::rope(x, positions, head_dim, p);
        }
        self.run(|| rope::rope(x, positions, head_dim, p))
    }

    fn swiglu(
        &self,
        gate: &CpuTensor,
        up: &CpuTensor,
        out: &mut CpuTensor,
    ) -> Result<(), BackendError> {
        elementwise::swiglu(self.isa(), gate, up, out)
    }

    fn silu(&self, x: &mut CpuTensor) -> Result<(), BackendError> {
        elementwise::silu_in_place(self.isa(), x);
        Ok(())
    }

    fn mul_sigmoid(&self, x: &mut CpuTensor, gate: &CpuTensor) -> Result<(), BackendError> {
        elementwise::mul_sigmoid(self.isa(), x, gate)
    }

    fn gated_rms_norm(
        &self,
        x: &mut CpuTensor,
        w: &CpuWeight,
        z: &CpuTensor,
        eps: f32,
    ) -> Result<(), BackendError> {
        elementwise::gated_rms_norm(self.isa(), x, w.values("gated_rms_norm")?, z, eps)
    }

    fn copy_cols(
        &self,
        src: &CpuTensor,
        dst: &mut CpuTensor,
        c: &ColumnCopy,
    ) -> Result<(), BackendError> {
        elementwise::copy_cols(src, dst, c)
    }

    fn get_rows(
        &self,
        x: &CpuTensor,
        rows: &[usize],
        out: &mut CpuTensor,
    ) -> Result<(), BackendError> {
        elementwise::get_rows(x, rows, out)
    }

    fn new_kv_cache(
        &self,
        n_ctx: usize,
        n_kv_head: usize,
        head_dim_k: usize,
        head_dim_v: usize,
        kv_type: KvType,
    ) -> Result<CpuKvCache, BackendError> {
        CpuKvCache::new(n_ctx, n_kv_head, head_dim_k, head_dim_v, kv_type)
    }

    fn kv_cache_bytes(&self, cache: &CpuKvCache) -> usize {
        cache.bytes()
    }

    fn attention(
        &self,
        q: &CpuTensor,
        k: &CpuTensor,
        v: &CpuTensor,
        rows: &[Row],
        caches: &mut [&mut CpuKvCache],
        p: &AttentionParams,
        out: &mut CpuTensor,
    ) -> Result<(), BackendError> {
        if rows.len() == 1 && self.team.is_some() {
            // One token: its KV heads on the team from the calling thread (no pool hand-off,
            // and the team's helpers stay awake for the products around it).
            return attention::attention(q, k, v, rows, caches, p, out, self.team.as_ref());
        }
        self.run(|| attention::attention(q, k, v, rows, caches, p, out, None))
    }

    fn new_recurrent_state(
        &self,
        shape: &RecurrentShape,
    ) -> Result<CpuRecurrentState, BackendError> {
        CpuRecurrentState::new(shape)
    }

    fn recurrent_state_bytes(&self, s: &CpuRecurrentState) -> usize {
        s.bytes()
    }

    fn reset_recurrent_state(&self, s: &mut CpuRecurrentState) {
        s.reset();
    }

    fn conv1d(
        &self,
        x: &CpuTensor,
        w: &CpuWeight,
        rows: &[Row],
        states: &mut [&mut CpuRecurrentState],
        out: &mut CpuTensor,
    ) -> Result<(), BackendError> {
        delta_net::conv1d(x, w.values("conv1d")?, w.cols, rows, states, out)
    }

    fn delta_rule_gates(
        &self,
        alpha: &mut CpuTensor,
        beta: &mut CpuTensor,
        dt_bias: &CpuWeight,
        a: &CpuWeight,
    ) -> Result<(), BackendError> {
        delta_net::gates(
            alpha,
            beta,
            dt_bias.values("delta_rule_gates")?,
            a.values("delta_rule_gates")?,
        )
    }

    fn delta_rule(
        &self,
        q: &CpuTensor,
        k: &CpuTensor,
        v: &CpuTensor,
        g: &CpuTensor,
        beta: &CpuTensor,
        rows: &[Row],
        states: &mut [&mut CpuRecurrentState],
        out: &mut CpuTensor,
    ) -> Result<(), BackendError> {
        if rows.len() == 1 && self.team.is_some() {
            // One token: its heads on the team from the calling thread (no pool hand-off).
            return delta_net::delta_rule(q, k, v, g, beta, rows, states, out, self.team.as_ref());
        }
        self.run(|| delta_net::delta_rule(q, k, v, g, beta, rows, states, out, None))
    }
}
