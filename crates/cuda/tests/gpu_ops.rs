//! GPU layer ops against f64 CPU references on random inputs (odd sizes included): RMS norm,
//! RoPE in all four modes, SwiGLU, residual add, embedding rows of every weight format
//! (vs quant::dequantize_row), split-KV decode attention over f16 K/V (GQA).
//! Skipped (with a message) when no CUDA device is present.

use cuda::ops::{RopeMode, RopeParams};
use cuda::synthetic::{random_activations, random_matrix, Rng};
use cuda::{open_or_cpu, CudaDevice, CudaOptions};
use gguf::GgmlType;

fn device() -> Option<CudaDevice> {
    let d = open_or_cpu(&CudaOptions::default());
    if d.is_none() {
        eprintln!("skipped: no CUDA device");
    }
    d
}

fn max_abs_diff(a: &[f32], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(&x, &y)| {
            if x.is_nan() {
                f64::INFINITY
            } else {
                (x as f64 - y).abs()
            }
        })
        .fold(0.0, f64::max)
}

#[test]
fn rms_norm_swiglu_add() {
    let Some(dev) = device() else { return };
    let s = dev.stream();
    for (rows, d) in [(1usize, 7usize), (3, 4096), (5, 5120), (2, 1000)] {
        let x = random_activations(rows * d, d as u64);
        let w = random_activations(d, 99);
        let xd = s.clone_htod(&x).unwrap();
        let wd = s.clone_htod(&w).unwrap();
        let mut yd = s.clone_htod(&vec![f32::NAN; rows * d]).unwrap();
        dev.rms_norm(&xd, &wd, &mut yd, rows, d, 1e-6).unwrap();
        let y = s.clone_dtoh(&yd).unwrap();
        let mut want = vec![0f64; rows * d];
        for r in 0..rows {
            let xr = &x[r * d..(r + 1) * d];
            let ms = xr.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / d as f64;
            let sc = 1.0 / (ms + 1e-6).sqrt();
            for i in 0..d {
                want[r * d + i] = xr[i] as f64 * sc * w[i] as f64;
            }
        }
        let err = max_abs_diff(&y, &want);
        assert!(err < 1e-4, "rms_norm {rows}x{d}: max err {err}");
    }
    let n = 1_000_003;
    let g = random_activations(n, 1);
    let u = random_activations(n, 2);
    let (gd, ud) = (s.clone_htod(&g).unwrap(), s.clone_htod(&u).unwrap());
    let mut yd = s.clone_htod(&vec![f32::NAN; n]).unwrap();
    dev.swiglu(&gd, &ud, &mut yd, n).unwrap();
    let y = s.clone_dtoh(&yd).unwrap();
    let want: Vec<f64> = g
        .iter()
        .zip(&u)
        .map(|(&g, &u)| g as f64 / (1.0 + (-(g as f64)).exp()) * u as f64)
        .collect();
    let err = max_abs_diff(&y, &want);
    assert!(err < 1e-5, "swiglu max err {err}");
    let mut acc = s.clone_htod(&g).unwrap();
    dev.add_assign(&mut acc, &ud, n).unwrap();
    let y = s.clone_dtoh(&acc).unwrap();
    let want: Vec<f64> = g
        .iter()
        .zip(&u)
        .map(|(&a, &b)| a as f64 + b as f64)
        .collect();
    assert!(max_abs_diff(&y, &want) < 1e-6);
}

/// ggml rope semantics in f64: returns the rotated x [n_tokens, n_heads, head_dim].
fn rope_ref(x: &[f32], pos: &[i32], nt: usize, nh: usize, hd: usize, p: &RopeParams) -> Vec<f64> {
    let mut y: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    for t in 0..nt {
        for h in 0..nh {
            let base = (t * nh + h) * hd;
            for i in 0..p.n_dims / 2 {
                let which = match p.mode {
                    RopeMode::Normal | RopeMode::Neox => 0,
                    RopeMode::Multi { sections: s } => {
                        let sector = i as i32 % s.iter().sum::<i32>();
                        if sector < s[0] {
                            0
                        } else if sector < s[0] + s[1] {
                            1
                        } else if sector < s[0] + s[1] + s[2] {
                            2
                        } else {
                            3
                        }
                    }
                    RopeMode::Interleaved { sections: s } => {
                        let sector = i as i32 % s.iter().sum::<i32>();
                        if sector % 3 == 1 && sector < 3 * s[1] {
                            1
                        } else if sector % 3 == 2 && sector < 3 * s[2] {
                            2
                        } else if sector % 3 == 0 && sector < 3 * s[0] {
                            0
                        } else {
                            3
                        }
                    }
                };
                let pp = pos[which * nt + t] as f64;
                let theta = pp
                    * (p.freq_base as f64).powf(-2.0 * i as f64 / p.n_dims as f64)
                    * p.freq_scale as f64;
                let (a, b) = if p.mode == RopeMode::Normal {
                    (2 * i, 2 * i + 1)
                } else {
                    (i, i + p.n_dims / 2)
                };
                let (x0, x1) = (x[base + a] as f64, x[base + b] as f64);
                y[base + a] = x0 * theta.cos() - x1 * theta.sin();
                y[base + b] = x0 * theta.sin() + x1 * theta.cos();
            }
        }
    }
    y
}

