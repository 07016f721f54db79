//! `redline plan`: the memory ledger of a model on a GPU (real file or built-in shape), how many
//! layers fit, the decode ceiling, and what would fit instead. Works on any machine: nothing is
//! loaded, only the tensor table and metadata are read.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{bail, Context};
use model::plan::{plan, Device, GpuSpec, LayerKind, ModelMemory, Plan, PlanOptions, Speculation};
use model::synth::{FileType, Shape};
use model::KvType;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// GGUF model file (or use -m, or --shape for a built-in shape).
    #[arg(conflicts_with_all = ["model", "shape"])]
    file: Option<PathBuf>,
    /// GGUF model file.
    #[arg(short = 'm', long = "model", conflicts_with = "shape")]
    model: Option<PathBuf>,
    /// Built-in shape instead of a file: qwen2.5-1.5b, qwen2.5-32b, qwen3.5-27b, llama3-8b.
    #[arg(long)]
    shape: Option<String>,
    /// Quantization of the --shape: Q8_0, Q6_K, Q5_K_M, Q4_K_M, Q4_K_S, IQ4_XS, Q4_0, Q3_K_M,
    /// Q3_K_S, F16, F32 (llama.cpp's mixes).
    #[arg(long = "type", default_value = "Q4_K_M", requires = "shape")]
    ftype: String,
    /// GPU from the built-in table: v100-16gb, v100-32gb, t4, p40, a10, l4, a100-40gb,
    /// a100-80gb, rtx3090, rtx4090, h100, h200. Without --gpu or --vram: a CPU-only plan.
    #[arg(long)]
    gpu: Option<String>,
    /// Usable GPU memory (e.g. 15.5GiB, 16GB, 12000MiB; a bare number is GiB). Overrides the
    /// table's figure.
    #[arg(long)]
    vram: Option<String>,
    /// GPU memory bandwidth, GB/s (with --vram for a card not in the table; default 900).
    #[arg(long)]
    bandwidth: Option<f64>,
    /// Host memory bandwidth for layers left on the CPU, GB/s.
    #[arg(long = "host-bandwidth", default_value_t = model::plan::DEFAULT_HOST_BANDWIDTH_GBS)]
    host_bandwidth: f64,
    /// Context (KV positions) over all slots; default 4096 per slot (at most the training context).
    #[arg(short = 'c', long = "ctx", visible_alias = "ctx-size")]
    ctx: Option<usize>,
    /// KV cache type for keys: f16, q8_0, q4_0, f32.
    #[arg(long = "cache-type-k", visible_alias = "ctk", default_value = "f16")]
    cache_type_k: String,
    /// KV cache type for values.
    #[arg(long = "cache-type-v", visible_alias = "ctv", default_value = "f16")]
    cache_type_v: String,
    /// Concurrent sequences (slots).
    #[arg(long = "parallel", visible_alias = "np", default_value_t = 1)]
    parallel: usize,
    /// Micro-batch size (rows per forward call; sizes the compute buffers).
    #[arg(long = "ubatch", visible_alias = "ub", default_value_t = 512)]
    ubatch: usize,
    /// Force this many layers on the GPU (the output head counts as the first).
    #[arg(long = "n-gpu-layers", visible_alias = "ngl")]
    n_gpu_layers: Option<usize>,
    /// Count the token-embedding table in VRAM (default: host memory, as llama.cpp).
    #[arg(long = "embeddings-on-gpu")]
    embeddings_on_gpu: bool,
    /// Speculate with the model's MTP layer (as `run --mtp`): count the layer, its KV cache
    /// and the speculation buffers.
    #[arg(long)]
    mtp: bool,
    /// Draft model for speculative decoding (as `run --md`): count its weights, its f16 KV
    /// cache at -c and the speculation buffers, placed whole on the GPU.
    #[arg(long = "model-draft", visible_alias = "md", conflicts_with = "mtp")]
    model_draft: Option<PathBuf>,
    /// Most tokens drafted per verify pass (sizes the verify logits; with --md / --mtp).
    #[arg(long = "draft-max", default_value_t = 8)]
    draft_max: usize,
    /// Plan over this many identical cards (--gpu / --vram, one each), split by
    /// --split-mode (layer by default; tensor for tensor parallel) and --tensor-split.
    #[arg(long, default_value_t = 1)]
    gpus: usize,
    /// With --gpus N: layer (each card a run of whole layers), tensor (every matrix split
    /// across the cards), none (one card).
    #[arg(long = "split-mode", value_parser = super::device_args::parse_split_mode)]
    split_mode: Option<model::plan::SplitMode>,
    /// With --gpus N: each card's share, e.g. 3,1 (default: equal, by free memory).
    #[arg(long = "tensor-split", value_parser = super::device_args::parse_tensor_split)]
    tensor_split: Option<super::device_args::TensorSplit>,
    /// With --gpus N and --split-mode none: the card used (and in tensor mode the one holding
    /// the token embedding).
    #[arg(long = "main-gpu", default_value_t = 0)]
    main_gpu: usize,
    /// Print the plan as one JSON object.
    #[arg(long)]
    json: bool,
}

