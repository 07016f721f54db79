//! `redline inspect FILE`: what is in a GGUF file.

use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// The GGUF file to describe.
    pub file: PathBuf,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    anyhow::bail!("inspect is not implemented yet ({})", args.file.display())
}
