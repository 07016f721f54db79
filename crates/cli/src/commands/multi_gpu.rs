//! Several GPUs in one host (`--split-mode`, `--tensor-split`, `--main-gpu`, `--devices`):
//! which cards to use, the per-card ledger, and loading a layer-split model on
//! `cuda::multi::MultiBackend`.
//!
//! With several cards visible (or listed by `--devices`) and `--split-mode layer` (the
//! default then), the planner ([`model::plan::split`]) cuts the layers in proportion to the
//! cards' free memory or `--tensor-split`, `--fit` halves the context until every card fits,
//! and the model loads with one backend per card. `--devices cuda:0,cuda:0` makes two
//! *logical* cards of one GPU (each with its own stream, arena and graphs, each given half of
//! the GPU's memory): the split's correctness and its boundary cost can be measured on one
//! card. `--split-mode tensor` plans (`redline plan --gpus N --split-mode tensor`) but does not
//! run yet: it needs NCCL all-reduce.

use std::fmt::Write as _;
use std::sync::Arc;

use anyhow::{bail, Context};
use cuda::backend::CudaBackend;
use cuda::multi::{LayerSplit, Multi, MultiBackend};
use cuda::{CudaDevice, CudaOptions};
use model::plan::split::SplitFit;
use model::plan::{
    fit_split, FitRequest, GpuSpec, ModelMemory, PlanOptions, SplitMode, SplitPlan, SplitRequest,
};
use model::{LoadOptions, ModelOn};

use super::device_args::{DeviceChoice, PlacementArgs};
use super::placement::{LoadRequest, LoadedModel, LogTo, Placed};
use super::run::ModelArgs;
use super::speculate::SpecBackend;

const MIB: u64 = 1 << 20;

/// A layer-split model drafts with nothing yet: speculation needs a placement of the draft
/// across the cards.
impl SpecBackend for MultiBackend {
    fn take(_: LoadedModel) -> Option<ModelOn<Self>> {
        None
    }
}

/// The CUDA ordinals to split over, or `None` for the one-card (or CPU) path: `--devices` when
/// it lists two or more, else every visible GPU when there are several and the device is
/// `auto`; never with `--split-mode none` or `--device cpu` / `cuda:N`.
pub fn split_cards(p: &PlacementArgs, log: LogTo) -> anyhow::Result<Option<Vec<usize>>> {
    if p.split_mode == Some(SplitMode::None) {
        return Ok(None);
    }
    if let Some(list) = &p.devices {
        if list.0.len() < 2 {
            bail!("--devices lists one card; give --device cuda:N for one, or two or more to split over");
        }
        if p.device != DeviceChoice::Auto {
            bail!("give either --device or --devices, not both");
        }
        return Ok(Some(list.0.clone()));
    }
    let several = p.device == DeviceChoice::Auto && cuda::device_count().unwrap_or(0) >= 2;
    if several {
        return Ok(Some((0..cuda::device_count().unwrap_or(0)).collect()));
    }
    if p.split_mode.is_some() || p.tensor_split.is_some() {
        log.warn("--split-mode / --tensor-split do nothing with one card");
    }
    Ok(None)
}

fn mib(b: u64) -> String {
    format!("{:.0} MiB", b as f64 / MIB as f64)
}

/// "15.17 GiB" from 1 GiB up, "256.0 MiB" below, "" for 0.
fn size(bytes: u64) -> String {
    let b = bytes as f64;
    if bytes == 0 {
        String::new()
    } else if b >= (1u64 << 30) as f64 {
        format!("{:.2} GiB", b / (1u64 << 30) as f64)
    } else {
        format!("{:.1} MiB", b / MIB as f64)
    }
}

/// "blk 0–32 + output", "output", "all (1/4 of each)".
fn card_layers(p: &SplitPlan, i: usize) -> String {
    let c = &p.cards[i];
    if p.mode == SplitMode::Tensor {
        return if c.share > 0.0 {
            format!("all ({:.0} % of each)", 100.0 * c.share)
        } else {
            "none".into()
        };
    }
    let mut s = match (c.layers.first(), c.layers.last()) {
        (Some(a), Some(b)) => format!("blk {a}–{b}"),
        _ => String::new(),
    };
    if c.output_head {
        s.push_str(if s.is_empty() { "output" } else { " + output" });
    }
    if s.is_empty() {
        s.push_str("none");
    }
    s
}

/// One row of the per-card table: the cell of card `i`.
type Cell<'a> = Box<dyn Fn(usize) -> String + 'a>;

