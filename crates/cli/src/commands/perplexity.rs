//! `redline perplexity -m MODEL -f TEXT [-c N] [--kl-divergence-base FILE [--kl-divergence]]`
//! (llama-perplexity): perplexity in chunks, and KL divergence / top-1 agreement of a
//! (quantized) model against a base model's saved log-probabilities.

use std::fs::File;
use std::io::{BufReader, BufWriter, Write};
use std::path::PathBuf;

use anyhow::{bail, Context};
use convert::{evaluate, make_chunks, KlMode};
use engine::Tokenizer;
use model::{LoadOptions, Model};

#[derive(clap::Args)]
pub struct Args {
    /// GGUF model.
    #[arg(short = 'm', long)]
    pub model: PathBuf,
    /// Text file to score.
    #[arg(short = 'f', long)]
    pub file: PathBuf,
    /// Tokens per chunk; the second half of each chunk is scored.
    #[arg(short = 'c', long, default_value_t = 512)]
    pub ctx: usize,
    /// Score at most this many chunks.
    #[arg(long)]
    pub chunks: Option<usize>,
    /// Base log-probabilities file: written, or with --kl-divergence read and compared against.
    #[arg(long)]
    pub kl_divergence_base: Option<PathBuf>,
    /// Compare against --kl-divergence-base instead of writing it.
    #[arg(long)]
    pub kl_divergence: bool,
    /// CPU threads (0 = one per core).
    #[arg(short = 't', long, default_value_t = 0)]
    pub threads: usize,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if args.kl_divergence && args.kl_divergence_base.is_none() {
        bail!(
            "--kl-divergence needs --kl-divergence-base FILE (written by a run of the base model)"
        );
    }
    let opts = LoadOptions {
        n_threads: args.threads,
        ..LoadOptions::default()
    };
    let model = Model::load(&args.model, &opts)
        .with_context(|| format!("loading {}", args.model.display()))?;
    let tok = Tokenizer::from_gguf(model.gguf().metadata())?;
    let text = std::fs::read_to_string(&args.file)
        .with_context(|| format!("reading {}", args.file.display()))?;
    // As llama-perplexity: the whole text is tokenized with the model's special tokens (BOS
    // when it adds one), so the chunks cover the same tokens as llama.cpp's.
    let tokens = tok.encode(&text, true, false)?;
    // llama.cpp puts BOS at the start of each chunk when the model adds one.
    let bos = if tok.encode("", true, false)?.is_empty() {
        None
    } else {
        tok.bos()
    };
    let chunks = make_chunks(&tokens, args.ctx, args.chunks, bos);
    if chunks.is_empty() {
        bail!(
            "{} has {} tokens, fewer than one chunk of -c {}",
            args.file.display(),
            tokens.len(),
            args.ctx
        );
    }
    eprintln!(
        "{} tokens; {} chunks of {} (scoring {} tokens each)",
        tokens.len(),
        chunks.len(),
        args.ctx,
        args.ctx - 1 - args.ctx / 2
    );
    let mut save;
    let mut load;
    let kl = match (&args.kl_divergence_base, args.kl_divergence) {
        (None, _) => KlMode::None,
        (Some(p), false) => {
            save = BufWriter::new(
                File::create(p).with_context(|| format!("creating {}", p.display()))?,
            );
            KlMode::SaveBase(&mut save)
        }
        (Some(p), true) => {
            load =
                BufReader::new(File::open(p).with_context(|| format!("opening {}", p.display()))?);
            KlMode::Compare(&mut load)
        }
    };
    let scores = evaluate(&model, &chunks, kl, &mut |i, n, s| {
        eprint!("[{i}/{n}] ppl {:.4}\r", s.perplexity());
        let _ = std::io::stderr().flush();
    })?;
    eprintln!();
    println!(
        "perplexity: {:.4} +/- {:.4} over {} tokens",
        scores.perplexity(),
        scores.perplexity_stderr(),
        scores.n_scored
    );
    if scores.n_kl > 0 {
        println!(
            "KL divergence: mean {:.6} nats over {} tokens; top-1 agreement {:.2} %",
            scores.mean_kl(),
            scores.n_kl,
            100.0 * scores.top1_agreement()
        );
    }
    if let (Some(p), false) = (&args.kl_divergence_base, args.kl_divergence) {
        println!("base log-probabilities written to {}", p.display());
    }
    Ok(())
}
