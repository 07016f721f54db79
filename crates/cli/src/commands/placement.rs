//! Loading a model where the flags and the memory plan put it: open the GPU (or say once why
//! not), plan with the card's measured free memory (`--vram-limit` caps it), apply `--fit` /
//! `-ngl`, log the ledger and "offloaded X/Y layers to GPU", upload with a progress bar, and
//! compare the device memory actually used with the ledger. Several cards (visible, or listed
//! by `--devices`) go to `commands::multi_gpu` (layer split) instead.
//!
//! Every layer on the GPU runs on `CudaBackend`; a partial plan (some layers on the GPU, the
//! rest on the CPU) on `cuda::hybrid::HybridBackend` with the planner's count as llama.cpp's
//! `-ngl` (the output head and the last layers on the GPU), announced with its predicted
//! slowdown.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use backend::cpu::CpuBackend;
use cuda::backend::CudaBackend;
use cuda::hybrid::{HybridBackend, Placement};
use cuda::multi::MultiBackend;
use cuda::{CudaDevice, CudaOptions};
use indicatif::{ProgressBar, ProgressStyle};
use model::plan::fit::{predicted_slowdown, wanted_ctx};
use model::plan::{
    fit, plan_placement, FitMode, FitRefusal, FitRequest, GpuSpec, LayerKind, ModelMemory, Plan,
    PlanOptions, Speculation,
};
use model::{KvType, LoadOptions, Model, ModelOn};

use super::device_args::{DeviceChoice, PlacementArgs};
use super::run::ModelArgs;

const MIB: u64 = 1 << 20;

/// A loaded model on the backend the placement chose.
// One per process, made once and matched by reference: the size difference costs nothing.
#[allow(clippy::large_enum_variant)]
pub enum LoadedModel {
    Cpu(Model),
    Cuda(ModelOn<CudaBackend>),
    /// Partial offload: the output head and the last layers on the GPU.
    Hybrid(ModelOn<HybridBackend>),
    /// Layer split over several cards (`--split-mode layer`).
    Multi(ModelOn<MultiBackend>),
}

/// Where the startup lines go: stderr (`run`, `bench`) or the tracing log (`serve`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogTo {
    Stderr,
    Tracing,
}

impl LogTo {
    pub fn info(self, line: &str) {
        match self {
            LogTo::Stderr => eprintln!("{line}"),
            LogTo::Tracing => tracing::info!("{line}"),
        }
    }

    pub fn warn(self, line: &str) {
        match self {
            LogTo::Stderr => eprintln!("warning: {line}"),
            LogTo::Tracing => tracing::warn!("{line}"),
        }
    }

    pub(super) fn block(self, text: &str) {
        for l in text.lines() {
            self.info(l);
        }
    }
}

/// What the command needs from the placement.
#[derive(Debug, Clone)]
pub struct LoadRequest {
    /// Context over all slots (`-c`); `None`: the planner's default (4096 per slot at most).
    pub n_ctx: Option<usize>,
    pub n_parallel: usize,
    pub kv_type: KvType,
    /// Measure the GPU's read bandwidth before uploading the weights (`bench`).
    pub measure_bandwidth: bool,
    /// Speculative decoding's drafter, planned together with the model (its bytes are in the
    /// ledger and the fit), loaded afterwards by `speculate::load_drafter`.
    pub draft: Option<DraftRequest>,
}

/// The drafter to make room for (`-md DRAFT.gguf` or `--mtp`).
#[derive(Debug, Clone)]
pub struct DraftRequest {
    /// The draft model file; None: the model's own MTP layer.
    pub model: Option<std::path::PathBuf>,
    /// KV cache type of the draft model (its context is the model's).
    pub kv_type: KvType,
    /// Most tokens drafted per verify pass.
    pub draft_max: usize,
}

impl DraftRequest {
    /// Reads the draft file's tensor table (nothing is loaded) and says what to plan for.
    fn speculation(&self, target: &ModelMemory) -> anyhow::Result<Speculation> {
        let draft = match &self.model {
            Some(path) => {
                let file = gguf::GgufFile::open(path)
                    .with_context(|| format!("reading the draft model {}", path.display()))?;
                let mem = ModelMemory::from_gguf(&file)
                    .with_context(|| format!("planning the draft model {}", path.display()))?;
                Some(Box::new(mem))
            }
            None => {
                if target.n_mtp_layer == 0 {
                    bail!(
                        "--mtp: the model has no multi-token-prediction layer (qwen35 files with \
                         qwen35.nextn_predict_layers > 0)"
                    );
                }
                None
            }
        };
        Ok(Speculation {
            draft,
            draft_kv: self.kv_type,
            draft_max: self.draft_max,
        })
    }

