//! `redline bench`: prompt processing (pp) and token generation (tg) speed, measured the way
//! llama-bench measures them: after one warm-up run, each test repeated `-r` times on a fresh
//! sequence; pp = one forward of `-p` random tokens, tg = `-n` single-token forwards;
//! reported as mean ± sample standard deviation of tokens/s.

use std::time::Instant;

use anyhow::{bail, Context};
use backend::Backend;
use model::{KvType, ModelOn, SeqStateOn};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::device_args::PlacementArgs;
use super::placement::{load_placed, LoadRequest, LoadedModel, LogTo, Placed};
use super::run::ModelArgs;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    placement: PlacementArgs,
    /// Prompt tokens for the prefill test (0 skips it).
    #[arg(short = 'p', long = "n-prompt", default_value_t = 512)]
    n_prompt: usize,
    /// Tokens for the decode test (0 skips it).
    #[arg(short = 'n', long = "n-gen", default_value_t = 128)]
    n_gen: usize,
    /// Run each test after a prompt of this many tokens already in the cache (llama-bench -d).
    #[arg(short = 'd', long = "n-depth", default_value_t = 0)]
    n_depth: usize,
    /// Repetitions of each test.
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    repetitions: usize,
    /// Decode this many sequences together, one batched step per token for all of them (each
    /// with its own KV cache, as `serve --parallel` runs its slots): tg reports the aggregate
    /// tokens/s of all sequences, and the roofline counts one pass over the weights per step.
    #[arg(long = "parallel", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=256))]
    parallel: u32,
    /// Print one JSON object instead of the markdown table (same as -o json).
    #[arg(long)]
    json: bool,
    /// Output format: md or json.
    #[arg(short = 'o', long = "output", default_value = "md", value_parser = ["md", "json"])]
    output: String,
}

/// Mean and sample standard deviation of a set of rates.
pub fn mean_sd(xs: &[f64]) -> (f64, f64) {
    if xs.is_empty() {
        return (0.0, 0.0);
    }
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    if xs.len() < 2 {
        return (mean, 0.0);
    }
    let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1.0);
    (mean, var.sqrt())
}

/// Bytes one decode step reads, averaged over a tg test of `n_gen` steps after `depth` cached
/// tokens: the weights read per step (everything but the token-embedding table, plus the
/// recurrent state) and one embedding row, plus the KV cache, where step i (at position
/// depth + i) reads depth + i + 1 positions — on average depth + (n_gen + 1) / 2.
pub fn decode_bytes_per_token(
    weights_and_state: u64,
    embedding_row: u64,
    kv_bytes_per_position: u64,
    depth: usize,
    n_gen: usize,
) -> f64 {
    let mean_positions = depth as f64 + (n_gen as f64 + 1.0) / 2.0;
    (weights_and_state + embedding_row) as f64 + kv_bytes_per_position as f64 * mean_positions
}

/// Share of the memory-bandwidth roofline a decode speed reaches, percent:
/// bytes per token × tokens/s ÷ bandwidth (GB/s = 1e9 bytes/s).
pub fn roofline_percent(bytes_per_token: f64, tok_s: f64, bandwidth_gbs: f64) -> f64 {
    if bandwidth_gbs <= 0.0 {
        return 0.0;
    }
    100.0 * bytes_per_token * tok_s / (bandwidth_gbs * 1e9)
}

