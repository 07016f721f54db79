//! `redline bench`: prompt processing (pp) and token generation (tg) speed, measured the way
//! llama-bench measures them: after one warm-up run, each test repeated `-r` times on a fresh
//! sequence; pp = one forward of `-p` random tokens, tg = `-n` single-token forwards;
//! reported as mean ± sample standard deviation of tokens/s.

use std::time::Instant;

use anyhow::Context;
use model::{KvType, Model};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::run::ModelArgs;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Prompt tokens for the prefill test (0 skips it).
    #[arg(short = 'p', long = "n-prompt", default_value_t = 512)]
    n_prompt: usize,
    /// Tokens for the decode test (0 skips it).
    #[arg(short = 'n', long = "n-gen", default_value_t = 128)]
    n_gen: usize,
    /// Repetitions of each test.
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    repetitions: usize,
    /// Print one JSON object instead of the markdown table.
    #[arg(long)]
    json: bool,
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

struct TestResult {
    name: String,
    n_tokens: usize,
    /// tokens/s of each repetition.
    rates: Vec<f64>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let model = args.model.load()?;
    let cfg = model.config().clone();
    let file = model.gguf();
    let size_bytes: u64 = file.tensors().iter().map(|t| t.n_bytes).sum();
    let n_params: u64 = file.tensors().iter().map(|t| t.n_elements()).sum();
    let n_ctx = (args.n_prompt + args.n_gen).max(1);
    let n_vocab = cfg.n_vocab as u32;
    let threads = rayon_threads(&args.model);
    // Random token ids, as llama-bench uses: the speed does not depend on them.
    let mut rng = StdRng::seed_from_u64(1234);
    let mut random_tokens =
        |n: usize| -> Vec<u32> { (0..n).map(|_| rng.random_range(0..n_vocab)).collect() };

    let mut results = Vec::new();
    if args.n_prompt > 0 {
        let tokens = random_tokens(args.n_prompt);
        let mut rates = Vec::new();
        for rep in 0..=args.repetitions {
            let mut state = model.new_state(n_ctx, KvType::F16)?;
            let t = Instant::now();
            model
                .forward(&mut state, &tokens, false)
                .context("prefill")?;
            let s = t.elapsed().as_secs_f64();
            if rep > 0 {
                rates.push(args.n_prompt as f64 / s);
            }
        }
        results.push(TestResult {
            name: format!("pp{}", args.n_prompt),
            n_tokens: args.n_prompt,
            rates,
        });
    }
    if args.n_gen > 0 {
        let tokens = random_tokens(args.n_gen);
        let mut rates = Vec::new();
        for rep in 0..=args.repetitions {
            let mut state = model.new_state(n_ctx, KvType::F16)?;
            let s = decode_run(&model, &mut state, &tokens)?;
            if rep > 0 {
                rates.push(args.n_gen as f64 / s);
            }
        }
        results.push(TestResult {
            name: format!("tg{}", args.n_gen),
            n_tokens: args.n_gen,
            rates,
        });
    }

    let model_name = format!(
        "{} {}",
        cfg.arch.name(),
        gguf::file_type_name(
            file.metadata()
                .get_u32("general.file_type")
                .unwrap_or(u32::MAX)
        )
        .unwrap_or("?")
    );
    if args.json {
        let tests: Vec<_> = results
            .iter()
            .map(|r| {
                let (mean, sd) = mean_sd(&r.rates);
                serde_json::json!({
                    "test": r.name,
                    "n_tokens": r.n_tokens,
                    "tokens_per_second_mean": mean,
                    "tokens_per_second_sd": sd,
                    "samples": r.rates,
                })
            })
            .collect();
        let out = serde_json::json!({
            "model": args.model.display_name(),
            "model_type": model_name,
            "size_bytes": size_bytes,
            "n_params": n_params,
            "backend": "cpu",
            "threads": threads,
            "repetitions": args.repetitions,
            "tests": tests,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!("| model | size | params | backend | threads | test | t/s |");
        println!("| --- | ---: | ---: | --- | ---: | ---: | ---: |");
        for r in &results {
            let (mean, sd) = mean_sd(&r.rates);
            println!(
                "| {} | {} | {} | cpu | {} | {} | {:.2} ± {:.2} |",
                model_name,
                human_bytes(size_bytes),
                human_count(n_params),
                threads,
                r.name,
                mean,
                sd
            );
        }
    }
    Ok(())
}

/// Seconds for `tokens.len()` single-token forwards.
fn decode_run(model: &Model, state: &mut model::SeqState, tokens: &[u32]) -> anyhow::Result<f64> {
    let t = Instant::now();
    for &tok in tokens {
        model.forward(state, &[tok], false).context("decode")?;
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
    fn units() {
        assert_eq!(human_bytes(1_115_000_000), "1.04 GiB");
        assert_eq!(human_bytes(1 << 20), "1.00 MiB");
        assert_eq!(human_count(1_543_714_304), "1.54 B");
        assert_eq!(human_count(260_000), "260.00 K");
    }
}
