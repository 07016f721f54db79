//! Placement at load (`--fit`, `-ngl`): choose the context and the layers on the GPU together.
//!
//! `--fit on` (the default) wants every layer on the GPU. It starts from the context asked for
//! (or `min(n_ctx_train, 4096)` per slot) and halves it, down to a floor of
//! [`MIN_FIT_CTX_PER_SLOT`] per slot (or the asked context if smaller), until everything fits.
//! When nothing fits even at the floor it keeps the floor context and places as many layers as
//! fit (partial offload, which the caller announces with its predicted slowdown).
//! `--fit gpu-only` searches the same contexts but refuses instead of offloading. `-ngl N`
//! forces N layers (the output head counts as the first) at the asked context; a forced
//! placement larger than the card is refused rather than left to fail mid-load.

use super::{plan, plan_placement, GpuSpec, ModelMemory, Plan, PlanOptions, DEFAULT_CTX_PER_SLOT};

/// Smallest per-slot context `--fit on` reduces to before it offloads layers instead.
pub const MIN_FIT_CTX_PER_SLOT: usize = 2048;

/// How placement may trade speed for fitting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FitMode {
    /// Reduce the context, then offload layers to the CPU if still needed.
    On,
    /// Never offload: refuse to start unless every layer fits.
    GpuOnly,
}

/// What the user asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct FitRequest {
    pub mode: FitMode,
    /// Context over all slots (`-c`); `None`: `min(n_ctx_train, 4096)` per slot.
    pub n_ctx: Option<usize>,
    /// `-ngl N`: force this many layers on the GPU.
    pub n_gpu_layers: Option<usize>,
    /// Everything else (slots, KV types, micro-batch, runtime overhead, embeddings placement);
    /// its `n_ctx` and `n_gpu_layers` are ignored.
    pub base: PlanOptions,
}

/// The placement chosen.
#[derive(Debug, Clone, PartialEq)]
pub struct Fit {
    /// The plan at the chosen context (without suggestions).
    pub plan: Plan,
    /// The context wanted, when the chosen one is smaller.
    pub reduced_from: Option<usize>,
}

impl Fit {
    /// Every layer and the output head are on the GPU.
    pub fn all_on_gpu(&self) -> bool {
        self.plan.layers_on_gpu == self.plan.layers_total
    }
}

/// Why placement refused: the plan (with suggestions) at the wanted context.
#[derive(Debug, Clone, PartialEq)]
pub enum FitRefusal {
    /// `--fit gpu-only` (or `-ngl` with every layer under gpu-only) and the model does not fit.
    DoesNotFit(Box<Plan>),
    /// `-ngl N` puts more on the GPU than it has.
    ForcedTooLarge(Box<Plan>),
}

impl FitRefusal {
    pub fn plan(&self) -> &Plan {
        match self {
            FitRefusal::DoesNotFit(p) | FitRefusal::ForcedTooLarge(p) => p,
        }
    }
}

/// The context wanted: what was asked, else `min(n_ctx_train, 4096)` per slot; at least one
/// token per slot.
pub fn wanted_ctx(m: &ModelMemory, req: &FitRequest) -> usize {
    let slots = req.base.n_parallel.max(1);
    req.n_ctx
        .unwrap_or(m.n_ctx_train.clamp(1, DEFAULT_CTX_PER_SLOT) * slots)
        .clamp(slots, super::MAX_CTX)
}

/// Contexts `--fit` tries, largest first: the wanted one, then halvings down to the floor
/// (the floor itself included).
pub fn ctx_candidates(wanted: usize, n_parallel: usize) -> Vec<usize> {
    let floor = wanted.min(MIN_FIT_CTX_PER_SLOT * n_parallel.max(1));
    let mut v = vec![wanted];
    let mut c = wanted / 2;
    while c > floor {
        v.push(c);
        c /= 2;
    }
    if *v.last().unwrap_or(&0) != floor {
        v.push(floor);
    }
    v
}

