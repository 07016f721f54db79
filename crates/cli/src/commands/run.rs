//! `redline run`: one completion of a prompt streamed to stdout (`-p`), or an interactive chat
//! when no prompt is given. With no `-m` it runs the tiny story model embedded in the binary.

use std::io::{BufRead, Write};
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{bail, Context};
use backend::Backend;
use engine::generate::{generate, GenerateParams, Generation};
use engine::sampler::{Sampler, SamplerConfig};
use engine::{ChatTemplate, Tokenizer};
use model::{KvType, ModelOn};

use super::device_args::PlacementArgs;
use super::placement::{load_placed, LoadRequest, LoadedModel, LogTo, Placed};

/// karpathy's stories260K (llama2.c, MIT), so `redline run` works with no download.
static BUNDLED_MODEL: &[u8] = include_bytes!("../../../../models/stories260K.gguf");

#[derive(clap::Args, Debug, Clone)]
pub struct ModelArgs {
    /// GGUF model file (default: the bundled stories260K).
    #[arg(short = 'm', long = "model")]
    pub model: Option<PathBuf>,
    /// CPU threads (0: one per core).
    #[arg(short = 't', long = "threads", default_value_t = 0)]
    pub threads: usize,
}

impl ModelArgs {
    /// Opens (memory-maps) the GGUF named by `-m`, or reads the bundled one.
    pub fn open_gguf(&self) -> anyhow::Result<gguf::GgufFile> {
        match &self.model {
            Some(path) => {
                gguf::GgufFile::open(path).with_context(|| format!("reading {}", path.display()))
            }
            None => gguf::GgufFile::from_bytes(BUNDLED_MODEL.to_vec())
                .context("reading the bundled model"),
        }
    }

    pub fn display_name(&self) -> String {
        match &self.model {
            Some(p) => p.display().to_string(),
            None => "stories260K (bundled)".into(),
        }
    }
}

/// Sampling flags, named as llama.cpp's.
#[derive(clap::Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Temperature; 0 = greedy.
    #[arg(long = "temp", default_value_t = 0.8)]
    pub temp: f32,
    /// Top-k (0 = off).
    #[arg(long = "top-k", default_value_t = 40)]
    pub top_k: usize,
    /// Top-p (1 = off).
    #[arg(long = "top-p", default_value_t = 0.95)]
    pub top_p: f32,
    /// Min-p (0 = off).
    #[arg(long = "min-p", default_value_t = 0.05)]
    pub min_p: f32,
    /// Repetition penalty over the last --repeat-last-n tokens (1 = off).
    #[arg(long = "repeat-penalty", default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// Tokens the penalties look back over (-1 = the whole context, 0 = off).
    #[arg(
        long = "repeat-last-n",
        default_value_t = 64,
        allow_negative_numbers = true
    )]
    pub repeat_last_n: i64,
    #[arg(long = "presence-penalty", default_value_t = 0.0)]
    pub presence_penalty: f32,
    #[arg(long = "frequency-penalty", default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// RNG seed (default: random; the seed used is reported in --json).
    #[arg(long = "seed")]
    pub seed: Option<u64>,
    /// Bias a token's logit, llama.cpp style: `ID+BIAS`, `ID-BIAS`, `ID-inf` bans it
    /// (repeatable).
    #[arg(short = 'l', long = "logit-bias", value_parser = parse_logit_bias, allow_hyphen_values = true)]
    pub logit_bias: Vec<(u32, f32)>,
}

/// Parses `ID+BIAS` / `ID-BIAS` (`inf` allowed), as llama.cpp's `--logit-bias`.
pub fn parse_logit_bias(s: &str) -> Result<(u32, f32), String> {
    let bad = || format!("expected TOKEN_ID+BIAS or TOKEN_ID-BIAS, got {s:?}");
    let split = s.find(['+', '-']).ok_or_else(bad)?;
    let id: u32 = s[..split].trim().parse().map_err(|_| bad())?;
    let bias: f32 = s[split..].trim().parse().map_err(|_| bad())?;
    if bias.is_nan() {
        return Err(bad());
    }
    Ok((id, bias))
}