#[test]
fn rope_all_modes() {
    let Some(dev) = device() else { return };
    let s = dev.stream();
    let (nt, nh) = (5usize, 3usize);
    let modes = [
        RopeMode::Normal,
        RopeMode::Neox,
        RopeMode::Multi {
            sections: [16, 24, 24, 0],
        },
        RopeMode::Interleaved {
            sections: [24, 20, 20, 0],
        },
    ];
    let mut rng = Rng::new(5);
    for mode in modes {
        for (hd, n_dims, base, scale) in [
            (128usize, 128usize, 1e6f32, 1.0f32),
            (128, 64, 1e4, 0.5),
            (64, 64, 1e4, 1.0),
        ] {
            let p = RopeParams {
                n_dims,
                freq_base: base,
                freq_scale: scale,
                mode,
            };
            let x = random_activations(nt * nh * hd, hd as u64 + n_dims as u64);
            let pos: Vec<i32> = (0..4 * nt)
                .map(|_| (rng.next_u64() % 4096) as i32)
                .collect();
            let mut xd = s.clone_htod(&x).unwrap();
            let posd = s.clone_htod(&pos).unwrap();
            dev.rope(&mut xd, &posd, nt, nh, hd, &p).unwrap();
            let y = s.clone_dtoh(&xd).unwrap();
            let want = rope_ref(&x, &pos, nt, nh, hd, &p);
            // f32 angle p*theta (<= 4096 rad) carries ~4096 * 2^-24 rad of rounding per step
            let err = max_abs_diff(&y, &want);
            assert!(
                err < 8e-3,
                "rope {mode:?} hd {hd} n_dims {n_dims}: max err {err}"
            );
        }
    }
}

#[test]
fn get_rows_every_format() {
    let Some(dev) = device() else { return };
    use GgmlType::*;
    for ty in [
        F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4NL, IQ4XS, Q2K, Q3K, Q4K, Q5K, Q6K,
    ] {
        let (vocab, d) = (37usize, 512usize);
        let bytes = random_matrix(ty, vocab, d, 11);
        let table = dev.upload_matrix(ty, vocab, d, &bytes).unwrap();
        let ids = [0u32, 36, 5, 5, 17];
        let mut yd = dev
            .stream()
            .clone_htod(&vec![f32::NAN; ids.len() * d])
            .unwrap();
        dev.get_rows(&table, &ids, &mut yd).unwrap();
        let y = dev.stream().clone_dtoh(&yd).unwrap();
        let rb = bytes.len() / vocab;
        for (t, &id) in ids.iter().enumerate() {
            let mut want = vec![0f32; d];
            quant::dequantize_row(
                ty,
                &bytes[id as usize * rb..(id as usize + 1) * rb],
                &mut want,
            )
            .unwrap();
            let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
            let want64: Vec<f64> = want.iter().map(|&v| v as f64).collect();
            let err = max_abs_diff(&y[t * d..(t + 1) * d], &want64);
            assert!(
                err <= 1e-6 * scale + 1e-12,
                "get_rows {} id {id}: max err {err} (scale {scale})",
                ty.name()
            );
        }
        assert!(
            dev.get_rows(&table, &[37], &mut yd).is_err(),
            "out-of-range id must be rejected"
        );
    }
}

fn f16_bits(x: f32) -> u16 {
    u16::from_le_bytes(quant::blocks::to_f16_le(x))
}

#[test]
fn attention_decode_matches_softmax_reference() {
    let Some(dev) = device() else { return };
    let s = dev.stream();
    for (n_kv, nh, nkv, hd) in [
        (1usize, 8usize, 2usize, 128usize),
        (7, 4, 4, 64),
        (300, 8, 2, 128),
        (1000, 16, 4, 256),
        (4097, 2, 1, 32),
    ] {
        let q = random_activations(nh * hd, n_kv as u64);
        let kf = random_activations(n_kv * nkv * hd, 3 + n_kv as u64);
        let vf = random_activations(n_kv * nkv * hd, 4 + n_kv as u64);
        let k: Vec<u16> = kf.iter().map(|&v| f16_bits(v)).collect();
        let v: Vec<u16> = vf.iter().map(|&v| f16_bits(v)).collect();
        let kd: Vec<f64> = k
            .iter()
            .map(|&b| quant::blocks::f16_le(b.to_le_bytes()) as f64)
            .collect();
        let vd: Vec<f64> = v
            .iter()
            .map(|&b| quant::blocks::f16_le(b.to_le_bytes()) as f64)
            .collect();
        let scale = 1.0 / (hd as f32).sqrt();
        let (qd_, kd_, vd_) = (
            s.clone_htod(&q).unwrap(),
            s.clone_htod(&k).unwrap(),
            s.clone_htod(&v).unwrap(),
        );
        let mut out = s.clone_htod(&vec![f32::NAN; nh * hd]).unwrap();
        let mut scratch = dev.attention_scratch(nh, n_kv, hd).unwrap();
        dev.attention_decode(
            &qd_,
            &kd_,
            &vd_,
            n_kv,
            nh,
            nkv,
            hd,
            scale,
            &mut out,
            &mut scratch,
        )
        .unwrap();
        let got = s.clone_dtoh(&out).unwrap();
        let mut want = vec![0f64; nh * hd];
        for h in 0..nh {
            let g = h / (nh / nkv);
            let scores: Vec<f64> = (0..n_kv)
                .map(|p| {
                    (0..hd)
                        .map(|i| q[h * hd + i] as f64 * kd[(p * nkv + g) * hd + i])
                        .sum::<f64>()
                        * scale as f64
                })
                .collect();
            let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
            let z: f64 = e.iter().sum();
            for i in 0..hd {
                want[h * hd + i] = (0..n_kv)
                    .map(|p| e[p] * vd[(p * nkv + g) * hd + i])
                    .sum::<f64>()
                    / z;
            }
        }
        let err = max_abs_diff(&got, &want);
        assert!(
            err < 2e-5,
            "attention n_kv {n_kv} heads {nh}/{nkv} hd {hd}: max err {err}"
        );
    }
}