    /// "the model and the draft model D.gguf" / "the model with its MTP layer".
    fn what(&self) -> String {
        match &self.model {
            Some(p) => format!("the model and the draft model {}", p.display()),
            None => "the model with its MTP layer and speculation buffers".into(),
        }
    }
}

/// Free and total device memory, bytes (cuMemGetInfo).
type MemInfo = Arc<dyn Fn() -> Option<(u64, u64)> + Send + Sync>;

struct GpuMemory {
    mem_info: MemInfo,
    total: u64,
    /// Free right after the context was created, before any weight.
    free_at_open: u64,
}

/// The loaded model and what the placement decided.
pub struct Placed {
    pub model: LoadedModel,
    /// The plan the model was placed by (its ledger).
    pub plan: Plan,
    /// Context over all slots.
    pub n_ctx: usize,
    /// "cpu" or "cuda:0 (NVIDIA H200)".
    pub device_name: String,
    /// Device read bandwidth measured at start, GB/s (`measure_bandwidth`, GPU only).
    pub bandwidth_gbs: Option<f64>,
    gpu: Option<GpuMemory>,
}

impl Placed {
    /// Layers on the GPU and in total ("offloaded X/Y").
    pub fn offload(&self) -> (usize, usize) {
        match &self.model {
            LoadedModel::Cpu(_) => (0, self.plan.layers_total),
            LoadedModel::Cuda(_) => (self.plan.layers_on_gpu, self.plan.layers_total),
            LoadedModel::Hybrid(m) => m.backend().placement().offloaded(),
            LoadedModel::Multi(_) => (self.plan.layers_total, self.plan.layers_total),
        }
    }

    /// A model split over several cards (`commands::multi_gpu`, which reports each card's
    /// memory itself).
    pub(super) fn new_split(
        model: LoadedModel,
        plan: Plan,
        device_name: String,
        bandwidth_gbs: Option<f64>,
    ) -> Placed {
        Placed {
            model,
            n_ctx: plan.n_ctx,
            plan,
            device_name,
            bandwidth_gbs,
            gpu: None,
        }
    }

    /// Logs the device memory allocated since the context was created beside the ledger's
    /// prediction for what exists now: the weights placed on the GPU, plus the cache and state
    /// of `n_seq_states` sequences of the planned context (0 when none is allocated yet).
    /// A no-op on the CPU.
    pub fn report_memory(&self, log: LogTo, with_states: bool) {
        let Some(g) = &self.gpu else { return };
        let Some((free, _)) = (g.mem_info)() else {
            log.warn("cannot read the GPU's free memory (cuMemGetInfo failed)");
            return;
        };
        let measured = g.free_at_open.saturating_sub(free);
        let weights = gpu_weight_bytes(&self.plan);
        let states = if with_states {
            gpu_cache_bytes(&self.plan)
        } else {
            0
        };
        let predicted = weights + states;
        let c = MemoryCheck::new(measured, predicted);
        log.info(&format!(
            "GPU memory: {} allocated by redline (measured), ledger {} (weights {}{}); {} ({:+.2} %) {}",
            mib(measured),
            mib(predicted),
            mib(weights),
            if with_states {
                format!(" + KV/state {}", mib(states))
            } else {
                String::new()
            },
            signed_mib(c.diff),
            c.percent,
            if c.within_tolerance() {
                "— within 2 % / 256 MiB"
            } else {
                "— OUTSIDE 2 % / 256 MiB"
            }
        ));
        log.info(&format!(
            "GPU memory: {} of {} in use on the device (runtime and other processes {} at start; ledger's full total with compute buffers {})",
            mib(g.total.saturating_sub(free)),
            mib(g.total),
            mib(g.total.saturating_sub(g.free_at_open)),
            mib(self.plan.gpu_bytes_placed)
        ));
    }
}

/// MTP blocks the plan puts on the GPU (with `--mtp`).
fn mtp_layers_on_gpu(p: &Plan) -> usize {
    p.layers
        .iter()
        .filter(|l| l.kind == LayerKind::Mtp && l.device == model::plan::Device::Gpu)
        .count()
}