struct TestResult {
    name: String,
    n_tokens: usize,
    /// tokens/s of each repetition.
    rates: Vec<f64>,
    /// Decode tests: bytes read per token and the share of the roofline (the read bandwidth
    /// measured on the device, or on the host with the bench's threads).
    roofline: Option<(f64, f64)>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if args.n_prompt == 0 && args.n_gen == 0 {
        bail!("nothing to measure: -p and -n are both 0");
    }
    let n_ctx = args.n_depth + args.n_prompt.max(args.n_gen) + 1;
    let n_seq = args.parallel as usize;
    let req = LoadRequest {
        n_ctx: Some(n_ctx * n_seq),
        n_parallel: n_seq,
        kv_type: KvType::F16,
        measure_bandwidth: true,
        draft: None,
    };
    let placed = load_placed(&args.model, &args.placement, &req, LogTo::Stderr)?;
    if placed.n_ctx < n_ctx * n_seq {
        bail!(
            "the test needs {n_ctx} tokens of context per sequence (-d + max(-p, -n) + 1) × {n_seq} \
             sequences but only {} fit on the GPU; lower -d/-p/-n/--parallel or use --fit on with offload",
            placed.n_ctx
        );
    }
    if let Some(bw) = placed.bandwidth_gbs {
        let on = match &placed.model {
            LoadedModel::Cpu(_) => format!("cpu with {} threads", rayon_threads(&args.model)),
            _ => placed.device_name.clone(),
        };
        eprintln!("read bandwidth: {bw:.0} GB/s measured on {on}");
    }
    let results = match &placed.model {
        LoadedModel::Cpu(m) => bench_on(&args, m, &placed, n_ctx)?,
        LoadedModel::Cuda(m) => bench_on(&args, m, &placed, n_ctx)?,
        LoadedModel::Hybrid(m) => bench_on(&args, m, &placed, n_ctx)?,
        LoadedModel::Multi(m) => bench_on(&args, m, &placed, n_ctx)?,
    };
    print_results(&args, &placed, &results)
}

fn bench_on<B: Backend>(
    args: &Args,
    model: &ModelOn<B>,
    placed: &Placed,
    n_ctx: usize,
) -> anyhow::Result<Vec<TestResult>> {
    let n_vocab = model.config().n_vocab as u32;
    // Random token ids, as llama-bench uses: the speed does not depend on them.
    let mut rng = StdRng::seed_from_u64(1234);
    let mut random_tokens =
        |n: usize| -> Vec<u32> { (0..n).map(|_| rng.random_range(0..n_vocab)).collect() };
    let n_seq = args.parallel as usize;
    let mut states = (0..n_seq)
        .map(|_| model.new_state(n_ctx, KvType::F16))
        .collect::<Result<Vec<_>, _>>()?;
    placed.report_memory(LogTo::Stderr, true);
    let depth = args.n_depth;
    if depth > 0 {
        let t = Instant::now();
        for state in states.iter_mut() {
            model
                .forward(state, &random_tokens(depth), false)
                .context("depth prefill")?;
            // A hybrid model can return to `depth` only from a snapshot.
            state.snapshot();
        }
        eprintln!(
            "depth: {depth} tokens prefilled in {:.2} s{}",
            t.elapsed().as_secs_f64(),
            if n_seq > 1 {
                format!(" for each of {n_seq} sequences")
            } else {
                String::new()
            }
        );
    }
    let suffix = if depth > 0 {
        format!(" @ d{depth}")
    } else {
        String::new()
    };
    // Batched decode is named after its sequence count; prefill runs on one sequence.
    let tg_suffix = if n_seq > 1 {
        format!("{suffix} ×{n_seq}")
    } else {
        suffix.clone()
    };
    let rewind = |state: &mut SeqStateOn<B>| -> anyhow::Result<()> {
        state
            .truncate(depth)
            .map_err(|e| anyhow::anyhow!("rewinding to depth {depth}: {e}"))
    };

    // Decode first: its numbers are on stderr even if a long prefill is cut off.
    let mut results = Vec::new();
    if args.n_gen > 0 {
        let tokens: Vec<Vec<u32>> = (0..n_seq).map(|_| random_tokens(args.n_gen)).collect();
        let generated = args.n_gen * n_seq;
        let mut rates = Vec::new();
        for rep in 0..=args.repetitions {
            for state in states.iter_mut() {
                rewind(state)?;
            }
            let s = decode_run(model, &mut states, &tokens)?;
            progress(&format!("tg{}{tg_suffix}", args.n_gen), rep, generated, s);
            if rep > 0 {
                rates.push(generated as f64 / s);
            } else {
                // REDLINE_PROFILE_OPS: the warm-up compiled kernels; time the measured reps.
                cuda::backend::op_profile_reset();
            }
        }
        if let Some(table) = cuda::backend::op_profile_report() {
            eprint!("{table}");
        }
        let roofline = placed.bandwidth_gbs.map(|bw| {
            let p = &placed.plan;
            let embd_row = p.ledger.token_embedding / model.config().n_vocab.max(1) as u64;
            // One step reads the weights once and each sequence's row, state and KV cache.
            let per_seq = decode_bytes_per_token(
                p.state_bytes_per_seq,
                embd_row,
                p.kv_bytes_per_token,
                depth,
                args.n_gen,
            );
            let bytes_per_step =
                (p.bytes_per_token - p.state_bytes_per_seq) as f64 + n_seq as f64 * per_seq;
            let (mean, _) = mean_sd(&rates);
            let steps_per_s = mean / n_seq as f64;
            (
                bytes_per_step,
                roofline_percent(bytes_per_step, steps_per_s, bw),
            )
        });
        results.push(TestResult {
            name: format!("tg{}{tg_suffix}", args.n_gen),
            n_tokens: generated,
            rates,
            roofline,
        });
    }
    let state = &mut states[0];
    if args.n_prompt > 0 {
        let tokens = random_tokens(args.n_prompt);
        let mut rates = Vec::new();
        for rep in 0..=args.repetitions {
            rewind(state)?;
            let t = Instant::now();
            model.forward(state, &tokens, false).context("prefill")?;
            let s = t.elapsed().as_secs_f64();
            progress(
                &format!("pp{}{suffix}", args.n_prompt),
                rep,
                args.n_prompt,
                s,
            );
            if rep > 0 {
                rates.push(args.n_prompt as f64 / s);
            }
        }
        results.push(TestResult {
            name: format!("pp{}{suffix}", args.n_prompt),
            n_tokens: args.n_prompt,
            rates,
            roofline: None,
        });
    }
    // Shown in llama-bench's order: pp, then tg.
    results.sort_by_key(|r| !r.name.starts_with("pp"));
    Ok(results)
}