/// The per-card ledger of a split plan.
pub fn render_split(p: &SplitPlan, how: &str) -> String {
    let mut s = String::new();
    let w = &p.plan;
    let l = &w.ledger;
    let weights = l.layer_weights + l.output_head + l.token_embedding;
    let _ = writeln!(
        s,
        "model    {} ({}, {}): {:.2} GB of weights, {} layers; trained context {}",
        w.model,
        w.arch,
        w.file_type.as_deref().unwrap_or("?"),
        weights as f64 / 1e9,
        w.n_layer,
        w.n_ctx_train
    );
    let _ = writeln!(
        s,
        "split    {} over {} cards ({how}); context {} tokens = {} slot(s) × {}, K {} / V {}, micro-batch {}",
        p.mode,
        p.cards.len(),
        w.n_ctx,
        w.n_parallel,
        w.n_ctx_per_slot,
        w.cache_type_k,
        w.cache_type_v,
        w.n_ubatch
    );
    let transfer_label = if p.mode == SplitMode::Tensor {
        "all-reduce buffers + NCCL (est.)"
    } else {
        "hidden-state receive buffer"
    };
    let rows: Vec<(&str, Cell)> = vec![
        ("device", Box::new(|i| p.cards[i].gpu.name.clone())),
        ("layers", Box::new(|i| card_layers(p, i))),
        ("weights", Box::new(|i| size(p.cards[i].weights))),
        ("KV cache", Box::new(|i| size(p.cards[i].kv_cache))),
        (
            "recurrent state",
            Box::new(|i| size(p.cards[i].recurrent_state)),
        ),
        ("compute buffers", Box::new(|i| size(p.cards[i].compute))),
        (transfer_label, Box::new(|i| size(p.cards[i].transfer))),
        ("speculation", Box::new(|i| size(p.cards[i].speculation))),
        (
            "runtime: CUDA context (est.)",
            Box::new(|i| size(p.cards[i].runtime_overhead)),
        ),
        ("total", Box::new(|i| size(p.cards[i].total))),
        ("usable", Box::new(|i| size(p.cards[i].gpu.usable_bytes))),
        (
            "fits",
            Box::new(|i| {
                let c = &p.cards[i];
                if c.fits {
                    format!("yes ({} free)", size(c.gpu.usable_bytes - c.total))
                } else {
                    format!("no (short {})", size(c.short_by_bytes))
                }
            }),
        ),
    ];
    let _ = write!(s, "{:<34}", "per card");
    for c in &p.cards {
        let _ = write!(s, " {:>18}", format!("GPU {}", c.index));
    }
    let _ = writeln!(s);
    for (label, f) in &rows {
        if *label != "device" && *label != "layers" && (0..p.cards.len()).all(|i| f(i).is_empty()) {
            continue;
        }
        let _ = write!(s, "  {label:<32}");
        for i in 0..p.cards.len() {
            let v = f(i);
            if *label == "device" {
                let _ = write!(s, " {:>18}", v.chars().take(18).collect::<String>());
            } else {
                let _ = write!(s, " {v:>18}");
            }
        }
        let _ = writeln!(s);
    }
    for c in &p.cards {
        let _ = writeln!(
            s,
            "offloaded {}/{} layers to GPU {} ({})",
            c.positions, w.layers_total, c.index, c.gpu.name
        );
    }
    if p.fits {
        let _ = writeln!(s, "fits: yes, on every card");
    } else {
        let short: Vec<String> = p
            .cards
            .iter()
            .filter(|c| !c.fits)
            .map(|c| format!("GPU {} short by {}", c.index, size(c.short_by_bytes)))
            .collect();
        let _ = writeln!(s, "fits: no ({})", short.join(", "));
    }
    let how_fast = match p.mode {
        SplitMode::Tensor => format!(
            "the slowest card's share + {} all-reduces × {:.0} µs",
            p.crossings,
            model::plan::split::ALLREDUCE_SECONDS * 1e6
        ),
        _ => format!(
            "the cards read one after the other + {} crossing(s) × {:.0} µs, {} B moved per token",
            p.crossings,
            model::plan::split::CROSSING_SECONDS * 1e6,
            p.transfer_bytes_per_token
        ),
    };
    let _ = writeln!(
        s,
        "decode: expected up to {:.1} tok/s ({how_fast}); one card holding everything: {:.1} tok/s",
        p.expected_tok_s, p.one_card_tok_s
    );
    s
}

/// How the proportions were chosen, for the ledger's header.
fn how(p: &PlacementArgs, mode: SplitMode) -> String {
    match (&p.tensor_split, mode) {
        (_, SplitMode::None) => format!("--main-gpu {}", p.main_gpu),
        (Some(ts), _) => format!(
            "--tensor-split {}",
            ts.0.iter()
                .map(|x| x.to_string())
                .collect::<Vec<_>>()
                .join(",")
        ),
        (None, _) => "by free memory".into(),
    }
}

