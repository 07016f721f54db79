//! `redline quantize IN.gguf OUT.gguf TYPE`: llama-quantize's per-tensor mixes, streamed.

use std::path::PathBuf;

use anyhow::{bail, Context};
use convert::{load_imatrix, quantize_file, QuantizeOptions};
use indicatif::{ProgressBar, ProgressStyle};
use model::synth::FileType;

#[derive(clap::Args)]
pub struct Args {
    /// Input GGUF (F32, F16 or BF16; a quantized input is requantized, losing quality).
    pub input: PathBuf,
    /// Output GGUF.
    pub output: PathBuf,
    /// Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K_S, Q3_K_M, Q3_K_L, Q4_K_S, Q4_K_M, Q5_K_S,
    /// Q5_K_M, Q6_K, IQ4_NL, IQ4_XS, F16, BF16, F32.
    pub ftype: String,
    /// Importance matrix (llama.cpp's GGUF imatrix format, as `redline imatrix` writes).
    #[arg(long)]
    pub imatrix: Option<PathBuf>,
    /// Worker threads (default: all cores).
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
    /// One type for every quantizable tensor, head and embedding included (llama-quantize
    /// --pure: no per-tensor mix).
    #[arg(long)]
    pub pure: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let Some(ftype) = FileType::from_name(&args.ftype) else {
        let names: Vec<&str> = FileType::ALL.iter().map(|t| t.name()).collect();
        bail!("unknown type {:?}; one of {}", args.ftype, names.join(", "));
    };
    let imatrix = match &args.imatrix {
        Some(p) => Some(load_imatrix(p).with_context(|| format!("reading {}", p.display()))?),
        None => None,
    };
    let opts = QuantizeOptions {
        ftype,
        imatrix,
        threads: args.threads,
        pure: args.pure,
    };
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {percent:>3}% {pos}/{len} weights, eta {eta}")
            .expect("valid template"),
    );
    let report = quantize_file(&args.input, &args.output, &opts, &mut |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    })
    .with_context(|| format!("quantizing {}", args.input.display()))?;
    bar.finish_and_clear();
    if !report.requantized.is_empty() {
        eprintln!(
            "warning: {} tensors were already quantized and were requantized (quality is lost; \
             quantize from F32/F16/BF16 when you can)",
            report.requantized.len()
        );
    }
    let mut counts: Vec<(String, usize)> = Vec::new();
    for t in &report.tensors {
        match counts.iter_mut().find(|(n, _)| n == t.to.name()) {
            Some(c) => c.1 += 1,
            None => counts.push((t.to.name().to_owned(), 1)),
        }
    }
    let mix: Vec<String> = counts.iter().map(|(n, c)| format!("{c} {n}")).collect();
    println!(
        "{} -> {} ({}): {:.1} MB -> {:.1} MB of tensors; {}",
        args.input.display(),
        args.output.display(),
        ftype.name(),
        report.bytes_in as f64 / 1e6,
        report.bytes_out as f64 / 1e6,
        mix.join(", ")
    );
    if opts.imatrix.is_some() {
        let n = report.tensors.iter().filter(|t| t.used_imatrix).count();
        println!("imatrix applied to {n} tensors");
    }
    Ok(())
}
