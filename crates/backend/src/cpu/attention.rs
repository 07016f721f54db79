//! Causal attention over a per-sequence KV cache stored as f32, f16, q8_0 or q4_0 rows.
//!
//! Cache layout, per sequence and layer: K `[n_kv_head][n_ctx][row_k]`, V likewise, each row
//! one head at one position in the cache's element type (q8_0/q4_0 use the quant crate's row
//! quantizer). Positions past the sequence length hold stale data and are never read, so
//! truncating a sequence costs nothing.

use half::slice::HalfFloatSliceExt;
use quant::vmath;
use rayon::prelude::*;

use super::{check_shape, shape_err, CpuTensor};
use crate::{AttentionParams, BackendError, KvType, Row};

/// K and V of one layer for one sequence.
#[derive(Debug, Clone)]
pub struct CpuKvCache {
    kv_type: KvType,
    n_ctx: usize,
    n_kv_head: usize,
    head_dim_k: usize,
    head_dim_v: usize,
    row_bytes_k: usize,
    row_bytes_v: usize,
    k: Vec<u8>,
    v: Vec<u8>,
}

fn alloc(what: &'static str, bytes: usize) -> Result<Vec<u8>, BackendError> {
    let mut v = Vec::new();
    v.try_reserve_exact(bytes)
        .map_err(|_| BackendError::Alloc {
            what,
            bytes: bytes as u128,
        })?;
    v.resize(bytes, 0);
    Ok(v)
}

impl CpuKvCache {
    pub fn new(
        n_ctx: usize,
        n_kv_head: usize,
        head_dim_k: usize,
        head_dim_v: usize,
        kv_type: KvType,
    ) -> Result<CpuKvCache, BackendError> {
        let block = kv_type.ggml_type().block_size();
        let row = |hd: usize| {
            kv_type.row_bytes(hd).ok_or(BackendError::KvHeadDim {
                kv_type,
                head_dim: hd,
                block,
            })
        };
        let row_bytes_k = row(head_dim_k)?;
        let row_bytes_v = row(head_dim_v)?;
        let total = |rb: usize| -> Result<usize, BackendError> {
            n_ctx
                .checked_mul(n_kv_head)
                .and_then(|x| x.checked_mul(rb))
                .ok_or(BackendError::Alloc {
                    what: "KV cache",
                    bytes: u128::MAX,
                })
        };
        Ok(CpuKvCache {
            kv_type,
            n_ctx,
            n_kv_head,
            head_dim_k,
            head_dim_v,
            row_bytes_k,
            row_bytes_v,
            k: alloc("KV cache (K)", total(row_bytes_k)?)?,
            v: alloc("KV cache (V)", total(row_bytes_v)?)?,
        })
    }

    pub fn bytes(&self) -> usize {
        self.k.len() + self.v.len()
    }

    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    fn offset(&self, head: usize, pos: usize, row_bytes: usize) -> usize {
        (head * self.n_ctx + pos) * row_bytes
    }

    /// Stores `k` (`[n_kv_head * head_dim_k]`) and `v` of one position.
    fn store(&mut self, pos: usize, k: &[f32], v: &[f32]) -> Result<(), BackendError> {
        if pos >= self.n_ctx {
            return Err(BackendError::PositionOutOfRange {
                pos,
                n_ctx: self.n_ctx,
            });
        }
        for h in 0..self.n_kv_head {
            let o = self.offset(h, pos, self.row_bytes_k);
            encode(
                self.kv_type,
                &k[h * self.head_dim_k..(h + 1) * self.head_dim_k],
                &mut self.k[o..o + self.row_bytes_k],
            )?;
            let o = self.offset(h, pos, self.row_bytes_v);
            encode(
                self.kv_type,
                &v[h * self.head_dim_v..(h + 1) * self.head_dim_v],
                &mut self.v[o..o + self.row_bytes_v],
            )?;
        }
        Ok(())
    }

    /// Decodes K (`which_v == false`) or V rows of `head` at positions `0..n` into `dst`
    /// (`[n][head_dim]`).
    fn load(
        &self,
        head: usize,
        n: usize,
        which_v: bool,
        dst: &mut [f32],
    ) -> Result<(), BackendError> {
        let (data, rb, hd) = if which_v {
            (&self.v, self.row_bytes_v, self.head_dim_v)
        } else {
            (&self.k, self.row_bytes_k, self.head_dim_k)
        };
        let start = self.offset(head, 0, rb);
        if matches!(self.kv_type, KvType::F16 | KvType::F32) {
            // A head's positions are contiguous rows of plain values: one conversion for all
            // of them (at depth 1024 the per-row calls were ~3 % of a decode token).
            return decode(
                self.kv_type,
                &data[start..start + n * rb],
                &mut dst[..n * hd],
            );
        }
        for p in 0..n {
            decode(
                self.kv_type,
                &data[start + p * rb..start + (p + 1) * rb],
                &mut dst[p * hd..(p + 1) * hd],
            )?;
        }
        Ok(())
    }
}