/// Parses "15.5GiB", "16GB", "12000MiB", "16G", or a bare number of GiB, into bytes.
fn parse_size(s: &str) -> anyhow::Result<u64> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let x: f64 = num
        .parse()
        .with_context(|| format!("--vram {s:?}: expected a size like 15.5GiB"))?;
    let mult = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "g" | "gib" => (1u64 << 30) as f64,
        "gb" => 1e9,
        "m" | "mib" => (1u64 << 20) as f64,
        "mb" => 1e6,
        "t" | "tib" => (1u64 << 40) as f64,
        "tb" => 1e12,
        "b" => 1.0,
        other => bail!("--vram {s:?}: unknown unit {other:?}"),
    };
    if !(x.is_finite() && x > 0.0) {
        bail!("--vram {s:?} must be positive");
    }
    Ok((x * mult) as u64)
}

fn kv_type(flag: &str, name: &str) -> anyhow::Result<KvType> {
    KvType::from_name(name)
        .with_context(|| format!("unknown {flag} {name:?}; known: f16, q8_0, q4_0, f32"))
}

fn model_memory(args: &Args) -> anyhow::Result<ModelMemory> {
    if let Some(name) = &args.shape {
        let Some(shape) = Shape::preset(name) else {
            let names: Vec<String> = Shape::presets().into_iter().map(|s| s.name).collect();
            bail!("unknown shape {name:?}; known: {}", names.join(", "));
        };
        let Some(ftype) = FileType::from_name(&args.ftype) else {
            let names: Vec<&str> = FileType::ALL.iter().map(|t| t.name()).collect();
            bail!("unknown type {:?}; known: {}", args.ftype, names.join(", "));
        };
        return Ok(ModelMemory::from_shape(&shape, ftype));
    }
    let Some(path) = args.file.as_ref().or(args.model.as_ref()) else {
        bail!("give a model file (redline plan MODEL, or -m MODEL) or a built-in --shape");
    };
    let file = gguf::GgufFile::open(path).with_context(|| format!("reading {}", path.display()))?;
    ModelMemory::from_gguf(&file).with_context(|| format!("planning {}", path.display()))
}

/// What `--md` / `--mtp` add (f16 draft KV, as `run` allocates it).
fn speculation(args: &Args, m: &ModelMemory) -> anyhow::Result<Option<Speculation>> {
    let draft = match &args.model_draft {
        Some(path) => {
            let file = gguf::GgufFile::open(path)
                .with_context(|| format!("reading the draft model {}", path.display()))?;
            let d = ModelMemory::from_gguf(&file)
                .with_context(|| format!("planning the draft model {}", path.display()))?;
            Some(Box::new(d))
        }
        None if args.mtp && m.n_mtp_layer > 0 => None,
        None => {
            if args.mtp {
                eprintln!("warning: --mtp: the model has no multi-token-prediction layer");
            }
            return Ok(None);
        }
    };
    Ok(Some(Speculation {
        draft,
        draft_kv: KvType::F16,
        draft_max: args.draft_max,
    }))
}