impl SamplingArgs {
    pub fn config(&self) -> SamplerConfig {
        SamplerConfig {
            temperature: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            penalty_last_n: usize::try_from(self.repeat_last_n).ok(),
            logit_bias: self.logit_bias.clone(),
            seed: self.seed.unwrap_or_else(rand::random),
        }
    }
}

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Prompt for one completion; without it, an interactive chat.
    #[arg(short = 'p', long = "prompt")]
    prompt: Option<String>,
    /// Most tokens to generate per reply.
    #[arg(short = 'n', long = "n-predict", default_value_t = 256)]
    n_predict: usize,
    /// Context size (0: the model's training context, at most 4096 by default).
    #[arg(short = 'c', long = "ctx-size", default_value_t = 0)]
    ctx_size: usize,
    #[command(flatten)]
    placement: PlacementArgs,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// Speculative decoding: --md DRAFT.gguf or --mtp, --draft-max …
    #[command(flatten)]
    spec: super::speculate::SpecArgs,
    /// Stop when this text appears (repeatable).
    #[arg(long = "stop")]
    stop: Vec<String>,
    /// System message for chat mode.
    #[arg(long = "system")]
    system: Option<String>,
    /// After a one-shot completion print one JSON object (prompt ids, generated ids, text,
    /// timings) to stdout instead of streaming the text.
    #[arg(long)]
    json: bool,
    /// Keep generating past end-of-generation tokens.
    #[arg(long)]
    ignore_eos: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    // Flag checks that need no model come before the load.
    args.spec.check()?;
    if args.spec.enabled() && args.prompt.is_none() {
        bail!("speculative decoding (--md / --mtp) needs a prompt (-p); chat mode has none");
    }
    let req = LoadRequest {
        n_ctx: (args.ctx_size > 0).then_some(args.ctx_size),
        n_parallel: 1,
        kv_type: KvType::F16,
        measure_bandwidth: false,
        draft: args.spec.draft_request(),
    };
    let placed = load_placed(&args.model, &args.placement, &req, LogTo::Stderr)?;
    match &placed.model {
        LoadedModel::Cpu(m) => run_on(&args, m, &placed),
        LoadedModel::Cuda(m) => run_on(&args, m, &placed),
        LoadedModel::Hybrid(m) => run_on(&args, m, &placed),
        LoadedModel::Multi(m) => run_on(&args, m, &placed),
    }
}

fn run_on<B: super::speculate::SpecBackend>(
    args: &Args,
    model: &ModelOn<B>,
    placed: &Placed,
) -> anyhow::Result<()> {
    let tokenizer =
        Tokenizer::from_gguf(model.gguf().metadata()).context("loading the tokenizer")?;
    let n_ctx = placed.n_ctx;
    let sampler_config = args.sampling.config();
    let params = GenerateParams {
        max_tokens: args.n_predict,
        n_ctx,
        stop: args.stop.clone(),
        ignore_eog: args.ignore_eos,
    };
    match &args.prompt {
        Some(prompt) => one_shot(
            args,
            model,
            placed,
            &tokenizer,
            prompt,
            sampler_config,
            &params,
        ),
        None => {
            if args.json {
                bail!("--json needs a prompt (-p)");
            }
            if args.spec.enabled() {
                bail!("speculative decoding (--md / --mtp) needs a prompt (-p)");
            }
            chat(args, model, placed, &tokenizer, sampler_config, &params)
        }
    }
}

/// The one-shot prompt's ids, refused when they do not fit `n_ctx`: checked before anything is
/// printed, so a run that cannot start does not echo the prompt.
pub(super) fn encode_prompt(
    tokenizer: &Tokenizer,
    prompt: &str,
    n_ctx: usize,
) -> anyhow::Result<Vec<u32>> {
    let ids = tokenizer.encode(prompt, true, false)?;
    engine::generate::check_prompt_fits(0, ids.len(), n_ctx)
        .map_err(|e| anyhow::anyhow!("{e}; shorten the prompt or raise -c"))?;
    Ok(ids)
}

fn one_shot<B: super::speculate::SpecBackend>(
    args: &Args,
    model: &ModelOn<B>,
    placed: &Placed,
    tokenizer: &Tokenizer,
    prompt: &str,
    sampler_config: SamplerConfig,
    params: &GenerateParams,
) -> anyhow::Result<()> {
    if args.spec.enabled() {
        return super::speculate::one_shot(
            &args.spec,
            &args.model,
            &args.placement,
            model,
            tokenizer,
            prompt,
            sampler_config,
            params,
            args.json,
        );
    }
    let prompt_ids = encode_prompt(tokenizer, prompt, params.n_ctx)?;
    let mut state = model.new_state(params.n_ctx, KvType::F16)?;
    placed.report_memory(LogTo::Stderr, true);
    let seed = sampler_config.seed;
    let mut sampler = Sampler::new(sampler_config);
    let stdout = std::io::stdout();
    if !args.json {
        print!("{prompt}");
        stdout.lock().flush()?;
    }
    let g = generate(
        |t: &[u32]| model.forward(&mut state, t, false),
        tokenizer,
        &mut sampler,
        &prompt_ids,
        0,
        params,
        |text| {
            if !args.json {
                let mut out = stdout.lock();
                let _ = out.write_all(text.as_bytes());
                let _ = out.flush();
            }
            ControlFlow::Continue(())
        },
    )?;
    if args.json {
        println!("{}", json_report(&prompt_ids, &g, seed));
    } else {
        println!();
        print_timings(&g);
    }
    Ok(())
}

/// The `--json` object: ids, text, finish reason and llama.cpp-style timings.
fn json_report(prompt_ids: &[u32], g: &Generation, seed: u64) -> serde_json::Value {
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
        }
    })
}

