//! `redline synth`: write a GGUF of a real model's exact shape with random weights, to measure
//! speed or memory before downloading the real thing. The text it generates is meaningless.

use std::fs::File;
use std::io::BufWriter;
use std::path::PathBuf;

use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressStyle};
use model::synth::{FileType, Shape, SynthPlan};

#[derive(clap::Args)]
pub struct Args {
    /// Model shape: qwen2.5-1.5b, qwen2.5-32b, qwen3.5-27b, llama3-8b.
    #[arg(long)]
    shape: String,
    /// Quantization: Q4_K_M (llama.cpp's mix), IQ4_XS, Q4_0, Q8_0 (pure), F16, F32.
    #[arg(long = "type", default_value = "Q4_K_M")]
    ftype: String,
    /// Output file.
    #[arg(short, long)]
    output: PathBuf,
    /// Seed of the random weights (the same seed writes the same file).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Keep only the first N layers (same per-layer shapes; a quick file for load tests).
    #[arg(long)]
    layers: Option<usize>,
    /// Print the tensor plan and size, write nothing.
    #[arg(long)]
    dry_run: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let Some(mut shape) = Shape::preset(&args.shape) else {
        let names: Vec<String> = Shape::presets().into_iter().map(|s| s.name).collect();
        bail!(
            "unknown shape {:?}; known: {}",
            args.shape,
            names.join(", ")
        );
    };
    let Some(ftype) = FileType::from_name(&args.ftype) else {
        let names: Vec<&str> = FileType::ALL.iter().map(|t| t.name()).collect();
        bail!("unknown type {:?}; known: {}", args.ftype, names.join(", "));
    };
    if let Some(n) = args.layers {
        if n == 0 || n > shape.n_layer {
            bail!("--layers must be 1..={}", shape.n_layer);
        }
        shape.n_layer = n;
    }
    let plan = SynthPlan::new(shape, ftype);
    let data = plan.data_bytes();
    eprintln!(
        "{} {}: {} tensors, {:.3} B params, {:.2} GB of tensor data",
        plan.shape.name,
        ftype.name(),
        plan.tensors.len(),
        plan.n_params() as f64 / 1e9,
        data as f64 / 1e9
    );
    if args.dry_run {
        for t in &plan.tensors {
            println!("{:<36} {:<8} {:?}", t.name, t.ty.name(), t.dims);
        }
        return Ok(());
    }

    let file = File::create(&args.output)
        .with_context(|| format!("creating {}", args.output.display()))?;
    let bar = ProgressBar::new(data);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
            .expect("valid template"),
    );
    plan.write(BufWriter::with_capacity(1 << 20, file), args.seed, |n| {
        bar.inc(n)
    })
    .with_context(|| format!("writing {}", args.output.display()))?;
    bar.finish_and_clear();
    let len = std::fs::metadata(&args.output)?.len();
    eprintln!(
        "wrote {} ({:.3} GB)",
        args.output.display(),
        len as f64 / 1e9
    );
    Ok(())
}
