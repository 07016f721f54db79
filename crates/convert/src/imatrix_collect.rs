//! Computing an importance matrix (`redline imatrix`, llama.cpp's llama-imatrix): run the model
//! over a text and accumulate, for every weight matrix, the sum of squared input activations per
//! input column and the number of activation rows seen.
//!
//! The model runs on [`RecordingBackend`], a CPU backend that records the input of every
//! `matmul` before delegating; every other op is passed through unchanged.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use backend::cpu::CpuBackend;
use backend::{
    AttentionParams, Backend, BackendError, ColumnCopy, GgufFile, KvType, RecurrentShape,
    RopeParams, Row,
};
use model::{LoadOptions, ModelOn};

use crate::error::ConvertError;
use crate::imatrix::ImatrixEntry;

type Sums = Arc<Mutex<BTreeMap<String, ImatrixEntry>>>;

/// A weight and the GGUF name it was loaded from.
pub struct NamedWeight<W> {
    inner: W,
    name: String,
}

/// CPU backend that accumulates the squared inputs of every matmul, per weight name.
pub struct RecordingBackend {
    inner: CpuBackend,
    sums: Sums,
}

impl Backend for RecordingBackend {
    type Tensor = <CpuBackend as Backend>::Tensor;
    type Weight = NamedWeight<<CpuBackend as Backend>::Weight>;
    type KvCache = <CpuBackend as Backend>::KvCache;
    type RecurrentState = <CpuBackend as Backend>::RecurrentState;

