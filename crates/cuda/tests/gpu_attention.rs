//! The attention kernels of crates/cuda/src/attention.rs (kernels/flash_attn.cu) through
//! `CudaBackend::attention`, against the CPU backend's attention on the same random inputs:
//! GQA ratios 1/4/5/8, head sizes 64/128/256 (and 32/96 and K != V sizes, which only the
//! decode kernel takes), odd lengths, depths up to 5000, batches mixing prefill chunks and
//! decode rows of several sequences in any row order, every KV type, and decode steps inside
//! `begin_step`/`end_step` (splits from n_ctx, partials from the step arena). Both backends
//! hold the same quantized cache, so the difference is the kernels' arithmetic: f32 scores on
//! the decode path, f16 Q/K/V/P with f32 accumulation on the tensor-core prefill path.
//! Skipped (with a message) when no CUDA device is present.

use backend::cpu::CpuBackend;
use backend::{AttentionParams, Backend, KvType, Row};
use cuda::backend::CudaBackend;
use cuda::CudaOptions;

fn gpu() -> Option<CudaBackend> {
    match CudaBackend::new(&CudaOptions::default()) {
        Ok(b) => {
            cuda::attention::set_enabled(true);
            Some(b)
        }
        Err(e) => {
            eprintln!("skipped: no CUDA device ({e})");
            None
        }
    }
}

struct Lcg(u64);

impl Lcg {
    /// Uniform in [-1, 1).
    fn next(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    fn vec(&mut self, n: usize, amp: f32) -> Vec<f32> {
        (0..n).map(|_| self.next() * amp).collect()
    }
}

/// Largest difference the kernels may show against the CPU over the same cache.
fn tolerance(kv: KvType) -> f32 {
    match kv {
        KvType::F32 => 1e-4,
        _ => 4e-3,
    }
}

fn params(n_head: usize, n_kv_head: usize, dk: usize, dv: usize) -> AttentionParams {
    AttentionParams {
        n_head,
        n_kv_head,
        head_dim_k: dk,
        head_dim_v: dv,
        scale: 1.0 / (dk as f32).sqrt(),
    }
}

/// Both backends with `n_seqs` caches of `n_ctx` positions.
struct Pair<'a> {
    gpu: &'a CudaBackend,
    cpu: &'a CpuBackend,
    gc: Vec<<CudaBackend as Backend>::KvCache>,
    cc: Vec<<CpuBackend as Backend>::KvCache>,
    p: AttentionParams,
    kv: KvType,
    rng: Lcg,
    worst: f32,
}

