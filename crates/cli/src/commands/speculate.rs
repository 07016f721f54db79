//! Speculative decoding from the command line.
//!
//! - `redline run -p … --md DRAFT.gguf` (or `--mtp` for a Qwen3.5 file with MTP layers): one
//!   completion with speculation, then the acceptance rate and tok/s (`--json`: both in the
//!   object). `run` hands over to [`one_shot`] when [`SpecArgs::enabled`].
//! - `redline verify-bench -m MODEL -k 1,2,4,8`: the cost of one verify pass of k tokens
//!   (one batched forward, logits of every row) against one decode step, after `-d` tokens
//!   of context; with `--md` / `--mtp` also the cost of one draft step. Speculation pays when
//!   a pass of k tokens costs close to one decode step.

use std::io::Write;
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context};
use backend::cpu::CpuBackend;
use backend::Backend;
use cuda::backend::CudaBackend;
use cuda::hybrid::HybridBackend;
use engine::generate::{GenerateParams, Generation};
use engine::sampler::{Sampler, SamplerConfig};
use engine::speculative::{
    generate_speculative, DraftModelSpec, MtpSpec, SpecModel, SpecOptions, SpecStats,
};
use engine::Tokenizer;
use model::{KvType, ModelOn, SeqStateOn};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::bench::mean_sd;
use super::device_args::PlacementArgs;
use super::placement::{load_placed, DraftRequest, LoadRequest, LoadedModel, LogTo, Placed};
use super::run::ModelArgs;

/// Speculative-decoding flags, named as llama.cpp's (`-md` is spelled `--md`).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct SpecArgs {
    /// Draft model for speculative decoding (same vocabulary as the model).
    #[arg(long = "model-draft", visible_alias = "md")]
    pub model_draft: Option<PathBuf>,
    /// Speculate with the model's own multi-token-prediction layer (Qwen3.5 files with MTP).
    #[arg(long)]
    pub mtp: bool,
    /// Most tokens drafted per verify pass.
    #[arg(long = "draft-max", visible_alias = "draft", default_value_t = 8)]
    pub draft_max: usize,
    /// Drafts shorter than this are not verified (a plain decode step instead).
    #[arg(long = "draft-min", default_value_t = 0)]
    pub draft_min: usize,
    /// Stop drafting before a token the drafter gives less than this probability.
    #[arg(long = "draft-p-min", default_value_t = 0.75)]
    pub draft_p_min: f32,
}

impl SpecArgs {
    pub fn enabled(&self) -> bool {
        self.model_draft.is_some() || self.mtp
    }

    /// Rejects flag combinations that cannot work, before any model is loaded (a 20 GB load
    /// should not end in "pick one drafter"). Each message says what to change.
    pub fn check(&self) -> anyhow::Result<()> {
        if let (true, Some(d)) = (self.mtp, &self.model_draft) {
            bail!(
                "--mtp and --md {} both name a drafter; give one of them: --mtp drafts with the \
                 model's own multi-token-prediction layer (Qwen3.5 files that have one), --md \
                 with a separate small model of the same vocabulary",
                d.display()
            );
        }
        if !self.enabled() {
            return Ok(());
        }
        if let Some(d) = &self.model_draft {
            if !d.is_file() {
                bail!(
                    "--md {}: no such file; give the path of a draft GGUF with the model's \
                     vocabulary",
                    d.display()
                );
            }
        }
        if self.draft_max == 0 {
            bail!("--draft-max 0 drafts nothing; give --draft-max 1 or more, or drop --md / --mtp");
        }
        if self.draft_min > self.draft_max {
            bail!(
                "--draft-min {} is above --draft-max {}: every draft would be dropped; lower \
                 --draft-min or raise --draft-max",
                self.draft_min,
                self.draft_max
            );
        }
        if !(0.0..=1.0).contains(&self.draft_p_min) {
            bail!(
                "--draft-p-min {} is not a probability; give a value in 0..=1 (0 drafts \
                 --draft-max tokens every step)",
                self.draft_p_min
            );
        }
        Ok(())
    }