/// The layer split a plan puts the model in.
fn layer_split_of(p: &SplitPlan) -> anyhow::Result<LayerSplit> {
    let n_layer = p.plan.n_layer;
    let mut cards = vec![usize::MAX; n_layer + 1];
    for c in &p.cards {
        for &il in &c.layers {
            cards[il] = c.index;
        }
        if c.output_head {
            cards[n_layer] = c.index;
        }
    }
    LayerSplit::new(n_layer, p.cards.len(), cards)
        .context("internal: the plan's layer split is not a run of consecutive layers per card")
}

/// Loads the model of `margs` split over the CUDA cards `ordinals` (see the module notes).
pub fn load_split(
    margs: &ModelArgs,
    pargs: &PlacementArgs,
    req: &LoadRequest,
    log: LogTo,
    ordinals: &[usize],
) -> anyhow::Result<Placed> {
    let mode = pargs.split_mode.unwrap_or(SplitMode::Layer);
    if req.draft.is_some() {
        bail!(
            "speculative decoding (--md / --mtp) with a model split over several cards is not supported yet; \
             give --split-mode none (one card) or drop --md/--mtp"
        );
    }
    let file = margs.open_gguf()?;
    let mem = ModelMemory::from_gguf(&file)
        .with_context(|| format!("planning {}", margs.display_name()))?;
    if let Some(n) = pargs.n_gpu_layers {
        if n < mem.n_layer + 1 {
            bail!(
                "-ngl {n} would leave layers on the CPU, and a model split over several cards runs every layer on a card; \
                 drop -ngl, or give --split-mode none for one card with CPU offload"
            );
        }
    }
    let devs = ordinals
        .iter()
        .map(|&o| {
            CudaDevice::open(&CudaOptions {
                ordinal: o,
                ..CudaOptions::default()
            })
            .with_context(|| format!("opening cuda:{o} for the split"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let bandwidth_gbs = if req.measure_bandwidth {
        let (free, _) = devs[0].context().mem_get_info().context("cuMemGetInfo")?;
        let bytes = (1usize << 30).min(free / 4);
        let gbs = cuda::bandwidth::measure_read_bandwidth(&devs[0], bytes, 20)
            .context("measuring the read bandwidth")?;
        devs[0].synchronize().context("synchronizing the GPU")?;
        Some(gbs)
    } else {
        None
    };
    // Logical cards on one GPU share its memory: each is planned with an equal part.
    let sharing = |o: usize| ordinals.iter().filter(|&&x| x == o).count() as u64;
    let mut free_at_open = Vec::new();
    let mut gpus = Vec::new();
    for (d, &o) in devs.iter().zip(ordinals) {
        let (free, total) = d.context().mem_get_info().context("cuMemGetInfo")?;
        let (free, total) = (free as u64, total as u64);
        free_at_open.push(free);
        let k = sharing(o);
        let usable = pargs.vram_limit.map_or(total, |l| l.min(total));
        let info = d.info();
        gpus.push(GpuSpec {
            name: if k > 1 {
                format!("cuda:{o} ({}, 1/{k} logical)", info.name)
            } else {
                format!("cuda:{o} ({})", info.name)
            },
            vram_bytes: total / k,
            usable_bytes: usable / k,
            bandwidth_gbs: bandwidth_gbs.unwrap_or_else(|| info.peak_bandwidth_gbs()),
            runtime_overhead_bytes: total.saturating_sub(free) / k,
        });
    }
    let mut base = PlanOptions::for_model(&mem);
    base.n_parallel = req.n_parallel.max(1);
    base.cache_type_k = req.kv_type;
    base.cache_type_v = req.kv_type;
    base.embeddings_on_gpu = true;
    let fit_req = FitRequest {
        mode: pargs.fit,
        n_ctx: req.n_ctx,
        n_gpu_layers: None,
        base,
    };
    let split_req = SplitRequest {
        mode,
        tensor_split: pargs.tensor_split.as_ref().map(|t| t.0.clone()),
        main_gpu: pargs.main_gpu,
    };
    let how = how(pargs, mode);
    let SplitFit { plan, reduced_from } = match fit_split(&mem, &gpus, &fit_req, &split_req) {
        None => bail!(
            "{how} does not fit {} cards (more proportions than cards, none above zero, or --main-gpu {} out of range)",
            gpus.len(),
            pargs.main_gpu
        ),
        Some(Ok(f)) => f,
        Some(Err(p)) => {
            log.block(&render_split(&p, &how));
            bail!(
                "the model does not fit on the {} cards even at {} tokens of context (ledger above); a layer split \
                 never offloads to the CPU: give a smaller -c, --cache-type-k/v q8_0, another --tensor-split, or a smaller quant",
                gpus.len(),
                p.plan.n_ctx
            );
        }
    };
    if let Some(from) = reduced_from {
        log.warn(&format!(
            "context reduced from {from} to {} tokens so that every card holds its layers (--fit)",
            plan.plan.n_ctx
        ));
    }
    log.block(&render_split(&plan, &how));
    if mode == SplitMode::Tensor {
        bail!(
            "--split-mode tensor is not supported yet: it needs NCCL all-reduce, which redline does not load yet \
             (the ledger above is what it would take); use --split-mode layer"
        );
    }
    let split = layer_split_of(&plan)?;
    let load_opts = LoadOptions {
        n_threads: margs.threads,
        ..LoadOptions::default()
    };
    let names: Vec<String> = ordinals.iter().map(|o| format!("cuda:{o}")).collect();
    let device_name = format!("{} (layer split: {split})", names.join(" + "));
    let mem_info: Vec<_> = devs.iter().map(|d| d.context().clone()).collect();
    let cards: Vec<CudaBackend> = devs.into_iter().map(CudaBackend::from_device).collect();
    let multi = Multi::new(cards, split).context("starting the layer-split backend")?;
    if !multi.records_steps() {
        log.warn(
            "decode steps over several GPUs run without CUDA graphs (REDLINE_MULTI_GRAPHS=1 records them per card: \
             not yet verified on several GPUs); the hidden state crosses by peer copies (through host memory where \
             the cards have no peer access)",
        );
    }
    let t0 = std::time::Instant::now();
    let model = ModelOn::load_on(multi, Arc::new(file), &load_opts)
        .context("loading the model on the cards")?;
    let weights: u64 = plan.cards.iter().map(|c| c.weights).sum();
    log.info(&format!(
        "uploaded {} of weights to {device_name} in {:.1} s",
        mib(weights),
        t0.elapsed().as_secs_f64()
    ));
    // Device memory taken by the upload on each physical GPU, against the ledger's weights
    // of the cards on it.
    let mut seen = Vec::new();
    for (i, &o) in ordinals.iter().enumerate() {
        if seen.contains(&o) {
            continue;
        }
        seen.push(o);
        let Ok((free, _)) = mem_info[i].mem_get_info() else {
            continue;
        };
        let measured = free_at_open[i].saturating_sub(free as u64);
        let ledger: u64 = plan
            .cards
            .iter()
            .zip(ordinals)
            .filter(|(_, &x)| x == o)
            .map(|(c, _)| c.weights)
            .sum();
        log.info(&format!(
            "GPU memory cuda:{o}: {} allocated by redline (measured), ledger weights {} ({:+.2} %)",
            mib(measured),
            mib(ledger),
            100.0 * (measured as f64 - ledger as f64) / ledger.max(1) as f64
        ));
    }
    Ok(Placed::new_split(
        LoadedModel::Multi(model),
        plan.plan,
        device_name,
        bandwidth_gbs,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use model::plan::split::plan_split;
    use model::synth::{FileType, Shape};

    #[test]
    fn renders_per_card_lines_and_the_split_back() {
        let m = ModelMemory::from_shape(&Shape::qwen2_5_32b(), FileType::Q4KM);
        let v = GpuSpec::from_table("v100-16gb").unwrap();
        let o = PlanOptions::for_model(&m);
        let r = SplitRequest {
            mode: SplitMode::Layer,
            tensor_split: Some(vec![3.0, 1.0]),
            main_gpu: 0,
        };
        let p = plan_split(&m, &[v.clone(), v], &o, &r).unwrap();
        let s = render_split(&p, "--tensor-split 3,1");
        assert!(s.contains("offloaded 49/65 layers to GPU 0"), "{s}");
        assert!(s.contains("offloaded 16/65 layers to GPU 1"), "{s}");
        assert!(
            s.contains("blk 0–48") && s.contains("blk 49–63 + output"),
            "{s}"
        );
        // 3:1 on two 16 GB cards: the first holds 13.7 GiB of weights and still fits
        // (15.1 of 15.8 GiB with its KV, buffers and runtime); 4:1 (52 positions) does not.
        assert!(s.contains("fits: yes, on every card"), "{s}");
        let r4 = SplitRequest {
            tensor_split: Some(vec![4.0, 1.0]),
            ..r
        };
        let v = GpuSpec::from_table("v100-16gb").unwrap();
        let p4 = plan_split(&m, &[v.clone(), v], &o, &r4).unwrap();
        let s4 = render_split(&p4, "--tensor-split 4,1");
        assert!(s4.contains("offloaded 52/65 layers to GPU 0"), "{s4}");
        assert!(s4.contains("fits: no (GPU 0 short by"), "{s4}");
        let split = layer_split_of(&p).unwrap();
        assert_eq!(split.positions(), vec![49, 16]);
        assert_eq!(split.output_card(), 1);
    }
}
