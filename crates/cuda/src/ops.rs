//! Host side of the per-token layer ops (kernels/elementwise.cu, kernels/attention.cu).
//! All asynchronous on the device stream; shapes are checked here, never in the kernels.

use crate::device::CudaDevice;
use crate::error::{CudaError, Result};
use crate::matvec::DeviceMatrix;
use crate::sources::Program;
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};
use gguf::GgmlType;

/// How RoPE pairs dimensions and where positions come from (ggml's rope modes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeMode {
    /// pairs (2i, 2i+1) — llama
    Normal,
    /// pairs (i, i + n_dims/2) — NeoX, qwen2/3
    Neox,
    /// NeoX pairs, position per contiguous section (t, h, w, e) — Qwen2-VL MRoPE
    Multi { sections: [i32; 4] },
    /// NeoX pairs, sections interleaved t, h, w, t, h, w, … — Qwen3-VL / Qwen3.5 IMRoPE
    Interleaved { sections: [i32; 4] },
}

#[derive(Clone, Copy, Debug)]
pub struct RopeParams {
    /// rotated dims per head (<= head_dim, even)
    pub n_dims: usize,
    pub freq_base: f32,
    /// linear position scaling (1.0 = none)
    pub freq_scale: f32,
    pub mode: RopeMode,
}

/// Partial results of split-KV decode attention.
pub struct AttentionScratch {
    ml: CudaSlice<f32>,
    acc: CudaSlice<f32>,
}

/// Columns of one block of `argmax_parts_f32` (a 152k vocabulary: 19 blocks a row).
const ARGMAX_PER: usize = 8192;

/// `REDLINE_TOPK_LOG=1`: each top-k call prints its time (a diagnostic).
fn top_k_log() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("REDLINE_TOPK_LOG").as_deref() == Ok("1"))
}

/// Most candidates a row of `topk_parts_f32` keeps (TOPK_MAX), and columns of one of its
/// blocks (TOPK_PER: its keys in shared memory).
pub const TOP_K_MAX: usize = 64;
const TOP_K_PER: usize = 8192;
/// Most candidates of one row `topk_merge_f32` merges (TOPK_MERGE_MAX).
const TOP_K_MERGE_MAX: usize = 4096;

/// Positions per split of decode attention (each block's share of the KV length).
pub const ATTENTION_CHUNK: usize = 256;

