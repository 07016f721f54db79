//! `redline serve -m MODEL`: the OpenAI-compatible HTTP server.
//!
//! The port is bound first and `/health` answers 503 while the model loads; then the
//! memory ledger is logged and requests are served by `--parallel` slots decoded together.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use engine::scheduler::SamplingParams;
use model::KvType;
use server::{
    AppState, DraftOptions, ModelService, ModelServiceOptions, ServerConfig, SlotDrafter,
};

use super::device_args::PlacementArgs;
use super::placement::{load_placed, LoadRequest, LoadedModel, LogTo};
use super::run::{ModelArgs, SamplingArgs};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Slots: requests decoded together in one batched step.
    #[arg(long = "parallel", visible_alias = "np", default_value_t = 4)]
    parallel: usize,
    /// Total context in tokens, shared evenly by the slots (0: the model's training context
    /// per slot, at most 4096; --fit on may reduce it to fit the GPU).
    #[arg(short = 'c', long = "ctx-size", default_value_t = 0)]
    ctx_size: usize,
    /// KV cache type for keys (f32, f16, q8_0, q4_0).
    #[arg(long = "cache-type-k", visible_alias = "ctk", default_value = "f16")]
    cache_type_k: String,
    /// KV cache type for values; must equal --cache-type-k.
    #[arg(long = "cache-type-v", visible_alias = "ctv", default_value = "f16")]
    cache_type_v: String,
    #[command(flatten)]
    placement: PlacementArgs,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// Speculative decoding per slot: --md DRAFT.gguf, --draft-max …
    #[command(flatten)]
    spec: super::speculate::SpecArgs,
    /// Model name shown to clients (default: the file name without .gguf).
    #[arg(long)]
    alias: Option<String>,
    /// Require `Authorization: Bearer KEY` on every route but /health and the chat page.
    #[arg(long = "api-key")]
    api_key: Option<String>,
    /// Read the API key from a file (first line).
    #[arg(long = "api-key-file")]
    api_key_file: Option<PathBuf>,
    /// Jinja chat template to use instead of the model's.
    #[arg(long = "chat-template-file")]
    chat_template_file: Option<PathBuf>,
    /// Requests that may wait for a slot before new ones get 503.
    #[arg(long = "max-queue", default_value_t = 64)]
    max_queue: usize,
    /// Prompt tokens computed per scheduler step (bounds how long a new prompt stalls streams).
    #[arg(long = "prefill-chunk", visible_alias = "ub", default_value_t = 256)]
    prefill_chunk: usize,
    /// Largest request body in bytes.
    #[arg(long = "max-body", default_value_t = 8 << 20)]
    max_body: usize,
    /// Seconds running streams get to finish after SIGTERM.
    #[arg(long = "shutdown-grace", default_value_t = 30)]
    shutdown_grace: u64,
}

fn sampling_defaults(s: &SamplingArgs) -> SamplingParams {
    SamplingParams {
        temperature: s.temp,
        top_k: s.top_k,
        top_p: s.top_p,
        min_p: s.min_p,
        presence_penalty: s.presence_penalty,
        frequency_penalty: s.frequency_penalty,
        logit_bias: Vec::new(),
        seed: s.seed,
    }
}

fn human_bytes(b: u64) -> String {
    match b {
        b if b >= 1 << 30 => format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64),
        b if b >= 1 << 20 => format!("{:.2} MiB", b as f64 / (1u64 << 20) as f64),
        b => format!("{:.1} KiB", b as f64 / 1024.0),
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_target(false)
        // colour codes only on a terminal: a log file or journald gets plain text
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .try_init();
    let kv_type = KvType::from_name(&args.cache_type_k)
        .with_context(|| format!("unknown --cache-type-k {:?}", args.cache_type_k))?;
    if KvType::from_name(&args.cache_type_v) != Some(kv_type) {
        bail!(
            "--cache-type-v must equal --cache-type-k ({}) in this build",
            args.cache_type_k
        );
    }
    if args.parallel == 0 {
        bail!("--parallel must be at least 1");
    }
    // Flag checks that need no model come before the port is bound and the model loaded.
    args.spec.check()?;
    if args.sampling.repeat_penalty != 1.0 {
        tracing::warn!(
            "--repeat-penalty is not used by the server; use presence/frequency penalties"
        );
    }
    let api_key = match (&args.api_key, &args.api_key_file) {
        (Some(k), None) => Some(k.trim().to_string()),
        (None, Some(f)) => {
            let text =
                std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
            Some(text.lines().next().unwrap_or("").trim().to_string())
        }
        (None, None) => None,
        (Some(_), Some(_)) => bail!("give --api-key or --api-key-file, not both"),
    };
    if api_key.as_deref() == Some("") {
        bail!("the API key is empty");
    }
    let chat_template = match &args.chat_template_file {
        Some(f) => {
            Some(std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?)
        }
        None => None,
    };
    let addr: SocketAddr = format!("{}:{}", args.host, args.port)
        .parse()
        .with_context(|| format!("bad --host/--port {}:{}", args.host, args.port))?;

    let config = ServerConfig {
        api_key,
        defaults: sampling_defaults(&args.sampling),
        max_body_bytes: args.max_body,
    };
    let state = AppState::new(config);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let grace = Duration::from_secs(args.shutdown_grace);
    let stopping = state.clone();
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding {addr}"))?;
        tracing::info!(
            "listening on http://{} (health is 503 until the model is loaded)",
            listener.local_addr()?
        );
        let loader_state = state.clone();
        let loading =
            tokio::task::spawn_blocking(move || load(&args, kv_type, chat_template, &loader_state));
        let serving = tokio::spawn(server::serve(
            listener,
            state.clone(),
            server::shutdown::termination_signal(),
            grace,
        ));
        match loading.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(e) => bail!("model loading panicked: {e}"),
        }
        serving.await.context("server task")?.context("serving")
    })?;
    // Any stream still open after the grace period is cancelled with its connection here.
    drop(runtime);
    // The generation thread frees its model states on the way out: the process must not exit
    // under it (on the GPU the driver's teardown at exit crashed a late free).
    if let Some(service) = stopping.loaded_service() {
        service.shutdown();
        if !service.wait_stopped(Duration::from_secs(10)) {
            tracing::warn!("the generation thread did not stop within 10 s; exiting anyway");
        }
    }
    Ok(())
}