fn encode(ty: KvType, src: &[f32], dst: &mut [u8]) -> Result<(), BackendError> {
    match ty {
        KvType::F32 => {
            for (d, s) in dst.chunks_exact_mut(4).zip(src) {
                d.copy_from_slice(&s.to_le_bytes());
            }
            Ok(())
        }
        KvType::F16 => {
            // SAFETY: f16 is a 2-byte plain-old-data type (every bit pattern is a valid value);
            // align_to_mut only reinterprets the aligned middle part.
            let (pre, mid, _) = unsafe { dst.align_to_mut::<half::f16>() };
            if pre.is_empty() && mid.len() == src.len() {
                // SIMD (F16C) conversion where the CPU has it.
                mid.convert_from_f32_slice(src);
            } else {
                for (d, s) in dst.chunks_exact_mut(2).zip(src) {
                    d.copy_from_slice(&half::f16::from_f32(*s).to_bits().to_le_bytes());
                }
            }
            Ok(())
        }
        KvType::Q8_0 | KvType::Q4_0 => quant::quantize_row(ty.ggml_type(), src, dst)
            .map_err(|e| BackendError::Quant(e.to_string())),
    }
}

fn decode(ty: KvType, src: &[u8], dst: &mut [f32]) -> Result<(), BackendError> {
    match ty {
        KvType::F32 => {
            for (d, s) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *d = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
            }
            Ok(())
        }
        KvType::F16 => {
            // SAFETY: as in `encode`: f16 is plain old data, only the aligned middle is viewed.
            let (pre, mid, _) = unsafe { src.align_to::<half::f16>() };
            if pre.is_empty() && mid.len() == dst.len() {
                mid.convert_to_f32_slice(dst);
            } else {
                for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
                    *d = half::f16::from_bits(u16::from_le_bytes([s[0], s[1]])).to_f32();
                }
            }
            Ok(())
        }
        KvType::Q8_0 | KvType::Q4_0 => quant::dequantize_row(ty.ggml_type(), src, dst)
            .map_err(|e| BackendError::Quant(e.to_string())),
    }
}

fn check_cache(c: &CpuKvCache, p: &AttentionParams) -> Result<(), BackendError> {
    if c.n_kv_head != p.n_kv_head || c.head_dim_k != p.head_dim_k || c.head_dim_v != p.head_dim_v {
        return Err(shape_err(
            "attention",
            format!(
                "cache has {} heads of {}/{}, params {p:?}",
                c.n_kv_head, c.head_dim_k, c.head_dim_v
            ),
        ));
    }
    Ok(())
}

/// See [`crate::Backend::attention`]. The (row block, KV head) tasks run on `team` when
/// given (decode: the caller and its spinning helpers, no rayon hand-off), else on the
/// current rayon pool.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    q: &CpuTensor,
    k: &CpuTensor,
    v: &CpuTensor,
    rows: &[Row],
    caches: &mut [&mut CpuKvCache],
    p: &AttentionParams,
    out: &mut CpuTensor,
    team: Option<&quant::Team>,
) -> Result<(), BackendError> {
    let n = rows.len();
    if p.n_kv_head == 0 || !p.n_head.is_multiple_of(p.n_kv_head) {
        return Err(shape_err(
            "attention",
            format!("{} heads over {} KV heads", p.n_head, p.n_kv_head),
        ));
    }
    check_shape("attention", q, n, p.n_head * p.head_dim_k)?;
    check_shape("attention", k, n, p.n_kv_head * p.head_dim_k)?;
    check_shape("attention", v, n, p.n_kv_head * p.head_dim_v)?;
    check_shape("attention", out, n, p.n_head * p.head_dim_v)?;
    let n_seqs = caches.len();
    for (r, row) in rows.iter().enumerate() {
        let c = caches.get_mut(row.seq).ok_or(BackendError::BadSequence {
            seq: row.seq,
            n_seqs,
        })?;
        check_cache(c, p)?;
        c.store(row.pos, k.row(r), v.row(r))?;
    }
    let caches: Vec<&CpuKvCache> = caches.iter().map(|c| &**c).collect();
    let group = p.n_head / p.n_kv_head;
    let hv = p.head_dim_v;
    // Tasks: (block of up to ROW_BLOCK consecutive rows of one sequence, KV head). Each task
    // decodes its KV rows once for the whole block, then serves every query head of the group.
    let mut tasks = Vec::new();
    let mut r0 = 0;
    while r0 < n {
        let mut r1 = r0 + 1;
        while r1 < n && r1 - r0 < ROW_BLOCK && rows[r1].seq == rows[r0].seq {
            r1 += 1;
        }
        tasks.extend((0..p.n_kv_head).map(|kvh| (r0, r1, kvh)));
        r0 = r1;
    }
    let task = |&(r0, r1, kvh): &(usize, usize, usize)| {
        attend_block(q, &rows[r0..r1], r0, caches[rows[r0].seq], kvh, p)
    };
    let results: Vec<Vec<f32>> = match team {
        Some(team) => team
            .map(tasks.len(), |i| task(&tasks[i]))
            .into_iter()
            .collect::<Result<_, _>>()?,
        None => tasks.par_iter().map(task).collect::<Result<_, _>>()?,
    };
    // Scatter: task output is [rows][group * hv]; the group's heads are adjacent in `out`.
    for (&(r0, r1, kvh), res) in tasks.iter().zip(&results) {
        for (i, r) in (r0..r1).enumerate() {
            let dst = &mut out.data[r * p.n_head * hv + kvh * group * hv..][..group * hv];
            dst.copy_from_slice(&res[i * group * hv..(i + 1) * group * hv]);
        }
    }
    Ok(())
}