fn elems_cfg(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(256).clamp(1, 65535) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn check_len(what: &str, have: usize, need: usize) -> Result<()> {
    if have < need {
        return Err(CudaError::Shape(format!(
            "{what}: {have} elements, need {need}"
        )));
    }
    Ok(())
}

impl CudaDevice {
    /// y = x / rms(x) * w per row. x, y: [n_rows, d]; w: [d].
    pub fn rms_norm(
        &self,
        x: &CudaSlice<f32>,
        w: &CudaSlice<f32>,
        y: &mut CudaSlice<f32>,
        n_rows: usize,
        d: usize,
        eps: f32,
    ) -> Result<()> {
        check_len("rms_norm x", x.len(), n_rows * d)?;
        check_len("rms_norm y", y.len(), n_rows * d)?;
        check_len("rms_norm w", w.len(), d)?;
        if n_rows == 0 {
            return Ok(());
        }
        let f = self.function(Program::Elementwise, "rms_norm_f32")?;
        let cfg = LaunchConfig {
            grid_dim: (n_rows as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let d_i = d as i32;
        let mut b = self.stream().launch_builder(&f);
        b.arg(x).arg(w).arg(y).arg(&d_i).arg(&eps);
        // SAFETY: matches rms_norm_f32(x, w, y, d, eps); sizes checked.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// RoPE in place. x: [n_tokens, n_heads, head_dim] f32; pos: [n_tokens] i32, or
    /// [4, n_tokens] for the multi-section modes.
    pub fn rope(
        &self,
        x: &mut CudaSlice<f32>,
        pos: &CudaSlice<i32>,
        n_tokens: usize,
        n_heads: usize,
        head_dim: usize,
        p: &RopeParams,
    ) -> Result<()> {
        check_len("rope x", x.len(), n_tokens * n_heads * head_dim)?;
        let (mode, s) = match p.mode {
            RopeMode::Normal => (0, [0; 4]),
            RopeMode::Neox => (1, [0; 4]),
            RopeMode::Multi { sections } => (2, sections),
            RopeMode::Interleaved { sections } => (3, sections),
        };
        check_len(
            "rope pos",
            pos.len(),
            if mode >= 2 { 4 * n_tokens } else { n_tokens },
        )?;
        if !p.n_dims.is_multiple_of(2) || p.n_dims > head_dim || p.n_dims > 2048 {
            return Err(CudaError::Shape(format!(
                "rope n_dims {} for head_dim {head_dim}",
                p.n_dims
            )));
        }
        if mode >= 2 && (s.iter().any(|&v| v < 0) || s.iter().sum::<i32>() <= 0) {
            return Err(CudaError::Shape(format!("rope sections {s:?}")));
        }
        if n_tokens == 0 || n_heads == 0 || p.n_dims == 0 {
            return Ok(());
        }
        let f = self.function(Program::Elementwise, "rope_f32")?;
        let cfg = LaunchConfig {
            grid_dim: (n_tokens as u32, n_heads as u32, 1),
            block_dim: ((p.n_dims / 2) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let ints = [
            n_tokens as i32,
            n_heads as i32,
            head_dim as i32,
            p.n_dims as i32,
        ];
        let mut b = self.stream().launch_builder(&f);
        b.arg(x)
            .arg(pos)
            .arg(&ints[0])
            .arg(&ints[1])
            .arg(&ints[2])
            .arg(&ints[3]);
        b.arg(&p.freq_base).arg(&p.freq_scale).arg(&mode);
        b.arg(&s[0]).arg(&s[1]).arg(&s[2]).arg(&s[3]);
        // SAFETY: matches rope_f32(x, pos, n_tokens, n_heads, head_dim, n_dims, freq_base,
        // freq_scale, mode, s0..s3); sizes checked.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// y = silu(gate) * up, all [n].
    pub fn swiglu(
        &self,
        gate: &CudaSlice<f32>,
        up: &CudaSlice<f32>,
        y: &mut CudaSlice<f32>,
        n: usize,
    ) -> Result<()> {
        check_len("swiglu gate", gate.len(), n)?;
        check_len("swiglu up", up.len(), n)?;
        check_len("swiglu y", y.len(), n)?;
        let f = self.function(Program::Elementwise, "swiglu_f32")?;
        let n_i = n as i64;
        let mut b = self.stream().launch_builder(&f);
        b.arg(gate).arg(up).arg(y).arg(&n_i);
        // SAFETY: matches swiglu_f32(gate, up, y, n); sizes checked.
        unsafe { b.launch(elems_cfg(n)) }?;
        Ok(())
    }

    /// acc += b, both [n] (the residual add).
    pub fn add_assign(
        &self,
        acc: &mut CudaSlice<f32>,
        other: &CudaSlice<f32>,
        n: usize,
    ) -> Result<()> {
        check_len("add acc", acc.len(), n)?;
        check_len("add other", other.len(), n)?;
        let f = self.function(Program::Elementwise, "add_f32")?;
        let n_i = n as i64;
        let stream = self.stream();
        let (pb, _gb) = other.device_ptr(stream);
        let (pa, _ga) = acc.device_ptr_mut(stream);
        let mut b = stream.launch_builder(&f);
        b.arg(&pa).arg(&pb).arg(&pa).arg(&n_i);
        // SAFETY: matches add_f32(a, b, y, n) with y == a (the kernel allows the alias);
        // both buffers hold >= n elements and stay borrowed until the guards drop.
        unsafe { b.launch(elems_cfg(n)) }?;
        Ok(())
    }

    /// Embedding lookup: y[t, :] = row ids[t] of `table` ([n_vocab, d] in its GGUF type) as f32.
    /// `ids` are checked against n_vocab on the host before they reach the device.
    pub fn get_rows(
        &self,
        table: &DeviceMatrix,
        ids: &[u32],
        y: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let d = table.n_cols;
        check_len("get_rows y", y.len(), ids.len() * d)?;
        if let Some(&bad) = ids.iter().find(|&&i| i as usize >= table.n_rows) {
            return Err(CudaError::Shape(format!(
                "token id {bad} >= vocabulary {}",
                table.n_rows
            )));
        }
        if ids.is_empty() {
            return Ok(());
        }
        let ids_i: Vec<i32> = ids.iter().map(|&i| i as i32).collect();
        let ids_d = self.stream().clone_htod(&ids_i)?;
        let cfg = LaunchConfig {
            grid_dim: (ids.len() as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let (d_i, rb) = (d as i32, table.row_bytes() as i64);
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
        let f = self.function(Program::Elementwise, &name)?;
        let mut b = self.stream().launch_builder(&f);
        b.arg(&table.data).arg(&ids_d).arg(y).arg(&d_i).arg(&rb);
        if let Some(k) = &float_kind {
            b.arg(k);
        }
        // SAFETY: matches get_rows_<fmt>(table, ids, y, d, row_bytes[, kind]); ids < n_rows.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    pub fn attention_scratch(
        &self,
        n_heads: usize,
        max_kv: usize,
        head_dim: usize,
    ) -> Result<AttentionScratch> {
        let splits = max_kv.div_ceil(ATTENTION_CHUNK).max(1);
        Ok(AttentionScratch {
            ml: self.stream().alloc_zeros::<f32>(2 * n_heads * splits)?,
            acc: self
                .stream()
                .alloc_zeros::<f32>(n_heads * splits * head_dim)?,
        })
    }

    /// Decode attention for one query token over positions 0..n_kv of an f16 cache.
    /// q: [n_heads, head_dim] f32; k, v: [>= n_kv, n_kv_heads, head_dim] f16 bits;
    /// out: [n_heads, head_dim] f32. softmax(scale * q.k) v, grouped-query.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_decode(
        &self,
        q: &CudaSlice<f32>,
        k: &CudaSlice<u16>,
        v: &CudaSlice<u16>,
        n_kv: usize,
        n_heads: usize,
        n_kv_heads: usize,
        head_dim: usize,
        scale: f32,
        out: &mut CudaSlice<f32>,
        scratch: &mut AttentionScratch,
    ) -> Result<()> {
        if head_dim == 0 || !head_dim.is_multiple_of(32) || head_dim > 256 {
            return Err(CudaError::Shape(format!(
                "attention head_dim {head_dim} (multiple of 32, <= 256)"
            )));
        }
        if n_kv_heads == 0 || !n_heads.is_multiple_of(n_kv_heads) || n_kv == 0 {
            return Err(CudaError::Shape(format!(
                "attention {n_heads} heads / {n_kv_heads} kv heads, n_kv {n_kv}"
            )));
        }
        check_len("attention q", q.len(), n_heads * head_dim)?;
        check_len("attention k", k.len(), n_kv * n_kv_heads * head_dim)?;
        check_len("attention v", v.len(), n_kv * n_kv_heads * head_dim)?;
        check_len("attention out", out.len(), n_heads * head_dim)?;
        let splits = n_kv.div_ceil(ATTENTION_CHUNK);
        check_len(
            "attention scratch",
            scratch.acc.len(),
            n_heads * splits * head_dim,
        )?;
        let f1 = self.function(Program::Attention, "attention_decode_split")?;
        let cfg1 = LaunchConfig {
            grid_dim: (n_heads as u32, splits as u32, 1),
            block_dim: (32, 4, 1),
            shared_mem_bytes: 0,
        };
        let ints = [
            n_kv as i32,
            n_heads as i32,
            n_kv_heads as i32,
            head_dim as i32,
        ];
        let chunk = ATTENTION_CHUNK as i32;
        let mut b = self.stream().launch_builder(&f1);
        b.arg(q)
            .arg(k)
            .arg(v)
            .arg(&mut scratch.ml)
            .arg(&mut scratch.acc);
        b.arg(&ints[0])
            .arg(&ints[1])
            .arg(&ints[2])
            .arg(&ints[3])
            .arg(&scale)
            .arg(&chunk);
        // SAFETY: matches attention_decode_split(q, k, v, part_ml, part_acc, n_kv, n_heads,
        // n_kv_heads, head_dim, scale, chunk); sizes checked above.
        unsafe { b.launch(cfg1) }?;
        let f2 = self.function(Program::Attention, "attention_decode_merge")?;
        let cfg2 = LaunchConfig {
            grid_dim: (n_heads as u32, 1, 1),
            block_dim: (32, 1, 1),
            shared_mem_bytes: 0,
        };
        let (splits_i, hd) = (splits as i32, head_dim as i32);
        let mut b = self.stream().launch_builder(&f2);
        b.arg(&scratch.ml)
            .arg(&scratch.acc)
            .arg(out)
            .arg(&splits_i)
            .arg(&hd);
        // SAFETY: matches attention_decode_merge(part_ml, part_acc, out, n_splits, head_dim).
        unsafe { b.launch(cfg2) }?;
        Ok(())
    }

    /// The greedy pick of every row of `x` (`rows` rows of `ld` floats) among its first
    /// `cols` values, as [`backend::greedy_pick`] makes it: the largest value (NaN as -inf,
    /// total order), the lowest column among equal ones, `None` for a row with no finite
    /// value. The rows stay on the device; `rows * parts * 3` floats come down
    /// (`argmax_parts_f32`, then the parts combined here in column order).
    pub fn argmax_rows(
        &self,
        x: &CudaSlice<f32>,
        rows: usize,
        ld: usize,
        cols: usize,
    ) -> Result<Vec<Option<u32>>> {
        let cols = cols.min(ld);
        check_len("argmax x", x.len(), rows * ld)?;
        if rows == 0 || cols == 0 {
            return Ok(vec![None; rows]);
        }
        if cols > i32::MAX as usize || rows > 65535 {
            return Err(CudaError::Shape(format!("argmax of {rows} rows of {cols}")));
        }
        let parts = cols.div_ceil(ARGMAX_PER);
        let per = cols.div_ceil(parts);
        let mut out = self.stream().alloc_zeros::<f32>(rows * parts * 3)?;
        let f = self.function(Program::Elementwise, "argmax_parts_f32")?;
        let cfg = LaunchConfig {
            grid_dim: (parts as u32, rows as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let (ld_i, cols_i, per_i) = (ld as i64, cols as i32, per as i32);
        let mut b = self.stream().launch_builder(&f);
        b.arg(x).arg(&ld_i).arg(&cols_i).arg(&per_i).arg(&mut out);
        // SAFETY: matches argmax_parts_f32(x, ld, cols, per, out): x holds rows * ld floats
        // (checked), cols <= ld, out holds rows * parts * 3 floats for the grid (parts, rows).
        unsafe { b.launch(cfg) }?;
        let v = self.stream().clone_dtoh(&out)?;
        Ok(v.chunks(parts * 3)
            .map(|row| {
                let mut best: Option<(f32, u32)> = None;
                let mut finite = false;
                for p in row.chunks(3) {
                    finite |= p[2] != 0.0;
                    let i = p[1].to_bits() as i32;
                    // parts in column order: an equal value later never wins (values in
                    // total order: +0 above -0, as the kernel and the sampler take them)
                    if i >= 0 && best.is_none_or(|(bv, _)| p[0].total_cmp(&bv).is_gt()) {
                        best = Some((p[0], i as u32));
                    }
                }
                best.filter(|_| finite).map(|(_, i)| i)
            })
            .collect())
    }

    /// The `k` best values (`k <= 64`) of every row of `x` (`rows` rows of `ld` floats) among
    /// its first `cols`, as [`backend::top_k_row`] takes them: `(column, value)` by value
    /// highest first (NaN read as -inf, `f32::total_cmp` order), the lower column first among
    /// equal ones; empty for a row with no finite value. Two launches: `topk_parts_f32`
    /// selects each row part's k best, `topk_merge_f32` merges a row's parts into its sorted k
    /// best; `rows * (1 + 2k)` floats come down. A [`CudaError::Shape`] for rows too long for
    /// the merge (more than 4096 / k parts of 8192).
    pub fn top_k_rows(
        &self,
        x: &CudaSlice<f32>,
        rows: usize,
        ld: usize,
        cols: usize,
        k: usize,
    ) -> Result<Vec<Vec<(u32, f32)>>> {
        let cols = cols.min(ld);
        check_len("top_k x", x.len(), rows * ld)?;
        if k > TOP_K_MAX {
            return Err(CudaError::Shape(format!("top-{k} (at most {TOP_K_MAX})")));
        }
        if rows == 0 || cols == 0 || k == 0 {
            return Ok(vec![Vec::new(); rows]);
        }
        let parts = cols.div_ceil(TOP_K_PER);
        if cols > i32::MAX as usize || rows > 65535 || parts * k > TOP_K_MERGE_MAX {
            return Err(CudaError::Shape(format!(
                "top-{k} of {rows} rows of {cols}"
            )));
        }
        let per = cols.div_ceil(parts);
        let width = 1 + 2 * k;
        let log = top_k_log().then(std::time::Instant::now);
        // SAFETY: both buffers are written whole by the kernels before anything reads them
        // (every part's and every row's flag and k slots).
        let (mut part, mut out) = unsafe {
            (
                self.stream().alloc::<f32>(rows * parts * width)?,
                self.stream().alloc::<f32>(rows * width)?,
            )
        };
        let f = self.function(Program::Elementwise, "topk_parts_f32")?;
        let cfg = LaunchConfig {
            grid_dim: (parts as u32, rows as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let (ld_i, cols_i, per_i, k_i, parts_i) =
            (ld as i64, cols as i32, per as i32, k as i32, parts as i32);
        let mut b = self.stream().launch_builder(&f);
        b.arg(x)
            .arg(&ld_i)
            .arg(&cols_i)
            .arg(&per_i)
            .arg(&k_i)
            .arg(&mut part);
        // SAFETY: matches topk_parts_f32(x, ld, cols, per, k, out): x holds rows * ld floats
        // (checked), cols <= ld, per <= TOP_K_PER (the kernel's shared keys), k <= TOP_K_MAX,
        // part holds rows * parts * (1 + 2k) floats for the grid (parts, rows).
        unsafe { b.launch(cfg) }?;
        let f = self.function(Program::Elementwise, "topk_merge_f32")?;
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream().launch_builder(&f);
        b.arg(&part).arg(&parts_i).arg(&k_i).arg(&mut out);
        // SAFETY: matches topk_merge_f32(part, parts, k, out): part as written above, parts * k
        // <= TOP_K_MERGE_MAX (checked), out holds rows * (1 + 2k) floats for the grid rows.
        unsafe { b.launch(cfg) }?;
        let v = self.stream().clone_dtoh(&out)?;
        let lists: Vec<Vec<(u32, f32)>> = v
            .chunks(width)
            .map(|row| {
                if row[0] == 0.0 {
                    return Vec::new();
                }
                row[1..]
                    .chunks(2)
                    .map_while(|e| {
                        let c = e[1].to_bits() as i32;
                        (c >= 0).then_some((c as u32, e[0]))
                    })
                    .collect()
            })
            .collect();
        if let Some(t) = log {
            eprintln!(
                "top-k rows={rows} k={k}: {:.3} ms",
                t.elapsed().as_secs_f64() * 1e3
            );
        }
        Ok(lists)
    }
}