    /// What the placement must make room for (None without `--md` / `--mtp`). Draft caches
    /// are f16, as [`one_shot`] allocates them.
    pub fn draft_request(&self) -> Option<DraftRequest> {
        self.enabled().then(|| DraftRequest {
            model: if self.mtp {
                None
            } else {
                self.model_draft.clone()
            },
            kv_type: KvType::F16,
            draft_max: self.draft_max,
        })
    }

    pub fn options(&self) -> SpecOptions {
        SpecOptions {
            draft_max: self.draft_max,
            draft_min: self.draft_min,
            p_min: self.draft_p_min,
        }
    }
}

/// Backends a draft model can be loaded on: pulls the model of this backend's kind out of
/// a placement result.
pub trait SpecBackend: Backend {
    fn take(m: LoadedModel) -> Option<ModelOn<Self>>;

    /// Keeps this backend's verify passes on the grids its one-token steps quantize
    /// activations to (nothing to do where there is one kind of product).
    fn speculation_kernels(_model: &ModelOn<Self>) {}

    /// Which kernels this backend's few-token products run on, for reports (`None`: one kind).
    fn product_kernels(_model: &ModelOn<Self>) -> Option<String> {
        None
    }
}

impl SpecBackend for CpuBackend {
    fn take(m: LoadedModel) -> Option<ModelOn<Self>> {
        #[allow(unreachable_patterns)]
        match m {
            LoadedModel::Cpu(m) => Some(m),
            _ => None,
        }
    }
}

impl SpecBackend for CudaBackend {
    fn take(m: LoadedModel) -> Option<ModelOn<Self>> {
        #[allow(unreachable_patterns)]
        match m {
            LoadedModel::Cuda(m) => Some(m),
            _ => None,
        }
    }

    fn speculation_kernels(_model: &ModelOn<Self>) {
        cuda::mmv::set_speculation(true);
    }

    fn product_kernels(model: &ModelOn<Self>) -> Option<String> {
        Some(cuda::mmv::speculation_kernels_note(
            model.backend().device(),
        ))
    }
}

/// A partially offloaded model drafts with its MTP layer only: a draft model would need a
/// placement of its own across the two devices.
impl SpecBackend for HybridBackend {
    fn take(_: LoadedModel) -> Option<ModelOn<Self>> {
        None
    }
}

/// The drafter `spec` asks for, ready to pair with `target`.
pub enum Drafter<B: Backend> {
    Model(Box<ModelOn<B>>),
    Mtp,
}

/// The product kernels speculation runs on. Speculation must give what plain decoding gives,
/// token for token. One-token steps quantize activations q8_1 (a scale per 32) for the dp4a
/// kernels, or q8_K (a scale per 256) for a format the mmv2 kernels take from one token (none
/// by default; Q6_K with `REDLINE_MMV2_MIN_Q6K=1`); the mmv2 kernels that take few-token
/// products by default (Q4_K from 3 tokens, Q6_K from 2) quantize them q8_K, a coarser grid
/// than the one-token steps' that can move near-tied logits apart. So verify passes keep each format on its one-token grid
/// (`cuda::mmv::set_speculation`), unless REDLINE_MMV2 is set explicitly. `verify-bench`
/// measures on the same kernels.
fn speculation_kernels<B: SpecBackend>(target: &ModelOn<B>) {
    if std::env::var_os("REDLINE_MMV2").is_none() {
        B::speculation_kernels(target);
    }
}