fn gpu_spec(args: &Args) -> anyhow::Result<Option<GpuSpec>> {
    let mut gpu = match &args.gpu {
        Some(name) => Some(GpuSpec::from_table(name).with_context(|| {
            format!(
                "unknown GPU {name:?}; known: {} (or give --vram and --bandwidth)",
                GpuSpec::table_names().join(", ")
            )
        })?),
        None => None,
    };
    if let Some(v) = &args.vram {
        let bytes = parse_size(v)?;
        gpu = Some(match gpu {
            Some(g) => GpuSpec {
                name: format!("{} (limited to {})", g.name, size(bytes)),
                usable_bytes: bytes,
                ..g
            },
            None => GpuSpec::custom(bytes, 900.0),
        });
    }
    if let Some(bw) = args.bandwidth {
        if !(bw.is_finite() && bw > 0.0) {
            bail!("--bandwidth must be a positive number of GB/s");
        }
        match gpu.as_mut() {
            Some(g) => g.bandwidth_gbs = bw,
            None => bail!("--bandwidth needs --gpu or --vram"),
        }
    }
    Ok(gpu)
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let m = model_memory(&args)?;
    let gpu = gpu_spec(&args)?;
    if args.parallel == 0 {
        bail!("--parallel must be at least 1");
    }
    if !(args.host_bandwidth.is_finite() && args.host_bandwidth > 0.0) {
        bail!("--host-bandwidth must be a positive number of GB/s");
    }
    let mut opts = PlanOptions::for_model(&m);
    opts.n_parallel = args.parallel;
    opts.n_ctx = args.ctx.unwrap_or(opts.n_ctx * args.parallel);
    if opts.n_ctx > model::plan::MAX_CTX || args.parallel > model::plan::MAX_PARALLEL {
        bail!(
            "-c {} / --parallel {} is beyond what the planner accepts ({} tokens, {} slots)",
            opts.n_ctx,
            args.parallel,
            model::plan::MAX_CTX,
            model::plan::MAX_PARALLEL
        );
    }
    if opts.n_ctx < args.parallel {
        bail!("-c {} is less than one token per slot", opts.n_ctx);
    }
    opts.cache_type_k = kv_type("--cache-type-k", &args.cache_type_k)?;
    opts.cache_type_v = kv_type("--cache-type-v", &args.cache_type_v)?;
    opts.n_ubatch = args.ubatch.max(1);
    opts.host_bandwidth_gbs = args.host_bandwidth;
    opts.use_mtp = args.mtp;
    opts.speculation = speculation(&args, &m)?;
    opts.embeddings_on_gpu = args.embeddings_on_gpu;
    opts.n_gpu_layers = args.n_gpu_layers;
    if args.gpus != 1 || args.split_mode.is_some() || args.tensor_split.is_some() {
        return run_split(&args, &m, gpu, opts);
    }
    let p = plan(&m, gpu.as_ref(), &opts);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&p)?);
    } else {
        print!("{}", render(&p));
    }
    Ok(())
}

/// `redline plan --gpus N`: the model over N identical cards (`commands::multi_gpu` renders
/// the per-card ledger).
fn run_split(
    args: &Args,
    m: &ModelMemory,
    gpu: Option<GpuSpec>,
    mut opts: PlanOptions,
) -> anyhow::Result<()> {
    use model::plan::{SplitMode, SplitRequest};
    let Some(gpu) = gpu else {
        bail!("--gpus / --split-mode / --tensor-split need a card: give --gpu NAME or --vram");
    };
    if args.gpus == 0 || args.gpus > 64 {
        bail!("--gpus must be between 1 and 64");
    }
    if opts.n_gpu_layers.is_some() {
        bail!("-ngl does not apply to a split over several cards (every layer is on a card)");
    }
    opts.embeddings_on_gpu = true;
    let mode = args.split_mode.unwrap_or(SplitMode::Layer);
    let req = SplitRequest {
        mode,
        tensor_split: args.tensor_split.as_ref().map(|t| t.0.clone()),
        main_gpu: args.main_gpu,
    };
    let gpus = vec![gpu; args.gpus];
    let Some(p) = model::plan::plan_split(m, &gpus, &opts, &req) else {
        bail!(
            "--tensor-split names more cards than --gpus {}, or gives none anything; or --main-gpu {} is not one of them",
            args.gpus,
            args.main_gpu
        );
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&p)?);
    } else {
        let how = match (&args.tensor_split, mode) {
            (_, SplitMode::None) => format!("--main-gpu {}", args.main_gpu),
            (Some(t), _) => format!(
                "--tensor-split {}",
                t.0.iter()
                    .map(|x| x.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            (None, _) => "equal shares".into(),
        };
        print!("{}", super::multi_gpu::render_split(&p, &how));
    }
    Ok(())
}

/// "15.17 GiB" from 1 GiB up, "256.0 MiB" below.
fn size(bytes: u64) -> String {
    let b = bytes as f64;
    if b >= (1u64 << 30) as f64 {
        format!("{:.2} GiB", b / (1u64 << 30) as f64)
    } else if b >= (1u64 << 20) as f64 {
        format!("{:.1} MiB", b / (1u64 << 20) as f64)
    } else {
        format!("{:.1} KiB", b / 1024.0)
    }
}

/// "26.90 B", "1.4 M".
fn params(n: u64) -> String {
    if n >= 1_000_000_000 {
        format!("{:.2} B", n as f64 / 1e9)
    } else {
        format!("{:.1} M", n as f64 / 1e6)
    }
}

fn gb(bytes: u64) -> String {
    format!("{:.2} GB", bytes as f64 / 1e9)
}

fn ctx_name(n: usize) -> String {
    if n >= 1024 && n.is_multiple_of(1024) {
        format!("{}K", n / 1024)
    } else {
        n.to_string()
    }
}

/// Consecutive indices as "0–58, 60".
fn ranges(idx: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < idx.len() {
        let mut j = i;
        while j + 1 < idx.len() && idx[j + 1] == idx[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            idx[i].to_string()
        } else {
            format!("{}–{}", idx[i], idx[j])
        });
        i = j + 1;
    }
    out.join(", ")
}

