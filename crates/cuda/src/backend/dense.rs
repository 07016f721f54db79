//! Dense ops of `CudaBackend`: embed, matmul, norms, activations, RoPE, copies. Shapes are
//! checked here; the kernels (kernels/model_ops.cu, and the matvec/get_rows of the kernels
//! engineer) trust them.

use backend::{BackendError, ColumnCopy, RopeParams};
use cudarc::driver::{DevicePtrMut, LaunchConfig, PushKernelArg};

use gguf::GgmlType;

use super::step::dev_ptr;
use super::{dev_err, elems_cfg, shape_err, CudaBackend, CudaTensor, CudaWeight, HostInts};
use crate::pdl;

fn same_shape(op: &'static str, a: &CudaTensor, b: &CudaTensor) -> Result<(), BackendError> {
    if (a.rows, a.cols) != (b.rows, b.cols) {
        return Err(shape_err(
            op,
            format!("[{}, {}] vs [{}, {}]", a.rows, a.cols, b.rows, b.cols),
        ));
    }
    Ok(())
}

/// The f32 copy of a vector weight of `len` values.
fn vector<'w>(
    op: &'static str,
    w: &'w CudaWeight,
    len: usize,
) -> Result<&'w cudarc::driver::CudaSlice<f32>, BackendError> {
    match &w.dense {
        Some(d) if w.rows * w.cols == len => Ok(d),
        _ => Err(shape_err(
            op,
            format!("weight [{}, {}] is not a vector of {len}", w.rows, w.cols),
        )),
    }
}