impl<'a> Pair<'a> {
    fn new(
        gpu: &'a CudaBackend,
        cpu: &'a CpuBackend,
        p: AttentionParams,
        kv: KvType,
        n_ctx: usize,
        n_seqs: usize,
    ) -> Pair<'a> {
        let (h, dk, dv) = (p.n_kv_head, p.head_dim_k, p.head_dim_v);
        Pair {
            gpu,
            cpu,
            gc: (0..n_seqs)
                .map(|_| gpu.new_kv_cache(n_ctx, h, dk, dv, kv).unwrap())
                .collect(),
            cc: (0..n_seqs)
                .map(|_| cpu.new_kv_cache(n_ctx, h, dk, dv, kv).unwrap())
                .collect(),
            p,
            kv,
            rng: Lcg(0x5eed ^ (n_ctx as u64) ^ ((dk as u64) << 20)),
            worst: 0.0,
        }
    }

    /// One attention call with random q/k/v over `rows` on both backends; returns the
    /// largest difference and checks it.
    fn call(&mut self, rows: &[Row], what: &str) -> f32 {
        self.call_in_step(rows, what, None)
    }

    fn call_in_step(&mut self, rows: &[Row], what: &str, step_key: Option<u64>) -> f32 {
        let p = self.p;
        let n = rows.len();
        let qw = p.n_head * p.head_dim_k;
        let kw = p.n_kv_head * p.head_dim_k;
        let vw = p.n_kv_head * p.head_dim_v;
        let ow = p.n_head * p.head_dim_v;
        // q larger than k so some score rows are sharp
        let q = self.rng.vec(n * qw, 2.0);
        let k = self.rng.vec(n * kw, 1.0);
        let v = self.rng.vec(n * vw, 1.0);

        let (cq, ck, cv) = (
            self.cpu.upload(&q, n, qw).unwrap(),
            self.cpu.upload(&k, n, kw).unwrap(),
            self.cpu.upload(&v, n, vw).unwrap(),
        );
        let mut co = self.cpu.zeros(n, ow);
        let mut cc: Vec<_> = self.cc.iter_mut().collect();
        self.cpu
            .attention(&cq, &ck, &cv, rows, &mut cc, &p, &mut co)
            .unwrap();
        let want = self.cpu.download(&co);

        if let Some(key) = step_key {
            self.gpu.begin_step(key);
        }
        let (gq, gk, gv) = (
            self.gpu.upload(&q, n, qw).unwrap(),
            self.gpu.upload(&k, n, kw).unwrap(),
            self.gpu.upload(&v, n, vw).unwrap(),
        );
        let mut go = self.gpu.zeros(n, ow);
        let mut gc: Vec<_> = self.gc.iter_mut().collect();
        self.gpu
            .attention(&gq, &gk, &gv, rows, &mut gc, &p, &mut go)
            .unwrap();
        if step_key.is_some() {
            self.gpu.end_step().unwrap();
        }
        let got = self.gpu.download(&go);

        let err = got
            .iter()
            .zip(&want)
            .map(|(a, b)| {
                if a.is_finite() {
                    (a - b).abs()
                } else {
                    f32::INFINITY
                }
            })
            .fold(0.0f32, f32::max);
        let tol = tolerance(self.kv);
        assert!(
            err <= tol,
            "{what}: {:?} {}: max |gpu - cpu| {err:.3e} > {tol:.0e}",
            self.p,
            self.kv
        );
        self.worst = self.worst.max(err);
        err
    }

    fn report(&self, what: &str) {
        eprintln!("{what} {}: worst |gpu - cpu| {:.3e}", self.kv, self.worst);
    }
}

fn run(seq: usize, a: usize, b: usize) -> Vec<Row> {
    (a..b).map(|pos| Row { seq, pos }).collect()
}

/// One sequence: prefill chunks `chunks` (consecutive positions), then `decode` single rows.
fn one_sequence(
    g: &CudaBackend,
    c: &CpuBackend,
    p: AttentionParams,
    kv: KvType,
    chunks: &[usize],
    decode: usize,
) {
    let total: usize = chunks.iter().sum::<usize>() + decode;
    let mut pair = Pair::new(g, c, p, kv, total + 3, 1);
    let mut at = 0;
    for &n in chunks {
        pair.call(&run(0, at, at + n), &format!("prefill {at}..{}", at + n));
        at += n;
    }
    for _ in 0..decode {
        pair.call(&run(0, at, at + 1), &format!("decode at {at}"));
        at += 1;
    }
    pair.report(&format!(
        "{}/{} heads, {}/{} dims, chunks {chunks:?} + {decode}",
        p.n_head, p.n_kv_head, p.head_dim_k, p.head_dim_v
    ));
}

const ALL_KV: [KvType; 4] = [KvType::F32, KvType::F16, KvType::Q8_0, KvType::Q4_0];

#[test]
fn gqa_1_head_64() {
    let Some(g) = gpu() else { return };
    let c = CpuBackend::new(4).unwrap();
    for kv in ALL_KV {
        one_sequence(&g, &c, params(4, 4, 64, 64), kv, &[37, 1, 9, 64, 65], 3);
    }
}

#[test]
fn gqa_4_head_128() {
    let Some(g) = gpu() else { return };
    let c = CpuBackend::new(4).unwrap();
    for kv in ALL_KV {
        one_sequence(&g, &c, params(8, 2, 128, 128), kv, &[203, 8, 7, 33], 2);
    }
}