/// Loads the draft model (`--md`, placed like the target, on the same kind of device) or
/// enables the target's MTP block (`--mtp`).
pub fn load_drafter<B: SpecBackend>(
    spec: &SpecArgs,
    target: &ModelOn<B>,
    margs: &ModelArgs,
    pargs: &PlacementArgs,
    n_ctx: usize,
) -> anyhow::Result<Drafter<B>> {
    speculation_kernels(target);
    if spec.mtp {
        if spec.model_draft.is_some() {
            bail!("--mtp and --md are exclusive: pick one drafter");
        }
        if !target.load_mtp()? {
            bail!(
                "--mtp: the model has no multi-token-prediction layer (qwen35 files with \
                 qwen35.nextn_predict_layers > 0)"
            );
        }
        eprintln!("speculative: drafting with the model's MTP layer");
        return Ok(Drafter::Mtp);
    }
    let Some(path) = &spec.model_draft else {
        bail!("speculation needs --md DRAFT.gguf or --mtp");
    };
    let dargs = ModelArgs {
        model: Some(path.clone()),
        threads: margs.threads,
    };
    let req = LoadRequest {
        n_ctx: Some(n_ctx),
        n_parallel: 1,
        kv_type: KvType::F16,
        measure_bandwidth: false,
        // The model's placement already made room for this one.
        draft: None,
    };
    let placed = load_placed(&dargs, pargs, &req, LogTo::Stderr)
        .with_context(|| format!("loading the draft model {}", path.display()))?;
    let draft = B::take(placed.model)
        .context("the draft model landed on another kind of device than the model")?;
    engine::speculative::check_same_vocab(target.gguf(), draft.gguf())?;
    eprintln!(
        "speculative: drafting with {} ({} layers)",
        path.display(),
        draft.config().n_layer
    );
    Ok(Drafter::Model(Box::new(draft)))
}

/// `redline run -p … --md/--mtp`: one completion with speculation, streamed to stdout.
#[allow(clippy::too_many_arguments)]
pub fn one_shot<B: SpecBackend>(
    spec: &SpecArgs,
    margs: &ModelArgs,
    pargs: &PlacementArgs,
    model: &ModelOn<B>,
    tokenizer: &Tokenizer,
    prompt: &str,
    sampler_config: SamplerConfig,
    params: &GenerateParams,
    json: bool,
) -> anyhow::Result<()> {
    let prompt_ids = super::run::encode_prompt(tokenizer, prompt, params.n_ctx)?;
    let drafter = load_drafter(spec, model, margs, pargs, params.n_ctx)?;
    let state = model.new_state(params.n_ctx, KvType::F16)?;
    let seed = sampler_config.seed;
    let mut sampler = Sampler::new(sampler_config);
    let stdout = std::io::stdout();
    if !json {
        print!("{prompt}");
        stdout.lock().flush()?;
    }
    let on_text = |text: &str| {
        if !json {
            let mut out = stdout.lock();
            let _ = out.write_all(text.as_bytes());
            let _ = out.flush();
        }
        ControlFlow::Continue(())
    };
    let opts = spec.options();
    let (g, stats) = match &drafter {
        Drafter::Mtp => {
            let mut s = MtpSpec::new(model, state, KvType::F16)?;
            generate_speculative(
                &mut s,
                tokenizer,
                &mut sampler,
                &prompt_ids,
                params,
                &opts,
                on_text,
            )?
        }
        Drafter::Model(draft) => {
            let dstate = draft.new_state(params.n_ctx, KvType::F16)?;
            let mut s = DraftModelSpec::new(model, state, draft.as_ref(), dstate)?;
            generate_speculative(
                &mut s,
                tokenizer,
                &mut sampler,
                &prompt_ids,
                params,
                &opts,
                on_text,
            )?
        }
    };
    if json {
        println!("{}", json_report(&prompt_ids, &g, &stats, seed));
    } else {
        println!();
        eprintln!("\n{}", summary(&g, &stats));
    }
    Ok(())
}

/// One line: timings, acceptance, tokens per verify pass.
pub fn summary(g: &Generation, s: &SpecStats) -> String {
    let t = &g.timings;
    format!(
        "prompt: {} tokens in {:.1} ms ({:.1} tok/s) | generation: {} tokens in {:.1} ms \
         ({:.1} tok/s) | speculative: {} verify passes, {}/{} drafts accepted ({:.1} %), \
         {:.2} tokens/pass",
        t.prompt_n,
        t.prompt_ms,
        t.prompt_per_second(),
        t.predicted_n,
        t.predicted_ms,
        t.predicted_per_second(),
        s.steps,
        s.accepted,
        s.drafted,
        100.0 * s.acceptance_rate(),
        s.tokens_per_step()
    )
}