/// Chooses context and placement for `m` on `gpu` (see the module comment).
pub fn fit(m: &ModelMemory, gpu: &GpuSpec, req: &FitRequest) -> Result<Fit, FitRefusal> {
    let wanted = wanted_ctx(m, req);
    let at = |n_ctx: usize, n_gpu_layers: Option<usize>| PlanOptions {
        n_ctx,
        n_gpu_layers,
        ..req.base.clone()
    };
    if let Some(n) = req.n_gpu_layers {
        let p = plan_placement(m, Some(gpu), &at(wanted, Some(n)));
        if p.gpu_bytes_placed > gpu.usable_bytes {
            return Err(FitRefusal::ForcedTooLarge(Box::new(plan(
                m,
                Some(gpu),
                &at(wanted, Some(n)),
            ))));
        }
        if req.mode == FitMode::GpuOnly && p.layers_on_gpu < p.layers_total {
            return Err(FitRefusal::DoesNotFit(Box::new(plan(
                m,
                Some(gpu),
                &at(wanted, Some(n)),
            ))));
        }
        return Ok(Fit {
            plan: p,
            reduced_from: None,
        });
    }
    let candidates = ctx_candidates(wanted, req.base.n_parallel);
    for &ctx in &candidates {
        let p = plan_placement(m, Some(gpu), &at(ctx, None));
        if p.fits {
            return Ok(Fit {
                plan: p,
                reduced_from: (ctx < wanted).then_some(wanted),
            });
        }
    }
    match req.mode {
        FitMode::GpuOnly => Err(FitRefusal::DoesNotFit(Box::new(plan(
            m,
            Some(gpu),
            &at(wanted, None),
        )))),
        FitMode::On => {
            let floor = *candidates.last().unwrap_or(&wanted);
            Ok(Fit {
                plan: plan_placement(m, Some(gpu), &at(floor, None)),
                reduced_from: (floor < wanted).then_some(wanted),
            })
        }
    }
}