/// Most rows of one sequence handled by one attention task.
const ROW_BLOCK: usize = 32;

/// Attention of `block` (rows `r0..` of q, one sequence) for the query heads of KV head `kvh`.
/// Returns `[block.len()][group * head_dim_v]`.
fn attend_block(
    q: &CpuTensor,
    block: &[Row],
    r0: usize,
    cache: &CpuKvCache,
    kvh: usize,
    p: &AttentionParams,
) -> Result<Vec<f32>, BackendError> {
    let (hk, hv) = (p.head_dim_k, p.head_dim_v);
    let len = block.iter().map(|r| r.pos).max().unwrap_or(0) + 1;
    // Decoded K and V rows in this thread's scratch buffers: at depth 1024 a fresh pair was
    // 1 MB allocated and zeroed per task (2 % of a decode token's samples), then overwritten.
    thread_local! {
        static SCRATCH: std::cell::RefCell<(Vec<f32>, Vec<f32>, Vec<f32>)> =
            const { std::cell::RefCell::new((Vec::new(), Vec::new(), Vec::new())) };
    }
    SCRATCH.with_borrow_mut(|(keys, vals, scores)| {
        for (buf, n) in [
            (&mut *keys, len * hk),
            (&mut *vals, len * hv),
            (&mut *scores, len * (p.n_head / p.n_kv_head)),
        ] {
            if buf.len() < n {
                buf.resize(n, 0.0);
            }
        }
        cache.load(kvh, len, false, &mut keys[..len * hk])?;
        cache.load(kvh, len, true, &mut vals[..len * hv])?;
        Ok(attend_rows(q, block, r0, keys, vals, scores, kvh, p))
    })
}