/// Weight bytes the plan puts on the GPU at load: head, main layers, and the embedding table
/// when counted. The MTP block (`load_mtp`, after the load) and a draft model (loaded on its
/// own) are not uploaded by this load, so they are not in the comparison.
fn gpu_weight_bytes(p: &Plan) -> u64 {
    use model::plan::Device;
    let layers: u64 = p
        .layers
        .iter()
        .filter(|l| l.device == Device::Gpu && l.kind != LayerKind::Mtp)
        .map(|l| l.weight_bytes)
        .sum();
    let head = if p.output_head_device == Device::Gpu {
        p.ledger.output_head
    } else {
        0
    };
    let embd = if p.embeddings_on_gpu {
        p.ledger.token_embedding
    } else {
        0
    };
    layers + head + embd
}

/// KV cache and recurrent state bytes of the main layers the plan puts on the GPU.
fn gpu_cache_bytes(p: &Plan) -> u64 {
    p.layers
        .iter()
        .filter(|l| l.device == model::plan::Device::Gpu && l.kind != LayerKind::Mtp)
        .map(|l| l.cache_bytes)
        .sum()
}

/// Measured against predicted device memory (issue #5: within 2 % or 256 MiB).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MemoryCheck {
    pub diff: i64,
    pub percent: f64,
}

impl MemoryCheck {
    pub fn new(measured: u64, predicted: u64) -> MemoryCheck {
        let diff = measured as i64 - predicted as i64;
        let percent = if predicted > 0 {
            100.0 * diff as f64 / predicted as f64
        } else {
            0.0
        };
        MemoryCheck { diff, percent }
    }

    pub fn within_tolerance(&self) -> bool {
        self.percent.abs() <= 2.0 || self.diff.unsigned_abs() <= 256 * MIB
    }
}

fn mib(b: u64) -> String {
    format!("{:.0} MiB", b as f64 / MIB as f64)
}

fn signed_mib(b: i64) -> String {
    format!("{:+.0} MiB", b as f64 / MIB as f64)
}

/// Whether a load error is the device running out of memory.
fn is_out_of_memory(msg: &str) -> bool {
    let m = msg.to_ascii_lowercase();
    m.contains("out of memory") || m.contains("out_of_memory") || m.contains("cannot allocate")
}

/// Opens the GPU the flags ask for. `Ok(None)`: run on the CPU (for `auto`, after one line
/// saying why).
/// `auto` opens `main_gpu` (`--main-gpu`, 0 by default).
fn open_device(
    choice: DeviceChoice,
    main_gpu: usize,
    log: LogTo,
) -> anyhow::Result<Option<CudaDevice>> {
    let ordinal = match choice {
        DeviceChoice::Cpu => return Ok(None),
        DeviceChoice::Auto => main_gpu,
        DeviceChoice::Cuda(n) => n,
    };
    let opts = CudaOptions {
        ordinal,
        ..CudaOptions::default()
    };
    match CudaDevice::open(&opts) {
        Ok(d) => Ok(Some(d)),
        Err(e) if choice == DeviceChoice::Auto => {
            log.info(&format!("no usable GPU, running on the CPU: {e}"));
            Ok(None)
        }
        Err(e) => Err(e).with_context(|| format!("--device {choice}")),
    }
}