fn json_report(prompt_ids: &[u32], g: &Generation, s: &SpecStats, seed: u64) -> serde_json::Value {
    let t = &g.timings;
    serde_json::json!({
        "prompt_tokens": prompt_ids,
        "tokens": g.tokens,
        "text": g.text,
        "finish_reason": g.finish.openai_name(),
        "seed": seed,
        "timings": {
            "prompt_n": t.prompt_n,
            "prompt_ms": t.prompt_ms,
            "prompt_per_second": t.prompt_per_second(),
            "predicted_n": t.predicted_n,
            "predicted_ms": t.predicted_ms,
            "predicted_per_second": t.predicted_per_second(),
        },
        "speculative": {
            "verify_passes": s.steps,
            "drafted": s.drafted,
            "accepted": s.accepted,
            "acceptance_rate": s.acceptance_rate(),
            "tokens_per_pass": s.tokens_per_step(),
            "rollbacks": s.rollbacks,
        }
    })
}

/// `redline verify-bench`.
#[derive(clap::Args)]
pub struct BenchArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    placement: PlacementArgs,
    #[command(flatten)]
    spec: SpecArgs,
    /// Tokens per verify pass to measure (k = 1 is a decode step that also returns all logits).
    #[arg(short = 'k', long = "verify-k", value_delimiter = ',', default_values_t = vec![1, 2, 4, 8])]
    verify_k: Vec<usize>,
    /// Tokens already in the context before each pass.
    #[arg(short = 'd', long = "n-depth", default_value_t = 256)]
    n_depth: usize,
    /// Repetitions of each measurement (after one warm-up).
    #[arg(short = 'r', long = "repetitions", default_value_t = 10)]
    repetitions: usize,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

/// One row of the verify-cost table.
struct CostRow {
    label: String,
    /// Milliseconds per pass of each repetition.
    ms: Vec<f64>,
}

pub fn bench(args: BenchArgs) -> anyhow::Result<()> {
    args.spec.check()?;
    let k_max = args.verify_k.iter().copied().max().unwrap_or(0);
    if k_max == 0 || args.repetitions == 0 {
        bail!("nothing to measure: give -k values >= 1 and -r >= 1");
    }
    let n_ctx = args.n_depth + k_max + 8;
    let req = LoadRequest {
        n_ctx: Some(n_ctx),
        n_parallel: 1,
        kv_type: KvType::F16,
        measure_bandwidth: false,
        draft: args.spec.draft_request(),
    };
    let placed = load_placed(&args.model, &args.placement, &req, LogTo::Stderr)?;
    if placed.n_ctx < n_ctx {
        bail!(
            "the test needs {n_ctx} tokens of context but only {} fit",
            placed.n_ctx
        );
    }
    #[allow(unreachable_patterns)]
    match &placed.model {
        LoadedModel::Cpu(m) => bench_on(&args, m, &placed, n_ctx),
        LoadedModel::Cuda(m) => bench_on(&args, m, &placed, n_ctx),
        _ => bail!("verify-bench runs on the CPU or on a GPU holding the whole model"),
    }
}