/// [`attend_block`]'s rows over the decoded keys and values of KV head `kvh`.
#[allow(clippy::too_many_arguments)]
fn attend_rows(
    q: &CpuTensor,
    block: &[Row],
    r0: usize,
    keys: &[f32],
    vals: &[f32],
    scores: &mut [f32],
    kvh: usize,
    p: &AttentionParams,
) -> Vec<f32> {
    let group = p.n_head / p.n_kv_head;
    let (hk, hv) = (p.head_dim_k, p.head_dim_v);
    let mut out = vec![0.0f32; block.len() * group * hv];
    for (i, row) in block.iter().enumerate() {
        let n_keys = row.pos + 1;
        // The group's probabilities, head after head ([group][n_keys]); each loop is one
        // vector pass over the keys (`quant::vmath`: no call per key, exp in 8 lanes).
        let probs = &mut scores[..group * n_keys];
        for (j, sc) in probs.chunks_exact_mut(n_keys).enumerate() {
            let h = kvh * group + j;
            let qh = &q.row(r0 + i)[h * hk..(h + 1) * hk];
            vmath::scaled_dots(qh, &keys[..n_keys * hk], p.scale, sc);
            let max = sc.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
            let sum = vmath::exp_shifted(sc, max);
            let inv = 1.0 / sum;
            sc.iter_mut().for_each(|s| *s *= inv);
        }
        // Then every head of the group in one pass over the value rows.
        let oh = &mut out[i * group * hv..(i + 1) * group * hv];
        vmath::weighted_sum_heads(group, probs, &vals[..n_keys * hv], oh);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    /// Naive attention for one sequence given all K/V up front, in f64.
    #[allow(clippy::too_many_arguments)]
    fn naive(q: &[f32], k: &[f32], v: &[f32], n: usize, p: &AttentionParams) -> Vec<f32> {
        let (hk, hv) = (p.head_dim_k, p.head_dim_v);
        let group = p.n_head / p.n_kv_head;
        let mut out = vec![0.0f32; n * p.n_head * hv];
        for t in 0..n {
            for h in 0..p.n_head {
                let kvh = h / group;
                let qh = &q[t * p.n_head * hk + h * hk..][..hk];
                let s: Vec<f64> = (0..=t)
                    .map(|u| {
                        let kr = &k[u * p.n_kv_head * hk + kvh * hk..][..hk];
                        qh.iter()
                            .zip(kr)
                            .map(|(a, b)| *a as f64 * *b as f64)
                            .sum::<f64>()
                            * p.scale as f64
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for d in 0..hv {
                    let acc: f64 = (0..=t)
                        .map(|u| e[u] / z * v[u * p.n_kv_head * hv + kvh * hv + d] as f64)
                        .sum();
                    out[t * p.n_head * hv + h * hv + d] = acc as f32;
                }
            }
        }
        out
    }

    #[test]
    fn matches_naive_across_split_batches_and_kv_types() {
        let p = AttentionParams {
            n_head: 6,
            n_kv_head: 2,
            head_dim_k: 32,
            head_dim_v: 64,
            scale: 0.2,
        };
        let n = 11;
        let mut seed = 7u64;
        let mut gen = |len: usize| (0..len).map(|_| lcg(&mut seed)).collect::<Vec<f32>>();
        let q = gen(n * 6 * 32);
        let k = gen(n * 2 * 32);
        let v = gen(n * 2 * 64);
        let want = naive(&q, &k, &v, n, &p);
        // the decode rows also on a 2-thread team (the backend's path for one token)
        let team = quant::Team::new(2);
        for (ty, tol, team) in [
            (KvType::F32, 1e-5, None),
            (KvType::F16, 2e-3, None),
            (KvType::Q8_0, 2e-2, None),
            (KvType::Q4_0, 0.15, None),
            (KvType::F32, 1e-5, Some(&team)),
            (KvType::F16, 2e-3, Some(&team)),
            (KvType::Q8_0, 2e-2, Some(&team)),
        ] {
            let mut cache = CpuKvCache::new(16, 2, 32, 64, ty).unwrap();
            let mut got = Vec::new();
            // prefill 7 rows, then decode 4 one at a time
            for (a, b) in [(0, 7), (7, 8), (8, 9), (9, 10), (10, 11)] {
                let m = b - a;
                let t = |d: &[f32], w: usize| {
                    CpuTensor::from_vec(m, w, d[a * w..b * w].to_vec()).unwrap()
                };
                let rows: Vec<Row> = (a..b).map(|pos| Row { seq: 0, pos }).collect();
                let mut out = CpuTensor::zeros(m, 6 * 64);
                attention(
                    &t(&q, 192),
                    &t(&k, 64),
                    &t(&v, 128),
                    &rows,
                    &mut [&mut cache],
                    &p,
                    &mut out,
                    team,
                )
                .unwrap();
                got.extend(out.data);
            }
            let err = got
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            assert!(
                err < tol,
                "{ty} (team: {}): max error {err}",
                team.is_some()
            );
        }
    }

    #[test]
    fn position_past_context_is_an_error() {
        let p = AttentionParams {
            n_head: 1,
            n_kv_head: 1,
            head_dim_k: 32,
            head_dim_v: 32,
            scale: 1.0,
        };
        let mut cache = CpuKvCache::new(2, 1, 32, 32, KvType::F16).unwrap();
        let x = CpuTensor::zeros(1, 32);
        let mut out = CpuTensor::zeros(1, 32);
        let r = attention(
            &x,
            &x,
            &x,
            &[Row { seq: 0, pos: 2 }],
            &mut [&mut cache],
            &p,
            &mut out,
            None,
        );
        assert!(matches!(
            r,
            Err(BackendError::PositionOutOfRange { pos: 2, n_ctx: 2 })
        ));
    }

    #[test]
    fn odd_head_dim_rejected_for_block_types() {
        assert!(CpuKvCache::new(4, 1, 40, 40, KvType::Q8_0).is_err());
        assert!(CpuKvCache::new(4, 1, 40, 40, KvType::F16).is_ok());
    }
}