/// Loads the model of `margs` where `pargs` and the plan say, logging the ledger.
pub fn load_placed(
    margs: &ModelArgs,
    pargs: &PlacementArgs,
    req: &LoadRequest,
    log: LogTo,
) -> anyhow::Result<Placed> {
    if let Some(cards) = super::multi_gpu::split_cards(pargs, log)? {
        return super::multi_gpu::load_split(margs, pargs, req, log, &cards);
    }
    let file = margs.open_gguf()?;
    let mem = ModelMemory::from_gguf(&file)
        .with_context(|| format!("planning {}", margs.display_name()))?;
    let load_opts = LoadOptions {
        n_threads: margs.threads,
        ..LoadOptions::default()
    };
    let mut base = PlanOptions::for_model(&mem);
    base.n_parallel = req.n_parallel.max(1);
    base.cache_type_k = req.kv_type;
    base.cache_type_v = req.kv_type;
    if let Some(d) = &req.draft {
        base.speculation = Some(d.speculation(&mem)?);
        // The MTP layer is placed like a layer (with the output head, first).
        base.use_mtp = d.model.is_none();
    }
    let fit_req = FitRequest {
        mode: pargs.fit,
        n_ctx: req.n_ctx,
        n_gpu_layers: pargs.n_gpu_layers,
        base,
    };
    let dev = open_device(pargs.device, pargs.main_gpu, log)?;
    let Some(dev) = dev else {
        if pargs.fit == FitMode::GpuOnly && pargs.device != DeviceChoice::Cpu {
            bail!("--fit gpu-only needs a GPU, and none is usable (see above)");
        }
        if pargs.n_gpu_layers.is_some_and(|n| n > 0) || pargs.vram_limit.is_some() {
            log.warn("-ngl / --vram-limit do nothing on the CPU");
        }
        return load_cpu(file, &mem, &fit_req, &load_opts, req.measure_bandwidth, log);
    };

    let ctx = dev.context().clone();
    let mem_info: MemInfo = Arc::new(move || {
        ctx.mem_get_info()
            .ok()
            .map(|(free, total)| (free as u64, total as u64))
    });
    let info = dev.info().clone();
    let device_name = format!("cuda:{} ({})", info.ordinal, info.name);
    let bandwidth_gbs = if req.measure_bandwidth {
        let (free, _) = mem_info().context("reading the GPU's free memory")?;
        let bytes = (1usize << 30).min(free as usize / 4);
        let gbs = cuda::bandwidth::measure_read_bandwidth(&dev, bytes, 20)
            .context("measuring the read bandwidth")?;
        // Its buffer is freed on the stream: let that finish before the baseline is read.
        dev.synchronize().context("synchronizing the GPU")?;
        Some(gbs)
    } else {
        None
    };
    let (free_at_open, total) = mem_info().context("reading the GPU's free memory")?;
    // Already in use: our context, and whatever other processes hold.
    let runtime = total.saturating_sub(free_at_open);
    let usable = pargs.vram_limit.map_or(total, |l| l.min(total));
    if usable <= runtime {
        bail!(
            "--vram-limit {} leaves nothing: the CUDA context and other processes already use {} of the GPU",
            mib(usable),
            mib(runtime)
        );
    }
    let gpu = GpuSpec {
        name: match pargs.vram_limit {
            Some(_) => format!("{device_name}, limited to {}", mib(usable)),
            None => device_name.clone(),
        },
        vram_bytes: total,
        usable_bytes: usable,
        bandwidth_gbs: bandwidth_gbs.unwrap_or_else(|| info.peak_bandwidth_gbs()),
        runtime_overhead_bytes: runtime,
    };
    let mut fit_req = fit_req;
    fit_req.base.runtime_overhead_bytes = Some(runtime);
    // CudaBackend keeps the token-embedding table on the device (embed runs there).
    fit_req.base.embeddings_on_gpu = true;
    let f = match fit(&mem, &gpu, &fit_req) {
        Ok(f) => f,
        Err(refusal) => {
            let what = req
                .draft
                .as_ref()
                .map_or("the model".into(), DraftRequest::what);
            let why = match &refusal {
                FitRefusal::DoesNotFit(p) => format!(
                    "not enough GPU memory for {what} on {} (short by {}), and --fit gpu-only forbids offloading layers \
                     to the CPU; use --fit on, a smaller -c, --cache-type-k/v q8_0, or a smaller quant (above)",
                    gpu.name,
                    mib(p.short_by_bytes)
                ),
                FitRefusal::ForcedTooLarge(p) => format!(
                    "-ngl {} needs {} on the GPU ({} for redline, {} already held by the CUDA context and other \
                     processes) but only {} is usable: short by {}; give a smaller -ngl or leave it to --fit",
                    pargs.n_gpu_layers.unwrap_or(0),
                    mib(p.gpu_bytes_placed),
                    mib(p.gpu_bytes_placed.saturating_sub(runtime)),
                    mib(runtime),
                    mib(usable),
                    mib(p.gpu_bytes_placed.saturating_sub(usable))
                ),
            };
            log.block(&super::plan::render(refusal.plan()));
            bail!("{why}");
        }
    };
    if let Some(from) = f.reduced_from {
        log.warn(&format!(
            "context reduced from {from} to {} tokens so that every layer fits on the GPU (--fit on)",
            f.plan.n_ctx
        ));
    }
    let mut f = f;
    let mut partial = None;
    if !f.all_on_gpu()
        && pargs.n_gpu_layers != Some(0)
        && req.draft.as_ref().is_some_and(|d| d.model.is_some())
    {
        // A draft model runs beside a model held whole on the GPU (no hybrid draft pairing;
        // -ngl 0 runs both on the CPU).
        log.block(&super::plan::render(&f.plan));
        if let (Some(n), 0) = (pargs.n_gpu_layers, f.plan.short_by_bytes) {
            bail!(
                "-ngl {n} leaves layers on the CPU, and a draft model (--md) runs only beside a model held whole \
                 on the GPU; leave -ngl to --fit, or give -ngl 0 to run both on the CPU"
            );
        }
        bail!(
            "{} do not both fit on {}: together they need {} (the draft model {} of weights + {} of cache, \
             speculation buffers {}), short by {}; give a smaller -c, --cache-type-k/v q8_0, a smaller draft \
             or a smaller quant, or drop --md (ledger above)",
            req.draft.as_ref().map_or(String::new(), DraftRequest::what),
            gpu.name,
            mib(f.plan.gpu_bytes_full),
            mib(f.plan.ledger.draft_weights),
            mib(f.plan.ledger.draft_cache),
            mib(f.plan.ledger.speculation_buffers),
            mib(f.plan.short_by_bytes)
        );
    }
    if !f.all_on_gpu() {
        // The hybrid backend keeps the embedding table on the CPU: re-plan without it on the
        // GPU at the chosen context (room for one more layer, perhaps).
        let opts = PlanOptions {
            n_ctx: f.plan.n_ctx,
            n_gpu_layers: pargs.n_gpu_layers,
            embeddings_on_gpu: false,
            ..fit_req.base.clone()
        };
        f.plan = plan_placement(&mem, Some(&gpu), &opts);
        if f.plan.layers_on_gpu == 0 {
            log.warn(if pargs.n_gpu_layers == Some(0) {
                "-ngl 0: running every layer on the CPU"
            } else {
                "not even the output head fits on the GPU: running every layer on the CPU"
            });
            drop(dev);
            return load_cpu(file, &mem, &fit_req, &load_opts, req.measure_bandwidth, log);
        }
        let n_layer = mem.n_layer;
        // The MTP block (planned first on the GPU with --mtp) is not one of -ngl's layers:
        // load_mtp places it later.
        let ngl = f.plan.layers_on_gpu - mtp_layers_on_gpu(&f.plan);
        partial = Some(
            Placement::from_ngl_gguf(&file, ngl)
                .unwrap_or_else(|| Placement::from_ngl(n_layer, ngl)),
        );
    }
    log.block(&super::plan::render(&f.plan));
    if let Some(pl) = &partial {
        let p = &f.plan;
        log.warn(&format!(
            "offloaded {}/{} layers to GPU ({pl}): {} layers run on the CPU; predicted decode {:.1} tok/s, \
             {:.1}× slower than all on the GPU ({:.1} tok/s). --fit gpu-only refuses instead; a smaller -c, \
             --cache-type-k/v q8_0 or a smaller quant may fit (redline plan)",
            p.layers_on_gpu,
            p.layers_total,
            p.layers_total - p.layers_on_gpu,
            p.expected_tok_s,
            predicted_slowdown(p),
            p.ceiling_tok_s
        ));
    }

    let device_name = match &partial {
        Some(_) => format!("{device_name} + cpu"),
        None => device_name,
    };
    let weights = gpu_weight_bytes(&f.plan);
    let bar = ProgressBar::new(weights);
    bar.set_style(
        ProgressStyle::with_template(
            "uploading weights {bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .expect("valid template"),
    );
    let done = Arc::new(AtomicBool::new(false));
    let poller = {
        let (done, bar, mem_info) = (done.clone(), bar.clone(), mem_info.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                if let Some((free, _)) = mem_info() {
                    bar.set_position(free_at_open.saturating_sub(free).min(weights));
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    let t0 = std::time::Instant::now();
    let gpu_backend = CudaBackend::from_device(dev);
    let file = Arc::new(file);
    let loaded = match partial {
        None => ModelOn::load_on(gpu_backend, file, &load_opts).map(LoadedModel::Cuda),
        Some(pl) => {
            let cpu = CpuBackend::new(load_opts.n_threads).context("starting the CPU backend")?;
            ModelOn::load_on(HybridBackend::new(cpu, gpu_backend, pl), file, &load_opts)
                .map(LoadedModel::Hybrid)
        }
    };
    done.store(true, Ordering::Relaxed);
    let _ = poller.join();
    bar.finish_and_clear();
    let model = match loaded {
        Ok(m) => m,
        Err(e) => {
            let msg = e.to_string();
            if is_out_of_memory(&msg) {
                let now = mem_info().map_or(0, |(free, _)| free);
                bail!(
                    "out of GPU memory while loading the weights ({msg}): the ledger needs {} for weights, {} was free when loading began \
                     ({} in use by the CUDA context and other processes, {} total), {} free now. Another process may have taken the memory; \
                     try --vram-limit, -ngl, a smaller -c, or a smaller quant",
                    mib(weights),
                    mib(free_at_open),
                    mib(runtime),
                    mib(total),
                    mib(now)
                );
            }
            return Err(e).context("loading the model on the GPU");
        }
    };
    log.info(&format!(
        "uploaded {} of weights to {device_name} in {:.1} s",
        mib(weights),
        t0.elapsed().as_secs_f64()
    ));
    let placed = Placed {
        model,
        n_ctx: f.plan.n_ctx,
        plan: f.plan,
        device_name,
        bandwidth_gbs,
        gpu: Some(GpuMemory {
            mem_info,
            total,
            free_at_open,
        }),
    };
    placed.report_memory(log, false);
    Ok(placed)
}

/// Every layer on the CPU; logs the host ledger and "offloaded 0/Y".
fn load_cpu(
    file: gguf::GgufFile,
    mem: &ModelMemory,
    fit_req: &FitRequest,
    load_opts: &LoadOptions,
    measure_bandwidth: bool,
    log: LogTo,
) -> anyhow::Result<Placed> {
    let n_ctx = wanted_ctx(mem, fit_req);
    let opts = PlanOptions {
        n_ctx,
        n_gpu_layers: None,
        embeddings_on_gpu: false,
        runtime_overhead_bytes: None,
        ..fit_req.base.clone()
    };
    let plan = plan_placement(mem, None, &opts);
    log.block(&super::plan::render(&plan));
    log.info(&format!(
        "offloaded 0/{} layers to GPU (CPU backend)",
        plan.layers_total
    ));
    let model = Model::load_from_gguf(file, load_opts).context("loading the model")?;
    Ok(Placed {
        model: LoadedModel::Cpu(model),
        n_ctx: plan.n_ctx,
        plan,
        device_name: "cpu".into(),
        bandwidth_gbs: measure_bandwidth.then(|| {
            // 256 MiB: several times any last-level cache, ~10 ms per pass.
            backend::cpu::bandwidth::measure_read_bandwidth(load_opts.n_threads, 256 << 20, 7)
        }),
        gpu: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_tolerance_is_two_percent_or_256_mib() {
        let gib = 1u64 << 30;
        // 19 GiB predicted: 2 % is 389 MiB.
        assert!(MemoryCheck::new(19 * gib + 300 * MIB, 19 * gib).within_tolerance());
        assert!(!MemoryCheck::new(19 * gib + 400 * MIB, 19 * gib).within_tolerance());
        assert!(!MemoryCheck::new(19 * gib - 400 * MIB, 19 * gib).within_tolerance());
        // Small models: 256 MiB absolute.
        assert!(MemoryCheck::new(300 * MIB, 100 * MIB).within_tolerance());
        assert!(!MemoryCheck::new(400 * MIB, 100 * MIB).within_tolerance());
        let c = MemoryCheck::new(102 * MIB, 100 * MIB);
        assert_eq!(c.diff, 2 * MIB as i64);
        assert!((c.percent - 2.0).abs() < 1e-9);
        assert_eq!(MemoryCheck::new(5, 0).percent, 0.0);
    }

    #[test]
    fn out_of_memory_messages() {
        assert!(is_out_of_memory(
            "device error: DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")"
        ));
        assert!(is_out_of_memory("cannot allocate 123 bytes for tensor"));
        assert!(!is_out_of_memory("missing tensor blk.0.attn_q.weight"));
    }
}