    fn name(&self) -> String {
        format!("{} (recording imatrix)", self.inner.name())
    }
    fn load_weight(&self, file: &Arc<GgufFile>, name: &str) -> Result<Self::Weight, BackendError> {
        Ok(NamedWeight {
            inner: self.inner.load_weight(file, name)?,
            name: name.to_owned(),
        })
    }
    fn weight_shape(&self, w: &Self::Weight) -> (usize, usize) {
        self.inner.weight_shape(&w.inner)
    }
    fn zeros(&self, rows: usize, cols: usize) -> Self::Tensor {
        self.inner.zeros(rows, cols)
    }
    fn upload(&self, data: &[f32], rows: usize, cols: usize) -> Result<Self::Tensor, BackendError> {
        self.inner.upload(data, rows, cols)
    }
    fn download(&self, t: &Self::Tensor) -> Vec<f32> {
        self.inner.download(t)
    }
    fn shape(&self, t: &Self::Tensor) -> (usize, usize) {
        self.inner.shape(t)
    }
    fn embed(
        &self,
        table: &Self::Weight,
        tokens: &[u32],
        out: &mut Self::Tensor,
    ) -> Result<(), BackendError> {
        self.inner.embed(&table.inner, tokens, out)
    }
    fn matmul(
        &self,
        w: &Self::Weight,
        x: &Self::Tensor,
        out: &mut Self::Tensor,
    ) -> Result<(), BackendError> {
        // x: [n, k]; accumulate sum over rows of x² per column k.
        let (n, k) = self.inner.shape(x);
        let data = self.inner.download(x);
        {
            let mut sums = self.sums.lock().expect("imatrix lock");
            let e = sums.entry(w.name.clone()).or_insert_with(|| ImatrixEntry {
                sums: vec![0.0; k],
                count: 0.0,
            });
            if e.sums.len() == k {
                for row in data.chunks_exact(k.max(1)).take(n) {
                    for (s, &v) in e.sums.iter_mut().zip(row) {
                        *s += v * v;
                    }
                }
                e.count += n as f32;
            }
        }
        self.inner.matmul(&w.inner, x, out)
    }
    fn add_bias(&self, x: &mut Self::Tensor, bias: &Self::Weight) -> Result<(), BackendError> {
        self.inner.add_bias(x, &bias.inner)
    }
    fn add(&self, x: &mut Self::Tensor, y: &Self::Tensor) -> Result<(), BackendError> {
        self.inner.add(x, y)
    }
    fn rms_norm(
        &self,
        x: &Self::Tensor,
        w: &Self::Weight,
        eps: f32,
        out: &mut Self::Tensor,
    ) -> Result<(), BackendError> {
        self.inner.rms_norm(x, &w.inner, eps, out)
    }
    fn rms_norm_inplace(
        &self,
        x: &mut Self::Tensor,
        w: &Self::Weight,
        eps: f32,
    ) -> Result<(), BackendError> {
        self.inner.rms_norm_inplace(x, &w.inner, eps)
    }
    fn l2_norm(
        &self,
        x: &mut Self::Tensor,
        col0: usize,
        len: usize,
        group: usize,
        eps: f32,
    ) -> Result<(), BackendError> {
        self.inner.l2_norm(x, col0, len, group, eps)
    }
    fn rope(
        &self,
        x: &mut Self::Tensor,
        positions: &[u32],
        head_dim: usize,
        p: &RopeParams,
    ) -> Result<(), BackendError> {
        self.inner.rope(x, positions, head_dim, p)
    }
    fn swiglu(
        &self,
        gate: &Self::Tensor,
        up: &Self::Tensor,
        out: &mut Self::Tensor,
    ) -> Result<(), BackendError> {
        self.inner.swiglu(gate, up, out)
    }
    fn silu(&self, x: &mut Self::Tensor) -> Result<(), BackendError> {
        self.inner.silu(x)
    }
    fn mul_sigmoid(&self, x: &mut Self::Tensor, gate: &Self::Tensor) -> Result<(), BackendError> {
        self.inner.mul_sigmoid(x, gate)
    }
    fn gated_rms_norm(
        &self,
        x: &mut Self::Tensor,
        w: &Self::Weight,
        z: &Self::Tensor,
        eps: f32,
    ) -> Result<(), BackendError> {
        self.inner.gated_rms_norm(x, &w.inner, z, eps)
    }
    fn copy_cols(
        &self,
        src: &Self::Tensor,
        dst: &mut Self::Tensor,
        c: &ColumnCopy,
    ) -> Result<(), BackendError> {
        self.inner.copy_cols(src, dst, c)
    }
    fn get_rows(
        &self,
        x: &Self::Tensor,
        rows: &[usize],
        out: &mut Self::Tensor,
    ) -> Result<(), BackendError> {
        self.inner.get_rows(x, rows, out)
    }
    fn new_kv_cache(
        &self,
        n_ctx: usize,
        n_kv_head: usize,
        head_dim_k: usize,
        head_dim_v: usize,
        kv_type: KvType,
    ) -> Result<Self::KvCache, BackendError> {
        self.inner
            .new_kv_cache(n_ctx, n_kv_head, head_dim_k, head_dim_v, kv_type)
    }
    fn kv_cache_bytes(&self, cache: &Self::KvCache) -> usize {
        self.inner.kv_cache_bytes(cache)
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
        self.inner.attention(q, k, v, rows, caches, p, out)
    }
    fn new_recurrent_state(
        &self,
        shape: &RecurrentShape,
    ) -> Result<Self::RecurrentState, BackendError> {
        self.inner.new_recurrent_state(shape)
    }
    fn recurrent_state_bytes(&self, s: &Self::RecurrentState) -> usize {
        self.inner.recurrent_state_bytes(s)
    }
    fn reset_recurrent_state(&self, s: &mut Self::RecurrentState) {
        self.inner.reset_recurrent_state(s)
    }
    fn conv1d(
        &self,
        x: &Self::Tensor,
        w: &Self::Weight,
        rows: &[Row],
        states: &mut [&mut Self::RecurrentState],
        out: &mut Self::Tensor,
    ) -> Result<(), BackendError> {
        self.inner.conv1d(x, &w.inner, rows, states, out)
    }
    fn delta_rule_gates(
        &self,
        alpha: &mut Self::Tensor,
        beta: &mut Self::Tensor,
        dt_bias: &Self::Weight,
        a: &Self::Weight,
    ) -> Result<(), BackendError> {
        self.inner
            .delta_rule_gates(alpha, beta, &dt_bias.inner, &a.inner)
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
        self.inner.delta_rule(q, k, v, g, beta, rows, states, out)
    }
}

/// Runs `chunks` (token ids, each evaluated from an empty cache) through the model in `file`
/// and returns the accumulated entries, sorted by weight name. The output head (`output.weight`)
/// is left out unless `include_output`, as llama-imatrix does by default.
pub fn collect_imatrix(
    file: GgufFile,
    chunks: &[Vec<u32>],
    opts: &LoadOptions,
    include_output: bool,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Vec<(String, ImatrixEntry)>, ConvertError> {
    let sums: Sums = Arc::default();
    let backend = RecordingBackend {
        inner: CpuBackend::new(opts.n_threads).map_err(model::ModelError::from)?,
        sums: sums.clone(),
    };
    let model = ModelOn::load_on(backend, Arc::new(file), opts)?;
    for (i, chunk) in chunks.iter().enumerate() {
        let mut state = model.new_state(chunk.len(), KvType::F32)?;
        model.forward(&mut state, chunk, false)?;
        progress(i + 1, chunks.len());
    }
    drop(model);
    let sums = std::mem::take(&mut *sums.lock().expect("imatrix lock"));
    Ok(sums
        .into_iter()
        .filter(|(n, _)| include_output || n != "output.weight")
        .collect())
}