/// How much slower decoding is predicted to be than with every layer on the GPU (1 when all
/// are there).
pub fn predicted_slowdown(p: &Plan) -> f64 {
    if p.expected_tok_s > 0.0 && p.expected_tok_s.is_finite() {
        (p.ceiling_tok_s / p.expected_tok_s).max(1.0)
    } else {
        1.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{buffers, Device};
    use crate::synth::{FileType, Shape};
    use backend::KvType;

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;

    fn req(m: &ModelMemory, mode: FitMode, n_ctx: Option<usize>, ngl: Option<usize>) -> FitRequest {
        let mut base = PlanOptions::for_model(m);
        base.runtime_overhead_bytes = Some(512 * MIB);
        FitRequest {
            mode,
            n_ctx,
            n_gpu_layers: ngl,
            base,
        }
    }

    /// GPU memory every layer needs at `n_ctx` beside the KV cache: weights (head included),
    /// compute buffers and the 512 MiB runtime.
    fn fixed_and_weights(m: &ModelMemory) -> u64 {
        m.layer_bytes().iter().sum::<u64>()
            + m.group_bytes(crate::plan::TensorGroup::Head)
            + buffers::compute_bytes(m, 512).total()
            + 512 * MIB
    }

    #[test]
    fn candidates_halve_down_to_the_floor() {
        assert_eq!(ctx_candidates(4096, 1), vec![4096, 2048]);
        assert_eq!(
            ctx_candidates(32768, 1),
            vec![32768, 16384, 8192, 4096, 2048]
        );
        assert_eq!(ctx_candidates(3000, 1), vec![3000, 2048]);
        assert_eq!(ctx_candidates(1000, 1), vec![1000]);
        assert_eq!(ctx_candidates(16384, 4), vec![16384, 8192]);
    }

    /// Table: (model bytes vs VRAM) → context, layers on the GPU, or refusal.
    #[test]
    fn placement_table() {
        let q32 = ModelMemory::from_shape(&Shape::qwen2_5_32b(), FileType::Q4KM);
        // Qwen2.5-32B: 256 KiB of f16 KV per token, 65 "layers" with the head.
        let kv = buffers::kv_bytes_per_token(&q32, KvType::F16, KvType::F16);
        assert_eq!(kv, 256 * 1024);
        let need = fixed_and_weights(&q32);
        struct Case {
            what: &'static str,
            usable: u64,
            mode: FitMode,
            n_ctx: Option<usize>,
            ngl: Option<usize>,
            /// Some((ctx, layers on GPU, reduced_from)); None = refused.
            expect: Option<(usize, usize, Option<usize>)>,
        }
        let cases = [
            Case {
                what: "H200-sized: default 4K context, all 65 on the GPU",
                usable: 140 * GIB,
                mode: FitMode::On,
                n_ctx: None,
                ngl: None,
                expect: Some((4096, 65, None)),
            },
            Case {
                what: "room for 8K of KV plus 100 MiB: a 32K request is reduced to 8K",
                usable: need + 8192 * kv + 100 * MIB,
                mode: FitMode::On,
                n_ctx: Some(32768),
                ngl: None,
                expect: Some((8192, 65, Some(32768))),
            },
            Case {
                what: "gpu-only reduces the context the same way",
                usable: need + 8192 * kv + 100 * MIB,
                mode: FitMode::GpuOnly,
                n_ctx: Some(32768),
                ngl: None,
                expect: Some((8192, 65, Some(32768))),
            },
            Case {
                what: "1 MiB short of the 2K floor: gpu-only refuses",
                usable: need + 2048 * kv - MIB,
                mode: FitMode::GpuOnly,
                n_ctx: None,
                ngl: None,
                expect: None,
            },
            Case {
                what: "16 GiB: 19 GB of weights cannot fit; fit on offloads at the 2K floor",
                usable: 16 * GIB,
                mode: FitMode::On,
                n_ctx: None,
                // Filled in below from the planner's own placement at 2K.
                ngl: None,
                expect: Some((2048, usize::MAX, Some(4096))),
            },
            Case {
                what: "-ngl 10 forces 10 at the wanted context",
                usable: 140 * GIB,
                mode: FitMode::On,
                n_ctx: Some(8192),
                ngl: Some(10),
                expect: Some((8192, 10, None)),
            },
            Case {
                what: "-ngl 65 on 16 GiB is refused up front",
                usable: 16 * GIB,
                mode: FitMode::On,
                n_ctx: None,
                ngl: Some(65),
                expect: None,
            },
            Case {
                what: "-ngl 10 under gpu-only is refused (layers left on the CPU)",
                usable: 140 * GIB,
                mode: FitMode::GpuOnly,
                n_ctx: None,
                ngl: Some(10),
                expect: None,
            },
        ];
        for c in &cases {
            let gpu = GpuSpec::custom(c.usable, 900.0);
            let r = fit(&q32, &gpu, &req(&q32, c.mode, c.n_ctx, c.ngl));
            match (c.expect, r) {
                (Some((ctx, layers, reduced)), Ok(f)) => {
                    assert_eq!(f.plan.n_ctx, ctx, "{}", c.what);
                    assert_eq!(f.reduced_from, reduced, "{}", c.what);
                    if layers == usize::MAX {
                        // Partial: between 1 and 64, the last layers (llama.cpp's -ngl), and
                        // one more layer would not fit.
                        let n = f.plan.layers_on_gpu;
                        assert!(n > 1 && n < 65, "{}: {n}", c.what);
                        let on_gpu = |i: usize| f.plan.layers[i].device == Device::Gpu;
                        assert!(
                            (0..64).all(|i| on_gpu(i) == (i >= 64 - (n - 1))),
                            "{}",
                            c.what
                        );
                        let next = &f.plan.layers[64 - n];
                        let next = next.weight_bytes + next.cache_bytes;
                        assert!(f.plan.gpu_bytes_placed + next > c.usable, "{}", c.what);
                        assert!(f.plan.gpu_bytes_placed <= c.usable, "{}", c.what);
                        assert!(predicted_slowdown(&f.plan) > 1.5, "{}", c.what);
                    } else {
                        assert_eq!(f.plan.layers_on_gpu, layers, "{}", c.what);
                    }
                    assert_eq!(f.all_on_gpu(), f.plan.layers_on_gpu == 65, "{}", c.what);
                }
                (None, Err(e)) => {
                    assert!(e.plan().suggestions.is_some(), "{}", c.what);
                }
                (want, got) => panic!("{}: expected {want:?}, got {got:?}", c.what),
            }
        }
    }

    #[test]
    fn gpu_only_on_a_v100_takes_iq4_xs_but_not_q4_k_m_of_qwen35_27b() {
        let v100 = GpuSpec::from_table("v100-16gb").unwrap();
        let base_kv = |m: &ModelMemory| {
            let mut r = req(m, FitMode::GpuOnly, None, None);
            r.base.runtime_overhead_bytes = None;
            r.base.cache_type_k = KvType::Q8_0;
            r.base.cache_type_v = KvType::Q8_0;
            r
        };
        let q4km = ModelMemory::from_shape(&Shape::qwen3_5_27b(), FileType::Q4KM);
        let e = fit(&q4km, &v100, &base_kv(&q4km)).unwrap_err();
        assert!(matches!(e, FitRefusal::DoesNotFit(_)));
        assert!(e.plan().short_by_bytes > 0);
        let iq4 = ModelMemory::from_shape(&Shape::qwen3_5_27b(), FileType::IQ4XS);
        let f = fit(&iq4, &v100, &base_kv(&iq4)).unwrap();
        assert!(f.all_on_gpu());
        assert!(
            f.plan.n_ctx >= 2048 && f.plan.n_ctx <= 4096,
            "{}",
            f.plan.n_ctx
        );
    }

    /// Qwen2.5-32B fits alone with 100 MiB to spare; with Qwen2.5-1.5B as its draft model
    /// (`-md`) it does not: gpu-only refuses, short by exactly the draft's bytes less the
    /// spare, and fit on offloads target layers to make room.
    #[test]
    fn fits_alone_but_not_with_the_draft() {
        use crate::plan::draft::{draft_bytes, speculation_overhead_bytes};
        use crate::plan::Speculation;
        let q32 = ModelMemory::from_shape(&Shape::qwen2_5_32b(), FileType::Q4KM);
        let q15 = ModelMemory::from_shape(&Shape::qwen2_5_1_5b(), FileType::Q4KM);
        let ctx = MIN_FIT_CTX_PER_SLOT;
        let alone_need = fixed_and_weights(&q32)
            + buffers::kv_bytes_per_token(&q32, KvType::F16, KvType::F16) * ctx as u64;
        let gpu = GpuSpec::custom(alone_need + 100 * MIB, 900.0);
        let with = |mode: FitMode| {
            let mut r = req(&q32, mode, Some(ctx), None);
            r.base.speculation = Some(Speculation {
                draft: Some(Box::new(q15.clone())),
                draft_kv: KvType::F16,
                draft_max: 8,
            });
            r
        };
        // Alone: every layer at the asked context, gpu-only or not.
        let f = fit(&q32, &gpu, &req(&q32, FitMode::GpuOnly, Some(ctx), None)).unwrap();
        assert!(f.all_on_gpu() && f.plan.n_ctx == ctx);
        assert_eq!(f.plan.gpu_bytes_full, alone_need);
        // 1.5B Q4_K_M weights + 28 layers × 2 KV heads × 128 × 2 × 2 bytes × 2048 positions,
        // and the target's verify logits (9 rows of 152064 f32).
        let d = draft_bytes(&q15, ctx, KvType::F16);
        assert_eq!(d.kv_cache, 28 * 2 * 128 * 2 * 2 * 2048);
        assert_eq!(d.weights, q15.total_bytes());
        let spec = d.total() + speculation_overhead_bytes(&q32, 8);
        assert_eq!(spec, d.weights + d.kv_cache + 4 * 9 * 152064);
        let e = fit(&q32, &gpu, &with(FitMode::GpuOnly)).unwrap_err();
        let FitRefusal::DoesNotFit(p) = &e else {
            panic!("{e:?}")
        };
        assert_eq!(p.short_by_bytes, spec - 100 * MIB);
        assert_eq!(p.ledger.draft_weights, d.weights);
        assert!(p.suggestions.is_some());
        let f = fit(&q32, &gpu, &with(FitMode::On)).unwrap();
        assert!(!f.all_on_gpu());
        assert!(f.plan.layers_on_gpu > 1);
        assert!(f.plan.gpu_bytes_placed <= gpu.usable_bytes);
        assert_eq!(f.plan.ledger.speculation_total(), spec);
    }

    #[test]
    fn slowdown_of_a_full_fit_is_one() {
        let m = ModelMemory::from_shape(&Shape::qwen2_5_1_5b(), FileType::Q4KM);
        let gpu = GpuSpec::from_table("h200").unwrap();
        let f = fit(&m, &gpu, &req(&m, FitMode::On, None, None)).unwrap();
        assert!(f.all_on_gpu());
        assert_eq!(predicted_slowdown(&f.plan), 1.0);
    }
}