#[test]
fn gqa_5_head_128_qwen32b_group() {
    let Some(g) = gpu() else { return };
    let c = CpuBackend::new(4).unwrap();
    for kv in ALL_KV {
        one_sequence(&g, &c, params(10, 2, 128, 128), kv, &[517, 100], 3);
    }
}

#[test]
fn gqa_8_head_256() {
    let Some(g) = gpu() else { return };
    let c = CpuBackend::new(4).unwrap();
    for kv in ALL_KV {
        one_sequence(&g, &c, params(16, 2, 256, 256), kv, &[130, 31], 2);
    }
}

#[test]
fn head_sizes_only_the_decode_kernel_takes() {
    let Some(g) = gpu() else { return };
    let c = CpuBackend::new(4).unwrap();
    // K and V of different sizes; 96 (no prefill kernel); 32
    for kv in [KvType::F32, KvType::F16, KvType::Q8_0] {
        one_sequence(&g, &c, params(6, 2, 32, 64), kv, &[21, 9], 2);
        one_sequence(&g, &c, params(6, 3, 96, 96), kv, &[45, 16], 2);
    }
    // 40 (not a multiple of 8): the older kernel
    one_sequence(&g, &c, params(4, 2, 40, 40), KvType::F16, &[19, 8], 2);
}

#[test]
fn deep_contexts() {
    let Some(g) = gpu() else { return };
    let c = CpuBackend::new(16).unwrap();
    // 5000 positions, GQA 2, head 64
    one_sequence(
        &g,
        &c,
        params(2, 1, 64, 64),
        KvType::F16,
        &[1000, 1000, 1000, 1000, 999],
        3,
    );
    // 4100 positions, the 32B group (5 heads per KV head), q8_0 and q4_0
    for kv in [KvType::Q8_0, KvType::Q4_0] {
        one_sequence(&g, &c, params(5, 1, 128, 128), kv, &[2048, 2051], 2);
    }
}

#[test]
fn mixed_batches_of_several_sequences() {
    let Some(g) = gpu() else { return };
    let c = CpuBackend::new(4).unwrap();
    for kv in ALL_KV {
        let mut pair = Pair::new(&g, &c, params(8, 2, 128, 128), kv, 300, 3);
        // warm-up: each sequence has some context
        pair.call(&run(0, 0, 10), "seq 0 first chunk");
        pair.call(&run(1, 0, 70), "seq 1 prompt");
        // one call: seq 1 decodes, seq 0 prefills 40 rows, seq 2 starts with 9 rows; the
        // sequences' rows interleave in the batch
        let mut rows = vec![Row { seq: 1, pos: 70 }];
        let s0 = run(0, 10, 50);
        let s2 = run(2, 0, 9);
        for i in 0..40 {
            rows.push(s0[i]);
            if i < 9 {
                rows.push(s2[i]);
            }
        }
        pair.call(&rows, "mixed prefill + decode");
        // decode rows of all three in one call, then seq 0's rows out of position order
        pair.call(
            &[
                Row { seq: 2, pos: 9 },
                Row { seq: 0, pos: 50 },
                Row { seq: 1, pos: 71 },
            ],
            "three decode rows",
        );
        // seqs 2 and 1 decode (one batched launch) while seq 0 prefills a chunk on its own
        let mut rows = vec![Row { seq: 2, pos: 10 }];
        rows.extend(run(0, 51, 71));
        rows.push(Row { seq: 1, pos: 72 });
        pair.call(&rows, "two decode rows beside a chunk");
        let mut back: Vec<Row> = run(0, 71, 100);
        back.reverse();
        back.push(Row { seq: 1, pos: 73 });
        pair.call(&back, "reversed chunk");
        pair.report("mixed batches");
    }
}