fn print_results(args: &Args, placed: &Placed, results: &[TestResult]) -> anyhow::Result<()> {
    let file_type = placed.plan.file_type.as_deref().unwrap_or("?");
    let model_name = format!("{} {}", placed.plan.arch, file_type);
    let l = &placed.plan.ledger;
    let size_bytes = l.layer_weights + l.output_head + l.token_embedding + l.mtp_weights;
    let n_params = placed.plan.n_params;
    let threads = rayon_threads(&args.model);
    let (ngl, n_layers) = placed.offload();
    let backend = placed.device_name.clone();
    if args.json || args.output == "json" {
        let tests: Vec<_> = results
            .iter()
            .map(|r| {
                let (mean, sd) = mean_sd(&r.rates);
                serde_json::json!({
                    "test": r.name,
                    "n_tokens": r.n_tokens,
                    "n_depth": args.n_depth,
                    "n_parallel": args.parallel,
                    "tokens_per_second_mean": mean,
                    "tokens_per_second_sd": sd,
                    "samples": r.rates,
                    "bytes_per_token": r.roofline.map(|x| x.0),
                    "roofline_percent": r.roofline.map(|x| x.1),
                })
            })
            .collect();
        let out = serde_json::json!({
            "model": args.model.display_name(),
            "model_type": model_name,
            "size_bytes": size_bytes,
            "n_params": n_params,
            "backend": backend,
            "n_gpu_layers": ngl,
            "n_layers": n_layers,
            "threads": threads,
            "read_bandwidth_gbs": placed.bandwidth_gbs,
            "repetitions": args.repetitions,
            "tests": tests,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!("| model | size | params | backend | ngl | threads | test | t/s | roofline |");
        println!("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |");
        for r in results {
            let (mean, sd) = mean_sd(&r.rates);
            let roof = r
                .roofline
                .map_or(String::new(), |(_, pct)| format!("{pct:.1} %"));
            println!(
                "| {} | {} | {} | {} | {}/{} | {} | {} | {:.2} ± {:.2} | {} |",
                model_name,
                human_bytes(size_bytes),
                human_count(n_params),
                backend,
                ngl,
                n_layers,
                threads,
                r.name,
                mean,
                sd,
                roof
            );
        }
        if ngl < n_layers && ngl > 0 {
            println!(
                "\npartial offload {ngl}/{n_layers}: the plan predicted {:.1} tok/s for this split ({:.1} with every layer on the GPU)",
                placed.plan.expected_tok_s, placed.plan.ceiling_tok_s
            );
        }
        if let (Some(bw), Some((bytes, _))) = (
            placed.bandwidth_gbs,
            results.iter().find_map(|r| r.roofline),
        ) {
            if args.parallel > 1 {
                println!(
                    "\nroofline: {:.2} GB read per step of {} tokens at {bw:.0} GB/s measured → {:.1} steps/s ceiling",
                    bytes / 1e9,
                    args.parallel,
                    bw * 1e9 / bytes
                );
            } else {
                println!(
                    "\nroofline: {:.2} GB read per decoded token at {bw:.0} GB/s measured → {:.1} tok/s ceiling",
                    bytes / 1e9,
                    bw * 1e9 / bytes
                );
            }
        }
    }
    Ok(())
}

/// One line per repetition on stderr, so a slow or cut-off run shows where the time went.
fn progress(test: &str, rep: usize, n_tokens: usize, secs: f64) {
    let what = if rep == 0 {
        "warm-up".to_owned()
    } else {
        format!("rep {rep}")
    };
    eprintln!(
        "  {test} {what}: {:.3} s, {:.1} tok/s",
        secs,
        n_tokens as f64 / secs
    );
}

/// Seconds for `tokens[0].len()` decode steps: one single-token forward per step for one
/// sequence, one batched forward of all sequences (`tokens[i]` goes to `states[i]`) for several.
fn decode_run<B: Backend>(
    model: &ModelOn<B>,
    states: &mut [SeqStateOn<B>],
    tokens: &[Vec<u32>],
) -> anyhow::Result<f64> {
    let t = Instant::now();
    if let [state] = states {
        for &tok in &tokens[0] {
            model.forward(state, &[tok], false).context("decode")?;
        }
    } else {
        let mut refs: Vec<&mut SeqStateOn<B>> = states.iter_mut().collect();
        let mut step = vec![0u32; tokens.len()];
        for i in 0..tokens[0].len() {
            for (s, t) in step.iter_mut().zip(tokens) {
                *s = t[i];
            }
            model
                .forward_batch(&mut refs, &step)
                .context("batched decode")?;
        }
    }
    Ok(t.elapsed().as_secs_f64())
}

fn rayon_threads(m: &ModelArgs) -> usize {
    if m.threads > 0 {
        m.threads
    } else {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    }
}

/// llama-bench's units: GiB / MiB.
fn human_bytes(b: u64) -> String {
    let gib = b as f64 / (1u64 << 30) as f64;
    if gib >= 1.0 {
        format!("{gib:.2} GiB")
    } else {
        format!("{:.2} MiB", b as f64 / (1u64 << 20) as f64)
    }
}

fn human_count(n: u64) -> String {
    let n = n as f64;
    if n >= 1e9 {
        format!("{:.2} B", n / 1e9)
    } else if n >= 1e6 {
        format!("{:.2} M", n / 1e6)
    } else {
        format!("{:.2} K", n / 1e3)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_and_sample_sd() {
        let (m, s) = mean_sd(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]);
        assert_eq!(m, 5.0);
        // sample variance 32 / 7
        assert!((s - (32.0f64 / 7.0).sqrt()).abs() < 1e-12);
        assert_eq!(mean_sd(&[3.0]), (3.0, 0.0));
        assert_eq!(mean_sd(&[]), (0.0, 0.0));
    }

    #[test]
    fn roofline_arithmetic() {
        // 18 GB of weights+state, a 10 KB embedding row, 256 KiB of KV per position.
        let w = 18_000_000_000u64;
        let b0 = decode_bytes_per_token(w, 10_000, 262_144, 0, 128);
        // tg128 at depth 0 reads on average 64.5 positions of KV.
        assert_eq!(b0, 18_000_010_000.0 + 262_144.0 * 64.5);
        let b4k = decode_bytes_per_token(w, 10_000, 262_144, 4096, 128);
        assert_eq!(b4k - b0, 262_144.0 * 4096.0);
        // 200 tok/s × 18 GB = 3.6 TB/s of a 4.0 TB/s card = 90 %.
        assert!((roofline_percent(18e9, 200.0, 4000.0) - 90.0).abs() < 1e-9);
        assert_eq!(roofline_percent(18e9, 200.0, 0.0), 0.0);
        // A single decode step at depth 0 reads the one position it writes.
        assert_eq!(decode_bytes_per_token(100, 0, 10, 0, 1), 110.0);
    }

    #[test]
    fn units() {
        assert_eq!(human_bytes(1_115_000_000), "1.04 GiB");
        assert_eq!(human_bytes(1 << 20), "1.00 MiB");
        assert_eq!(human_count(1_543_714_304), "1.54 B");
        assert_eq!(human_count(260_000), "260.00 K");
    }
}