/// The service over `model`, with the slots speculating when --md asks for it (the draft
/// model is loaded here, placed like the model; the plan already counted it).
fn service_on<B: super::speculate::SpecBackend + 'static>(
    args: &Args,
    model: model::ModelOn<B>,
    opts: ModelServiceOptions,
    n_ctx_per_slot: usize,
) -> anyhow::Result<ModelService> {
    use super::speculate::{load_drafter, Drafter};
    let model = Arc::new(model);
    let draft = if args.spec.enabled() {
        match load_drafter(
            &args.spec,
            &model,
            &args.model,
            &args.placement,
            n_ctx_per_slot,
        )? {
            Drafter::Model(d) => Some(DraftOptions {
                drafter: SlotDrafter::Model(Arc::new(*d)),
                kv_type: KvType::F16,
                spec: args.spec.options(),
            }),
            Drafter::Mtp => Some(DraftOptions {
                drafter: SlotDrafter::Mtp,
                kv_type: KvType::F16,
                spec: args.spec.options(),
            }),
        }
    } else {
        None
    };
    if let Some(d) = &draft {
        tracing::info!(
            "speculative decoding per slot: {}, --draft-max {}, --draft-min {}, --draft-p-min {}",
            match &d.drafter {
                SlotDrafter::Model(m) => format!(
                    "draft model {} ({} layers)",
                    args.spec
                        .model_draft
                        .as_ref()
                        .map_or_else(String::new, |p| p.display().to_string()),
                    m.config().n_layer
                ),
                SlotDrafter::Mtp => "the model's MTP layer".to_string(),
            },
            d.spec.draft_max,
            d.spec.draft_min,
            d.spec.p_min
        );
    }
    ModelService::with_drafter(model, draft, opts).map_err(|e| anyhow::anyhow!("{e}"))
}

/// Loads the model where the placement says, logs the memory ledger and the offload, and
/// makes the service available.
fn load(
    args: &Args,
    kv_type: KvType,
    chat_template: Option<String>,
    state: &AppState,
) -> anyhow::Result<()> {
    let t0 = std::time::Instant::now();
    if args.ctx_size > 0 && args.ctx_size / args.parallel < 16 {
        bail!(
            "-c {} over {} slots leaves {} tokens per slot; give a larger -c",
            args.ctx_size,
            args.parallel,
            args.ctx_size / args.parallel
        );
    }
    let req = LoadRequest {
        n_ctx: (args.ctx_size > 0).then_some(args.ctx_size),
        n_parallel: args.parallel,
        kv_type,
        measure_bandwidth: false,
        draft: args.spec.draft_request(),
    };
    let placed = load_placed(&args.model, &args.placement, &req, LogTo::Tracing)?;
    let n_ctx_per_slot = placed.n_ctx / args.parallel;
    if n_ctx_per_slot < 16 {
        bail!(
            "{} tokens of context over {} slots leaves {n_ctx_per_slot} per slot",
            placed.n_ctx,
            args.parallel
        );
    }
    let c = &placed.plan;
    tracing::info!(
        "loaded {} ({}, {} layers, {}) on {} in {:.2}s",
        args.model.display_name(),
        c.arch,
        c.n_layer,
        c.file_type.as_deref().unwrap_or("?"),
        placed.device_name,
        t0.elapsed().as_secs_f64()
    );
    tracing::info!(
        "KV cache + state per slot {} ({} tokens, {kv_type}); allocated when a slot is first used",
        human_bytes((c.ledger.kv_cache + c.ledger.recurrent_state) / args.parallel as u64),
        n_ctx_per_slot
    );
    let id = args
        .alias
        .clone()
        .unwrap_or_else(|| match &args.model.model {
            Some(p) => p.file_stem().map_or_else(
                || p.display().to_string(),
                |s| s.to_string_lossy().into_owned(),
            ),
            None => "stories260K".into(),
        });
    let opts = ModelServiceOptions {
        id,
        n_slots: args.parallel,
        n_ctx_per_slot,
        kv_type,
        max_queue: args.max_queue,
        prefill_chunk: args.prefill_chunk,
        chat_template,
    };
    let service = match placed.model {
        LoadedModel::Cpu(m) => service_on(args, m, opts, n_ctx_per_slot)?,
        LoadedModel::Cuda(m) => service_on(args, m, opts, n_ctx_per_slot)?,
        LoadedModel::Hybrid(m) => service_on(args, m, opts, n_ctx_per_slot)?,
        LoadedModel::Multi(m) => service_on(args, m, opts, n_ctx_per_slot)?,
    };
    state.set_service(Arc::new(service));
    tracing::info!("ready: {} slots × {} tokens", args.parallel, n_ctx_per_slot);
    Ok(())
}
