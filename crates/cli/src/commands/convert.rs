//! `redline convert HF_DIR -o OUT.gguf [--outtype f32|f16|bf16|q8_0]`: a Hugging Face
//! checkpoint (Llama, Qwen2, Qwen3, Qwen3.5 dense) to GGUF, as llama.cpp's converter does.

use std::path::PathBuf;

use anyhow::{bail, Context};
use convert::{convert_hf, OutType};
use indicatif::{ProgressBar, ProgressStyle};

#[derive(clap::Args)]
pub struct Args {
    /// Directory with config.json, *.safetensors (+ index), tokenizer.json, tokenizer_config.json.
    pub dir: PathBuf,
    /// Output GGUF.
    #[arg(short = 'o', long)]
    pub output: PathBuf,
    /// Type of the weight matrices: f32, f16, bf16 or q8_0 (norms and 1-D tensors stay f32).
    #[arg(long, default_value = "f16")]
    pub outtype: String,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let Some(outtype) = OutType::from_name(&args.outtype) else {
        bail!(
            "unknown --outtype {:?}; one of f32, f16, bf16, q8_0",
            args.outtype
        );
    };
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {percent:>3}% {pos}/{len} weights, eta {eta}")
            .expect("valid template"),
    );
    let report = convert_hf(&args.dir, &args.output, outtype, &mut |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    })
    .with_context(|| format!("converting {}", args.dir.display()))?;
    bar.finish_and_clear();
    println!(
        "{} -> {}: {} {} tensors, {:.1} MB",
        args.dir.display(),
        args.output.display(),
        report.n_tensors,
        report.arch,
        report.bytes_out as f64 / 1e6
    );
    Ok(())
}