fn print_timings(g: &Generation) {
    let t = &g.timings;
    eprintln!(
        "\nprompt: {} tokens in {:.1} ms ({:.1} tok/s) | generation: {} tokens in {:.1} ms ({:.1} tok/s)",
        t.prompt_n,
        t.prompt_ms,
        t.prompt_per_second(),
        t.predicted_n,
        t.predicted_ms,
        t.predicted_per_second()
    );
}

/// Set while a reply is being generated: Ctrl-C then stops the reply instead of the program.
static GENERATING: AtomicBool = AtomicBool::new(false);

fn chat<B: Backend>(
    args: &Args,
    model: &ModelOn<B>,
    placed: &Placed,
    tokenizer: &Tokenizer,
    sampler_config: SamplerConfig,
    params: &GenerateParams,
) -> anyhow::Result<()> {
    let template = ChatTemplate::from_gguf(model.gguf().metadata())?;
    let interrupted = Arc::new(AtomicBool::new(false));
    {
        let interrupted = interrupted.clone();
        ctrlc::set_handler(move || {
            if GENERATING.load(Ordering::SeqCst) {
                interrupted.store(true, Ordering::SeqCst);
            } else {
                std::process::exit(130);
            }
        })
        .context("installing the Ctrl-C handler")?;
    }
    eprintln!(
        "chatting with {} ({}). Ctrl-C stops a reply; Ctrl-D or Ctrl-C at the prompt quits.",
        args.model.display_name(),
        if template.is_some() {
            "chat template"
        } else {
            "no chat template: plain continuation"
        }
    );
    let mut messages: Vec<serde_json::Value> = Vec::new();
    if let Some(system) = &args.system {
        messages.push(serde_json::json!({"role": "system", "content": system}));
    }
    let mut state = model.new_state(params.n_ctx, KvType::F16)?;
    placed.report_memory(LogTo::Stderr, true);
    // Tokens the state holds, to feed only what a new turn adds.
    let mut in_state: Vec<u32> = Vec::new();
    let mut sampler = Sampler::new(sampler_config);
    let stdin = std::io::stdin();
    let mut line = String::new();
    loop {
        eprint!("> ");
        line.clear();
        if stdin.lock().read_line(&mut line)? == 0 {
            eprintln!();
            return Ok(());
        }
        let user = line.trim_end_matches(['\n', '\r']);
        if user.is_empty() {
            continue;
        }
        messages.push(serde_json::json!({"role": "user", "content": user}));
        let all_ids = match &template {
            Some(t) => {
                let text = t.render(&messages, None, true, &serde_json::Map::new())?;
                // A template that writes BOS itself must not get a second one.
                let has_bos = t
                    .bos_token()
                    .is_some_and(|b| !b.is_empty() && text.starts_with(b));
                tokenizer.encode(&text, !has_bos, true)?
            }
            None => {
                let mut ids = in_state.clone();
                ids.extend(tokenizer.encode(user, in_state.is_empty(), false)?);
                ids
            }
        };
        // Reuse the longest common prefix; rewind the state if the render changed earlier text.
        let common = in_state
            .iter()
            .zip(&all_ids)
            .take_while(|(a, b)| a == b)
            .count()
            .min(all_ids.len().saturating_sub(1));
        if common < in_state.len() {
            if state.truncate(common).is_err() {
                state = model.new_state(params.n_ctx, KvType::F16)?;
                in_state.clear();
            } else {
                in_state.truncate(common);
            }
        }
        let new_ids = all_ids[in_state.len()..].to_vec();
        interrupted.store(false, Ordering::SeqCst);
        GENERATING.store(true, Ordering::SeqCst);
        let stdout = std::io::stdout();
        let n_past = in_state.len();
        let result = generate(
            |t: &[u32]| model.forward(&mut state, t, false),
            tokenizer,
            &mut sampler,
            &new_ids,
            n_past,
            params,
            |text| {
                let mut out = stdout.lock();
                let _ = out.write_all(text.as_bytes());
                let _ = out.flush();
                if interrupted.load(Ordering::SeqCst) {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            },
        );
        GENERATING.store(false, Ordering::SeqCst);
        let g = match result {
            Ok(g) => g,
            Err(e) => {
                eprintln!("\nerror: {e}");
                messages.pop();
                continue;
            }
        };
        println!();
        in_state.extend_from_slice(&new_ids);
        // Generated tokens fed back into the state: all of them after an end-of-generation
        // token, all but the last sampled one otherwise.
        let evaluated = state
            .len()
            .saturating_sub(in_state.len())
            .min(g.tokens.len());
        in_state.extend_from_slice(&g.tokens[..evaluated]);
        messages.push(serde_json::json!({"role": "assistant", "content": g.text}));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logit_bias_syntax() {
        assert_eq!(parse_logit_bias("15043+1"), Ok((15043, 1.0)));
        assert_eq!(parse_logit_bias("7-0.5"), Ok((7, -0.5)));
        assert_eq!(parse_logit_bias("2-inf"), Ok((2, f32::NEG_INFINITY)));
        assert!(parse_logit_bias("abc+1").is_err());
        assert!(parse_logit_bias("12").is_err());
        assert!(parse_logit_bias("12+x").is_err());
    }
}