/// The human-readable plan.
pub fn render(p: &Plan) -> String {
    let mut s = String::new();
    let l = &p.ledger;
    let ft = p.file_type.as_deref().unwrap_or("?");
    let weights = l.layer_weights + l.output_head + l.token_embedding + l.mtp_weights;
    let _ = writeln!(
        s,
        "model    {} ({}, {ft}): {} params, {} of weights",
        p.model,
        p.arch,
        params(p.n_params),
        gb(weights)
    );
    let mut kinds = format!("{} layers", p.n_layer);
    if p.n_recurrent_layers > 0 {
        let _ = write!(
            kinds,
            " ({} attention, {} recurrent DeltaNet)",
            p.n_attention_layers, p.n_recurrent_layers
        );
    }
    if p.n_mtp_layers > 0 {
        let _ = write!(kinds, " + {} MTP", p.n_mtp_layers);
    }
    let _ = writeln!(s, "         {kinds}; trained context {}", p.n_ctx_train);
    match &p.gpu {
        Some(g) => {
            let _ = writeln!(
                s,
                "device   {}: {} usable, {:.0} GB/s (host memory {:.0} GB/s)",
                g.name,
                size(g.usable_bytes),
                g.bandwidth_gbs,
                p.host_bandwidth_gbs
            );
        }
        None => {
            let _ = writeln!(
                s,
                "device   CPU only (host memory {:.0} GB/s; give --gpu NAME or --vram/--bandwidth to plan for a GPU)",
                p.host_bandwidth_gbs
            );
        }
    }
    let _ = writeln!(
        s,
        "context  {} tokens = {} slot(s) × {}, K {} / V {}, micro-batch {}",
        p.n_ctx, p.n_parallel, p.n_ctx_per_slot, p.cache_type_k, p.cache_type_v, p.n_ubatch
    );
    let _ = writeln!(s);

    // Ledger, split by where each part is placed.
    // (GPU, host) bytes of each kind.
    let (mut weights, mut kv, mut state, mut mtp) =
        ((0u64, 0u64), (0u64, 0u64), (0u64, 0u64), (0u64, 0u64));
    for layer in &p.layers {
        let on_gpu = layer.device == Device::Gpu;
        let add = |pair: &mut (u64, u64), b: u64| {
            if on_gpu {
                pair.0 += b
            } else {
                pair.1 += b
            }
        };
        match layer.kind {
            LayerKind::Mtp => add(&mut mtp, layer.weight_bytes + layer.cache_bytes),
            LayerKind::Recurrent => {
                add(&mut weights, layer.weight_bytes);
                add(&mut state, layer.cache_bytes);
            }
            LayerKind::Attention => {
                add(&mut weights, layer.weight_bytes);
                add(&mut kv, layer.cache_bytes);
            }
        }
    }
    let head_gpu = p.output_head_device == Device::Gpu;
    let cell = |b: u64| if b == 0 { String::new() } else { size(b) };
    let gpu_fixed = p.gpu.is_some();
    let mut rows: Vec<(String, u64, u64)> = vec![
        (
            format!("layer weights ({} layers)", p.n_layer),
            weights.0,
            weights.1,
        ),
        (
            "output head + norm".into(),
            if head_gpu { l.output_head } else { 0 },
            if head_gpu { 0 } else { l.output_head },
        ),
        (
            "token embeddings (1 row read/token)".into(),
            if p.embeddings_on_gpu {
                l.token_embedding
            } else {
                0
            },
            if p.embeddings_on_gpu {
                0
            } else {
                l.token_embedding
            },
        ),
    ];
    if p.n_attention_layers > 0 {
        rows.push((
            format!(
                "KV cache ({} × {} tokens)",
                size(p.kv_bytes_per_token).replace(".0 KiB", " KiB"),
                p.n_ctx
            ),
            kv.0,
            kv.1,
        ));
    }
    if p.n_recurrent_layers > 0 {
        rows.push((
            format!(
                "recurrent state ({}/seq × {})",
                size(p.state_bytes_per_seq),
                p.n_parallel
            ),
            state.0,
            state.1,
        ));
    }
    if l.mtp_weights > 0 {
        let label = if mtp.0 + mtp.1 > 0 {
            "MTP layers + KV"
        } else {
            "MTP layers (not loaded; --mtp)"
        };
        rows.push((label.into(), mtp.0, mtp.1));
    }
    // Speculation: the draft model runs whole beside the model, with the fixed costs.
    let fixed = |b: u64| if gpu_fixed { (b, 0) } else { (0, b) };
    for (label, b) in [
        ("draft model weights".to_owned(), l.draft_weights),
        (
            format!("draft KV cache ({} tokens)", p.n_ctx),
            l.draft_cache,
        ),
        (
            "speculation buffers (state copy, logits)".to_owned(),
            l.speculation_buffers,
        ),
    ] {
        if b > 0 {
            let (g, h) = fixed(b);
            rows.push((label, g, h));
        }
    }
    let c = l.compute;
    let (cg, ch) = if gpu_fixed {
        (c.total(), 0)
    } else {
        (0, c.total())
    };
    rows.push((format!("compute buffers (ubatch {})", p.n_ubatch), cg, ch));
    if gpu_fixed {
        rows.push((
            "runtime: CUDA context, cuBLAS (est.)".into(),
            l.runtime_overhead,
            0,
        ));
        if l.logits_download > 0 {
            rows.push((
                "logits download buffer (page-locked)".into(),
                0,
                l.logits_download,
            ));
        }
    }
    let _ = writeln!(s, "{:<42} {:>12} {:>12}", "memory ledger", "GPU", "host");
    for (label, g, h) in &rows {
        let _ = writeln!(s, "  {label:<40} {:>12} {:>12}", cell(*g), cell(*h));
        if label.starts_with("compute") {
            let _ = writeln!(
                s,
                "    (logits {}, activations {}, attention {})",
                size(c.logits),
                size(c.activations),
                size(c.attention)
            );
        }
    }
    let tg: u64 = rows.iter().map(|r| r.1).sum();
    let th: u64 = rows.iter().map(|r| r.2).sum();
    let _ = writeln!(s, "  {:<40} {:>12} {:>12}", "total", cell(tg), cell(th));
    let _ = writeln!(s);

    let on_host: Vec<usize> = p
        .layers
        .iter()
        .filter(|l| l.device == Device::Host && l.kind != LayerKind::Mtp)
        .map(|l| l.index)
        .collect();
    match &p.gpu {
        Some(g) => {
            if p.fits {
                let _ = writeln!(
                    s,
                    "fits: yes, {} of {} usable ({} free)",
                    size(p.gpu_bytes_full),
                    size(g.usable_bytes),
                    size(g.usable_bytes - p.gpu_bytes_full)
                );
            } else {
                let _ = writeln!(
                    s,
                    "fits: no, needs {} of {} usable (short by {})",
                    size(p.gpu_bytes_full),
                    size(g.usable_bytes),
                    size(p.short_by_bytes)
                );
            }
            let _ = write!(
                s,
                "offloaded {}/{} layers to GPU",
                p.layers_on_gpu, p.layers_total
            );
            if on_host.is_empty() {
                let _ = writeln!(s);
            } else {
                let head = if head_gpu { "" } else { "output head and " };
                let _ = writeln!(s, "; {head}layers {} run on the CPU", ranges(&on_host));
            }
            if p.gpu_bytes_placed > g.usable_bytes {
                let _ = writeln!(
                    s,
                    "warning: -ngl puts {} on a card with {} usable: it will not load",
                    size(p.gpu_bytes_placed),
                    size(g.usable_bytes)
                );
            }
            let _ = writeln!(
                s,
                "decode ceiling: {:.1} tok/s ({:.0} GB/s ÷ {} read per token; {:.1} tok/s at {} tokens deep)",
                p.ceiling_tok_s,
                g.bandwidth_gbs,
                gb(p.bytes_per_token),
                g.bandwidth_gbs * 1e9 / p.bytes_per_token_full_ctx as f64,
                p.n_ctx_per_slot
            );
            if p.host_bytes_per_token > 0 {
                let _ = writeln!(
                    s,
                    "expected: {:.1} tok/s (bandwidth-bound) with {} per token read from host memory ({:.1}× slower than the ceiling)",
                    p.expected_tok_s,
                    gb(p.host_bytes_per_token),
                    p.ceiling_tok_s / p.expected_tok_s
                );
            } else {
                let _ = writeln!(
                    s,
                    "expected: up to {:.1} tok/s (bandwidth-bound, all layers on the GPU)",
                    p.expected_tok_s
                );
            }
        }
        None => {
            let _ = writeln!(
                s,
                "decode ceiling: {:.1} tok/s on the CPU ({:.0} GB/s ÷ {} read per token)",
                p.ceiling_tok_s,
                p.host_bandwidth_gbs,
                gb(p.bytes_per_token)
            );
        }
    }

    if let (Some(sg), Some(g)) = (&p.suggestions, &p.gpu) {
        let _ = writeln!(s);
        let _ = writeln!(s, "what would fit on {}:", g.name);
        let ctxs: Vec<String> = sg
            .contexts
            .iter()
            .map(|c| {
                format!(
                    "{} KV {}",
                    c.cache_type,
                    c.max_ctx.map_or("none".into(), ctx_name)
                )
            })
            .collect();
        let slots = if p.n_parallel > 1 {
            format!(" (total over {} slots)", p.n_parallel)
        } else {
            String::new()
        };
        let _ = writeln!(
            s,
            "  largest context with this file{slots}: {}",
            ctxs.join(", ")
        );
        let _ = writeln!(
            s,
            "  {:<8} {:>9}  {:<22} {:>16} {:>14} {:>14}",
            "quant",
            "size",
            format!("fits ({}, {})", ctx_name(p.n_ctx), p.cache_type_k),
            "max ctx q8_0 KV",
            "ceiling tok/s",
            "expected tok/s"
        );
        for q in &sg.quants {
            let mark = if Some(&q.file_type) == p.file_type.as_ref() {
                "*"
            } else {
                " "
            };
            let fits = if q.fits {
                "yes".to_owned()
            } else {
                format!("no ({}/{} on GPU)", q.layers_on_gpu, p.layers_total)
            };
            let _ = writeln!(
                s,
                "{mark} {:<8} {:>9}  {:<22} {:>16} {:>14.1} {:>14.1}",
                q.file_type,
                gb(q.weight_bytes),
                fits,
                q.max_ctx_q8_0.map_or("-".into(), ctx_name),
                q.ceiling_tok_s,
                q.expected_tok_s
            );
        }
    }
    // No trailing blanks from empty cells.
    s.lines().map(|l| format!("{}\n", l.trim_end())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_units() {
        assert_eq!(parse_size("16").unwrap(), 16 << 30);
        assert_eq!(
            parse_size("15.5GiB").unwrap(),
            (15.5 * (1u64 << 30) as f64) as u64
        );
        assert_eq!(parse_size("16GB").unwrap(), 16_000_000_000);
        assert_eq!(parse_size("12000MiB").unwrap(), 12000 << 20);
        assert!(parse_size("abc").is_err());
        assert!(parse_size("16XB").is_err());
        assert!(parse_size("0").is_err());
    }

    #[test]
    fn index_ranges() {
        assert_eq!(ranges(&[59, 60, 61, 63]), "59–61, 63");
        assert_eq!(ranges(&[]), "");
    }
}
