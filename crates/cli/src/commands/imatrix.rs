//! `redline imatrix -m MODEL -f TEXT -o imatrix.gguf [-c N]` (llama-imatrix): mean squared
//! input activations of every weight matrix over a text, for `redline quantize --imatrix`.

use std::path::PathBuf;

use anyhow::{bail, Context};
use convert::{collect_imatrix, make_chunks, save_imatrix};
use engine::Tokenizer;
use gguf::GgufFile;
use indicatif::{ProgressBar, ProgressStyle};
use model::LoadOptions;

#[derive(clap::Args)]
pub struct Args {
    /// GGUF model (F32/F16/BF16 or quantized).
    #[arg(short = 'm', long)]
    pub model: PathBuf,
    /// Calibration text.
    #[arg(short = 'f', long)]
    pub file: PathBuf,
    /// Output imatrix (llama.cpp's GGUF imatrix format).
    #[arg(short = 'o', long, default_value = "imatrix.gguf")]
    pub output: PathBuf,
    /// Tokens per chunk.
    #[arg(short = 'c', long, default_value_t = 512)]
    pub ctx: usize,
    /// Use at most this many chunks.
    #[arg(long)]
    pub chunks: Option<usize>,
    /// Also collect the output head's input (llama-imatrix --process-output).
    #[arg(long)]
    pub process_output: bool,
    /// CPU threads (0 = one per core).
    #[arg(short = 't', long, default_value_t = 0)]
    pub threads: usize,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let file =
        GgufFile::open(&args.model).with_context(|| format!("opening {}", args.model.display()))?;
    let tok = Tokenizer::from_gguf(file.metadata())?;
    let text = std::fs::read_to_string(&args.file)
        .with_context(|| format!("reading {}", args.file.display()))?;
    let tokens = tok.encode(&text, false, false)?;
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
    let bar = ProgressBar::new(chunks.len() as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} chunks, eta {eta}")
            .expect("valid template"),
    );
    let opts = LoadOptions {
        n_threads: args.threads,
        ..LoadOptions::default()
    };
    let entries = collect_imatrix(file, &chunks, &opts, args.process_output, &mut |i, _| {
        bar.set_position(i as u64)
    })?;
    bar.finish_and_clear();
    let dataset = args.file.display().to_string();
    save_imatrix(
        &args.output,
        &entries,
        chunks.len() as u32,
        args.ctx as u32,
        &dataset,
    )?;
    println!(
        "{} weights, {} chunks of {} tokens -> {}",
        entries.len(),
        chunks.len(),
        args.ctx,
        args.output.display()
    );
    Ok(())
}