fn bench_on<B: SpecBackend>(
    args: &BenchArgs,
    model: &ModelOn<B>,
    placed: &Placed,
    n_ctx: usize,
) -> anyhow::Result<()> {
    // the kernels a speculating run verifies on
    speculation_kernels(model);
    let n_vocab = model.config().n_vocab as u32;
    let mut rng = StdRng::seed_from_u64(42);
    let mut tokens =
        |n: usize| -> Vec<u32> { (0..n).map(|_| rng.random_range(0..n_vocab)).collect() };
    let mut state = model.new_state(n_ctx, KvType::F16)?;
    model.forward(&mut state, &tokens(args.n_depth.max(1)), false)?;
    let base = state.len();
    state.snapshot();
    let mut rows = Vec::new();
    // One decode step: the baseline every pass is compared with.
    let step = tokens(1);
    let label = "decode step (1 token, last logits)";
    rows.push(CostRow {
        label: label.into(),
        ms: time_passes(label, args.repetitions, &mut state, base, |s| {
            model.forward(s, &step, false).map(|_| ())
        })?,
    });
    for &k in &args.verify_k {
        let batch = tokens(k);
        let label = format!("verify k={k} (all logits)");
        rows.push(CostRow {
            ms: time_passes(&label, args.repetitions, &mut state, base, |s| {
                model.forward(s, &batch, true).map(|_| ())
            })?,
            label,
        });
    }
    if args.spec.enabled() {
        match load_drafter(&args.spec, model, &args.model, &args.placement, n_ctx)? {
            Drafter::Mtp => {
                let mut s = MtpSpec::new(model, model.new_state(n_ctx, KvType::F16)?, KvType::F16)?;
                s.prefill(&tokens(args.n_depth.max(1)))?;
                s.draft_step(tokens(1)[0])?; // the prompt's MTP entries
                let t = tokens(1)[0];
                let mut ms = Vec::new();
                for _ in 0..=args.repetitions {
                    let t0 = Instant::now();
                    s.draft_step(t)?;
                    ms.push(t0.elapsed().as_secs_f64() * 1e3);
                }
                ms.remove(0);
                rows.push(CostRow {
                    label: "MTP draft step (1 token)".into(),
                    ms,
                });
            }
            Drafter::Model(draft) => {
                let mut ds = draft.new_state(n_ctx, KvType::F16)?;
                draft.forward(&mut ds, &tokens(args.n_depth.max(1)), false)?;
                let dbase = ds.len();
                ds.snapshot();
                let t = tokens(1);
                let label = "draft model decode step";
                rows.push(CostRow {
                    label: label.into(),
                    ms: time_passes(label, args.repetitions, &mut ds, dbase, |s| {
                        draft.forward(s, &t, false).map(|_| ())
                    })?,
                });
            }
        }
    }
    print_costs(args, placed, &rows, B::product_kernels(model).as_deref());
    Ok(())
}

/// Untimed passes before the timed ones: the first runs eagerly (compiles, sizes the step
/// arena), the second records the step as a CUDA graph; the timed ones replay it.
const WARMUP_PASSES: usize = 2;

/// Times `pass` `reps` times after [`WARMUP_PASSES`], restoring the state to `base` (a
/// snapshot there) after each; milliseconds per pass. With `REDLINE_PROFILE_OPS=1` the timed
/// passes' per-op device time is printed under `label`.
fn time_passes<B: Backend>(
    label: &str,
    reps: usize,
    state: &mut SeqStateOn<B>,
    base: usize,
    mut pass: impl FnMut(&mut SeqStateOn<B>) -> Result<(), model::ModelError>,
) -> anyhow::Result<Vec<f64>> {
    let mut ms = Vec::with_capacity(reps);
    for i in 0..reps + WARMUP_PASSES {
        if i == WARMUP_PASSES {
            cuda::backend::op_profile_reset();
        }
        let t0 = Instant::now();
        pass(state)?;
        let dt = t0.elapsed().as_secs_f64() * 1e3;
        state.truncate(base)?;
        if i >= WARMUP_PASSES {
            ms.push(dt);
        }
    }
    if let Some(table) = cuda::backend::op_profile_report() {
        eprintln!("per-op device time, {label}:");
        eprint!("{table}");
    }
    Ok(ms)
}

fn print_costs(args: &BenchArgs, placed: &Placed, rows: &[CostRow], kernels: Option<&str>) {
    let base = mean_sd(&rows[0].ms).0;
    if args.json {
        let v: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| {
                let (m, sd) = mean_sd(&r.ms);
                serde_json::json!({"pass": r.label, "ms": m, "ms_sd": sd, "x_decode_step": m / base})
            })
            .collect();
        let out = serde_json::json!({
            "model": args.model.display_name(),
            "device": placed.device_name,
            "n_depth": args.n_depth,
            "repetitions": args.repetitions,
            "kernels": kernels,
            "passes": v,
        });
        println!("{out}");
        return;
    }
    println!(
        "model: {} | device: {} | depth {} | {} repetitions",
        args.model.display_name(),
        placed.device_name,
        args.n_depth,
        args.repetitions
    );
    println!();
    println!("| pass | ms | × decode step |");
    println!("| --- | ---: | ---: |");
    for r in rows {
        let (m, sd) = mean_sd(&r.ms);
        println!("| {} | {:.3} ± {:.3} | {:.2} |", r.label, m, sd, m / base);
    }
    if let Some(k) = kernels {
        println!();
        println!("({k})");
    }
}