#[test]
fn decode_steps_split_by_n_ctx() {
    let Some(g) = gpu() else { return };
    g.set_graphs_enabled(false);
    let c = CpuBackend::new(4).unwrap();
    for kv in [KvType::F16, KvType::Q8_0, KvType::Q4_0] {
        // n_ctx 4096: inside a step the decode launch takes 64 splits, most of them empty
        let mut pair = Pair::new(&g, &c, params(10, 2, 128, 128), kv, 4096, 2);
        pair.call(&run(0, 0, 300), "prompt seq 0");
        pair.call(&run(1, 0, 5), "prompt seq 1");
        for t in 0..4 {
            let at = 300 + 2 * t;
            pair.call_in_step(&run(0, at, at + 1), "step seq 0", Some(7));
            pair.call_in_step(
                &[
                    Row {
                        seq: 0,
                        pos: at + 1,
                    },
                    Row { seq: 1, pos: 5 + t },
                ],
                "step two sequences",
                Some(8),
            );
        }
        pair.report("decode steps");
    }
}

#[test]
fn groups_wider_than_one_block() {
    let Some(g) = gpu() else { return };
    let c = CpuBackend::new(4).unwrap();
    // 12 query heads per KV head: the head-size decode kernel cuts them into blocks of 8 + 4
    for kv in [KvType::F16, KvType::Q4_0] {
        one_sequence(&g, &c, params(24, 2, 128, 128), kv, &[77, 9], 3);
    }
}

#[test]
fn generic_decode_kernel() {
    let Some(g) = gpu() else { return };
    let c = CpuBackend::new(4).unwrap();
    // The shapes the head-size kernels take, through the generic one (a process-wide switch:
    // a test running beside this one may take either kernel, both must pass).
    cuda::attention::set_generic_decode(true);
    for kv in [KvType::F16, KvType::Q8_0, KvType::Q4_0] {
        one_sequence(&g, &c, params(10, 2, 128, 128), kv, &[300], 3);
        one_sequence(&g, &c, params(16, 2, 256, 256), kv, &[40], 2);
        one_sequence(&g, &c, params(4, 4, 64, 64), kv, &[33], 2);
    }
    cuda::attention::set_generic_decode(false);
}

/// Decode rows of many sequences go to the device in one batched launch (one store, one
/// split-KV decode, one merge, each row reading its own sequence's cache through a table):
/// eight sequences of different lengths, one and two rows each, inside steps and eagerly, for
/// the 32B and 27B head shapes.
#[test]
fn decode_rows_of_many_sequences_in_one_launch() {
    let Some(g) = gpu() else { return };
    g.set_graphs_enabled(false);
    let c = CpuBackend::new(4).unwrap();
    for (p, kv) in [
        (params(10, 2, 128, 128), KvType::F16),
        (params(5, 1, 128, 128), KvType::Q8_0),
        (params(12, 2, 256, 256), KvType::F16),
        (params(6, 1, 256, 256), KvType::Q4_0),
        (params(4, 2, 64, 64), KvType::F32),
    ] {
        let mut pair = Pair::new(&g, &c, p, kv, 1024, 8);
        let lens: Vec<usize> = (0..8).map(|s| 1 + s * 97 % 700).collect();
        for (s, &n) in lens.iter().enumerate() {
            pair.call(&run(s, 0, n), "prompt");
        }
        for t in 0..3 {
            let at = |s: usize, d: usize| Row {
                seq: s,
                pos: lens[s] + 2 * t + d,
            };
            let step: Vec<Row> = (0..8).map(|s| at(s, 0)).collect();
            pair.call_in_step(&step, "step of eight sequences", Some(21));
            let five: Vec<Row> = (0..5).map(|s| at(s, 1)).collect();
            pair.call(&five, "eager, five sequences");
        }
        // two rows per sequence (verify passes of several streams), sequences interleaved
        let rows: Vec<Row> = [6, 7]
            .iter()
            .flat_map(|&d| {
                lens.iter()
                    .enumerate()
                    .map(move |(s, &n)| Row { seq: s, pos: n + d })
            })
            .collect();
        pair.call(&rows, "two rows per sequence");
        pair.report("eight sequences");
    }
}