impl CudaBackend {
    pub(super) fn embed_impl(
        &self,
        table: &CudaWeight,
        tokens: &[u32],
        out: &mut CudaTensor,
    ) -> Result<(), BackendError> {
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= table.rows) {
            return Err(BackendError::TokenOutOfRange {
                token: t,
                n_vocab: table.rows,
            });
        }
        if (out.rows, out.cols) != (tokens.len(), table.cols) {
            return Err(shape_err(
                "embed",
                format!(
                    "out [{}, {}] for {} tokens of {}",
                    out.rows,
                    out.cols,
                    tokens.len(),
                    table.cols
                ),
            ));
        }
        if tokens.is_empty() {
            return Ok(());
        }
        let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
        let ids = self.host_ints(&ids)?;
        if self.replaying() {
            return Ok(());
        }
        if let Some(d) = &table.dense {
            return self.gather(d, &ids, tokens.len(), table.cols, &mut out.data);
        }
        let m = table.matrix.as_ref().ok_or(BackendError::UnsupportedType {
            op: "embed",
            ty: table.ty,
        })?;
        // The row kernels of kernels/elementwise.cu, with the ids from `host_ints`.
        let float_kind = match table.ty {
            GgmlType::F32 => Some(0i32),
            GgmlType::F16 => Some(1),
            GgmlType::BF16 => Some(2),
            _ => None,
        };
        let name = match float_kind {
            Some(_) => "get_rows_float".to_string(),
            None => format!("get_rows_{}", table.ty.name().to_lowercase()),
        };
        let f = self
            .dev
            .function(crate::sources::Program::Elementwise, &name)
            .map_err(dev_err)?;
        let cfg = LaunchConfig {
            grid_dim: (tokens.len() as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let (d_i, rb) = (table.cols as i32, m.row_bytes() as i64);
        let mut b = self.dev.stream().launch_builder(&f);
        b.arg(&m.data)
            .arg(&ids.ptr)
            .arg(&mut *out.data)
            .arg(&d_i)
            .arg(&rb);
        if let Some(k) = &float_kind {
            b.arg(k);
        }
        // SAFETY: matches get_rows_<fmt>(table, ids, y, d, row_bytes[, kind]); every id was
        // checked against the table rows, out holds tokens.len() rows of d.
        unsafe { b.launch(cfg) }.map_err(dev_err)?;
        Ok(())
    }

    fn gather(
        &self,
        src: &cudarc::driver::CudaSlice<f32>,
        ids: &HostInts,
        n_out: usize,
        cols: usize,
        out: &mut cudarc::driver::CudaSlice<f32>,
    ) -> Result<(), BackendError> {
        let f = self.function("mo_gather_rows")?;
        let cfg = LaunchConfig {
            grid_dim: (n_out as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let cols_i = cols as i32;
        let mut b = self.dev.stream().launch_builder(&f);
        b.arg(src).arg(&ids.ptr).arg(out).arg(&cols_i);
        // SAFETY: matches mo_gather_rows(x, rows, out, cols); the caller checked every id
        // against the source rows and `out` holds n_out * cols values.
        unsafe { b.launch(cfg) }.map_err(dev_err)?;
        Ok(())
    }

    pub(super) fn matmul_impl(
        &self,
        w: &CudaWeight,
        x: &CudaTensor,
        out: &mut CudaTensor,
    ) -> Result<(), BackendError> {
        if x.cols != w.cols || (out.rows, out.cols) != (x.rows, w.rows) {
            return Err(shape_err(
                "matmul",
                format!(
                    "w [{}, {}], x [{}, {}], out [{}, {}]",
                    w.rows, w.cols, x.rows, x.cols, out.rows, out.cols
                ),
            ));
        }
        let n = x.rows;
        if n == 0 || w.rows == 0 {
            return Ok(());
        }
        if let Some(m) = &w.matrix {
            // Prefill (n >= the GEMM threshold): f16 tensor cores via cuBLAS (crate::gemm);
            // Ok(false) when it does not apply (few tokens, no cuBLAS): the matvec below.
            // Not inside recorded decode steps: with cuBLAS captured, replayed steps gave wrong
            // tokens on the H200 (gpu_gemm fixture test, not yet understood).
            if self.mode() == super::step::Mode::Off
                && self
                    .dev
                    .try_matmul_gemm(m, &x.data, n, &mut out.data)
                    .map_err(dev_err)?
            {
                return Ok(());
            }
            // 9..32 tokens of Q4_K / Q6_K: mmv2 with several 8-token tiles per warp
            // (REDLINE_MMV2_N)
            if crate::mmv::dispatch2n(&self.dev, m.ty, n) {
                let seg = crate::matvec::Segment {
                    w: m,
                    y: super::step::dev_ptr(&*out.data, self.dev.stream()),
                    bias: None,
                    accumulate: false,
                };
                return self.ntile_segments(vec![seg], x);
            }
            // A few tokens (batched decode, speculative verify): int8 tensor cores read the
            // weights once for up to 32 tokens where the matvec reads them once per token.
            if crate::mmq::dispatch(&self.dev, m.ty, n) {
                return self.with_scratch(n, w.cols, |s| {
                    self.dev
                        .mmq(m, &x.data, n, &mut out.data, s)
                        .map_err(dev_err)
                });
            }
            // 2/3..8 tokens of Q4_K (mmv2 / mmv): the same tensor-core kernels the fused path
            // dispatches, so fused and unfused steps differ only by the fusion (crate::mmv)
            if crate::mmv::dispatch2(&self.dev, m.ty, n) {
                return self.with_scratch(n, w.cols, |s| {
                    self.dev
                        .quantize_q8_k(&x.data, n, w.cols, s)
                        .and_then(|_| self.dev.mmv2_prequantized(m, s, &mut out.data))
                        .map_err(dev_err)
                });
            }
            if crate::mmv::dispatch(&self.dev, m.ty, n, m.n_rows) {
                return self.with_scratch(n, w.cols, |s| {
                    self.dev
                        .quantize_for_matvec(&x.data, n, w.cols, s)
                        .and_then(|_| self.dev.mmv_prequantized(m, s, &mut out.data))
                        .map_err(dev_err)
                });
            }
            // few-token f32 matrices: the fused path's kernel (the same bits either way)
            if self.f32_rows_take(w, x, out) {
                return self.matvec_f32_rows(&[0], &[w], x, &mut [out]);
            }
            return self.with_scratch(n, w.cols, |s| {
                self.dev
                    .matvec(m, &x.data, n, &mut out.data, s)
                    .map_err(dev_err)
            });
        }
        let d = w.dense.as_ref().ok_or(BackendError::UnsupportedType {
            op: "matmul",
            ty: w.ty,
        })?;
        let f = self.function("mo_matmul_f32")?;
        let outputs = w.rows * n;
        let cfg = LaunchConfig {
            grid_dim: (outputs.div_ceil(8) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let (m_i, k_i, n_i) = (w.rows as i32, w.cols as i32, n as i32);
        let mut b = self.dev.stream().launch_builder(&f);
        b.arg(d)
            .arg(&*x.data)
            .arg(&mut *out.data)
            .arg(&m_i)
            .arg(&k_i)
            .arg(&n_i);
        // SAFETY: matches mo_matmul_f32(w, x, y, m, k, n); shapes checked above.
        unsafe { b.launch(cfg) }.map_err(dev_err)?;
        Ok(())
    }

    pub(super) fn add_bias_impl(
        &self,
        x: &mut CudaTensor,
        bias: &CudaWeight,
    ) -> Result<(), BackendError> {
        let bv = vector("add_bias", bias, x.cols)?;
        let n = x.len();
        if n == 0 {
            return Ok(());
        }
        let f = self.function("mo_add_bias")?;
        let (n_i, cols_i) = (n as i64, x.cols as i32);
        let mut b = self.dev.stream().launch_builder(&f);
        b.arg(&mut *x.data).arg(bv).arg(&n_i).arg(&cols_i);
        // SAFETY: matches mo_add_bias(x, b, n, cols); b holds cols values.
        unsafe { b.launch(elems_cfg(n)) }.map_err(dev_err)?;
        Ok(())
    }

    pub(super) fn add_impl(&self, x: &mut CudaTensor, y: &CudaTensor) -> Result<(), BackendError> {
        same_shape("add", x, y)?;
        self.binary_inplace("mo_add", x, y)
    }

    pub(super) fn mul_sigmoid_impl(
        &self,
        x: &mut CudaTensor,
        gate: &CudaTensor,
    ) -> Result<(), BackendError> {
        same_shape("mul_sigmoid", x, gate)?;
        self.binary_inplace("mo_mul_sigmoid", x, gate)
    }

    /// `kernel(x, y, n)` with x updated in place.
    fn binary_inplace(
        &self,
        kernel: &str,
        x: &mut CudaTensor,
        y: &CudaTensor,
    ) -> Result<(), BackendError> {
        let n = x.len();
        if n == 0 {
            return Ok(());
        }
        let f = self.function(kernel)?;
        let n_i = n as i64;
        let mut b = self.dev.stream().launch_builder(&f);
        b.arg(&mut *x.data).arg(&*y.data).arg(&n_i);
        // SAFETY: matches <kernel>(float* x, const float* y, long long n); same shapes checked.
        unsafe { b.launch(elems_cfg(n)) }.map_err(dev_err)?;
        Ok(())
    }

    pub(super) fn unary_impl(&self, kernel: &str, x: &mut CudaTensor) -> Result<(), BackendError> {
        let n = x.len();
        if n == 0 {
            return Ok(());
        }
        let f = self.function(kernel)?;
        let n_i = n as i64;
        let mut b = self.dev.stream().launch_builder(&f);
        b.arg(&mut *x.data).arg(&n_i);
        // SAFETY: matches <kernel>(float* x, long long n).
        unsafe { b.launch(elems_cfg(n)) }.map_err(dev_err)?;
        Ok(())
    }

    pub(super) fn swiglu_impl(
        &self,
        gate: &CudaTensor,
        up: &CudaTensor,
        out: &mut CudaTensor,
    ) -> Result<(), BackendError> {
        same_shape("swiglu", gate, up)?;
        same_shape("swiglu", gate, out)?;
        let n = out.len();
        if n == 0 {
            return Ok(());
        }
        let f = self.function("mo_swiglu")?;
        let n_i = n as i64;
        let mut b = self.dev.stream().launch_builder(&f);
        b.arg(&*gate.data)
            .arg(&*up.data)
            .arg(&mut *out.data)
            .arg(&n_i);
        // SAFETY: matches mo_swiglu(g, u, out, n); all three hold n values.
        unsafe { b.launch(elems_cfg(n)) }.map_err(dev_err)?;
        Ok(())
    }

    /// RMS norm over groups of `w.len()` columns: from `src` into `out`, or in place in `out`
    /// when `src` is `None`; times `silu(z)` when `z` is given (gated).
    pub(super) fn rms_norm_impl(
        &self,
        src: Option<&CudaTensor>,
        w: &CudaWeight,
        z: Option<&CudaTensor>,
        eps: f32,
        out: &mut CudaTensor,
    ) -> Result<(), BackendError> {
        let group = w.rows * w.cols;
        let wv = vector("rms_norm", w, group)?;
        if let Some(s) = src {
            same_shape("rms_norm", s, out)?;
        }
        if let Some(z) = z {
            same_shape("gated_rms_norm", z, out)?;
        }
        if group == 0 || !out.cols.is_multiple_of(group) {
            return Err(shape_err(
                "rms_norm",
                format!("{} columns in groups of {group}", out.cols),
            ));
        }
        let n_groups = out.len() / group;
        if n_groups == 0 {
            return Ok(());
        }
        let f = self.function("mo_group_rms_norm")?;
        // Whole rows of 32k values take the block of the fused norm (mo_rms_norm_q8: one
        // thread per value up to 1024), so that both add the squares in the same order and
        // write bit-identical outputs: a fused and an unfused step then quantize the same x.
        let threads = if group.is_multiple_of(32) {
            group.min(1024)
        } else {
            group.next_power_of_two().clamp(32, 256)
        };
        let cfg = LaunchConfig {
            grid_dim: (n_groups as u32, 1, 1),
            block_dim: (threads as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let stream = self.dev.stream();
        let (po, _guard) = out.data.device_ptr_mut(stream);
        let mut a = pdl::Args::new();
        a.push(src.map_or(po, |s| dev_ptr(&s.data, stream)))
            .push(dev_ptr(wv, stream))
            .push(z.map_or(0, |z| dev_ptr(&z.data, stream)))
            .push(po)
            .push(group as i32)
            .push(eps);
        // SAFETY: matches mo_group_rms_norm(x, w, z, out, group, eps); x, z, out hold
        // n_groups * group values, w holds group; in place (x == out) is allowed by the kernel
        // (every thread rewrites only the values it read, after the block reduction). With
        // PDL it reads only w before waiting for the previous kernel.
        unsafe { a.launch(stream, &f, cfg, pdl::enabled(self.dev.arch())) }.map_err(dev_err)?;
        Ok(())
    }

    pub(super) fn l2_norm_impl(
        &self,
        x: &mut CudaTensor,
        col0: usize,
        len: usize,
        group: usize,
        eps: f32,
    ) -> Result<(), BackendError> {
        if group == 0 || !len.is_multiple_of(group) || col0 + len > x.cols {
            return Err(shape_err(
                "l2_norm",
                format!("columns {col0}..+{len} in groups of {group} of {}", x.cols),
            ));
        }
        if x.rows == 0 || len == 0 {
            return Ok(());
        }
        let f = self.function("mo_l2_norm")?;
        let cfg = LaunchConfig {
            grid_dim: (x.rows as u32, (len / group) as u32, 1),
            block_dim: (group.next_power_of_two().clamp(32, 256) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let ints = [x.cols as i32, col0 as i32, group as i32];
        let mut b = self.dev.stream().launch_builder(&f);
        b.arg(&mut *x.data)
            .arg(&ints[0])
            .arg(&ints[1])
            .arg(&ints[2])
            .arg(&eps);
        // SAFETY: matches mo_l2_norm(x, cols, col0, group, eps); the column range was checked.
        unsafe { b.launch(cfg) }.map_err(dev_err)?;
        Ok(())
    }

    pub(super) fn rope_impl(
        &self,
        x: &mut CudaTensor,
        positions: &[u32],
        head_dim: usize,
        p: &RopeParams,
    ) -> Result<(), BackendError> {
        if head_dim == 0
            || !x.cols.is_multiple_of(head_dim)
            || positions.len() != x.rows
            || !p.n_rot.is_multiple_of(2)
            || p.n_rot > head_dim
        {
            return Err(shape_err(
                "rope",
                format!(
                    "x [{}, {}], {} positions, head_dim {head_dim}, n_rot {}",
                    x.rows,
                    x.cols,
                    positions.len(),
                    p.n_rot
                ),
            ));
        }
        if let Some(f) = &p.freq_factors {
            if f.len() < p.n_rot / 2 {
                return Err(shape_err(
                    "rope",
                    format!("{} frequency factors for n_rot {}", f.len(), p.n_rot),
                ));
            }
        }
        let n_heads = x.cols / head_dim;
        if x.rows == 0 || n_heads == 0 || p.n_rot == 0 {
            return Ok(());
        }
        let (pos, factors) = self.rope_host_inputs(positions, p)?;
        if self.replaying() {
            return Ok(());
        }
        let neox = i32::from(super::rope_neox(&p.mode));
        let f = self.function("mo_rope")?;
        let cfg = LaunchConfig {
            grid_dim: (x.rows as u32, n_heads as u32, 1),
            block_dim: ((p.n_rot / 2).clamp(1, 256) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let ints = [n_heads as i32, head_dim as i32, p.n_rot as i32];
        let null = 0u64;
        let mut b = self.dev.stream().launch_builder(&f);
        b.arg(&mut *x.data).arg(&pos.ptr);
        match &factors {
            Some(fs) => b.arg(&fs.ptr),
            None => b.arg(&null),
        };
        b.arg(&ints[0])
            .arg(&ints[1])
            .arg(&ints[2])
            .arg(&p.freq_base)
            .arg(&p.freq_scale)
            .arg(&neox);
        // SAFETY: matches mo_rope(x, pos, factors, n_heads, head_dim, n_rot, freq_base,
        // freq_scale, neox); pos holds x.rows values, factors n_rot / 2 (checked) or null.
        unsafe { b.launch(cfg) }.map_err(dev_err)?;
        Ok(())
    }

    pub(super) fn copy_cols_impl(
        &self,
        src: &CudaTensor,
        dst: &mut CudaTensor,
        c: &ColumnCopy,
    ) -> Result<(), BackendError> {
        let last = |off: usize, stride: usize| {
            c.n_blocks
                .checked_sub(1)
                .map_or(0, |b| off + b * stride + c.width)
        };
        if src.rows != dst.rows
            || last(c.src_offset, c.src_stride) > src.cols
            || last(c.dst_offset, c.dst_stride) > dst.cols
        {
            return Err(shape_err(
                "copy_cols",
                format!(
                    "src [{}, {}] -> dst [{}, {}] with {c:?}",
                    src.rows, src.cols, dst.rows, dst.cols
                ),
            ));
        }
        let total = src.rows * c.n_blocks * c.width;
        if total == 0 {
            return Ok(());
        }
        let f = self.function("mo_copy_cols")?;
        let ints = [
            src.rows as i32,
            src.cols as i32,
            dst.cols as i32,
            c.n_blocks as i32,
            c.width as i32,
            c.src_offset as i32,
            c.src_stride as i32,
            c.dst_offset as i32,
            c.dst_stride as i32,
        ];
        let mut b = self.dev.stream().launch_builder(&f);
        b.arg(&*src.data).arg(&mut *dst.data);
        for i in &ints {
            b.arg(i);
        }
        // SAFETY: matches mo_copy_cols(src, dst, n_rows, src_cols, dst_cols, n_blocks, width,
        // src_off, src_stride, dst_off, dst_stride); every block lies inside its row (checked).
        unsafe { b.launch(elems_cfg(total)) }.map_err(dev_err)?;
        Ok(())
    }

    pub(super) fn get_rows_impl(
        &self,
        x: &CudaTensor,
        rows: &[usize],
        out: &mut CudaTensor,
    ) -> Result<(), BackendError> {
        if (out.rows, out.cols) != (rows.len(), x.cols) || rows.iter().any(|&r| r >= x.rows) {
            return Err(shape_err(
                "get_rows",
                format!(
                    "rows {rows:?} of [{}, {}] into [{}, {}]",
                    x.rows, x.cols, out.rows, out.cols
                ),
            ));
        }
        if rows.is_empty() || x.cols == 0 {
            return Ok(());
        }
        let ids: Vec<i32> = rows.iter().map(|&r| r as i32).collect();
        let ids = self.host_ints(&ids)?;
        if self.replaying() {
            return Ok(());
        }
        self.gather(&x.data, &ids, rows.len(), x.cols, &mut out.data)
    }
}
