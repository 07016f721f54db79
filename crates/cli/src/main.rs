//! `redline`: run, serve, inspect and measure quantized GGUF language models.
//!
//! Each subcommand lives in `commands/<name>.rs` with its own `Args` struct and `run` function.

mod commands;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "redline",
    version,
    about = "Run quantized GGUF language models at the memory-bandwidth limit",
    long_about = "redline runs quantized GGUF language models on one GPU (or the CPU) and serves \
                  them over an OpenAI-compatible API.\n\nRun with no model to try the bundled \
                  tiny story model: `redline run -p \"Once upon a time\"`."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show a GGUF file's architecture, hyperparameters, tokenizer and tensors.
    Inspect(commands::inspect::Args),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Inspect(args) => commands::inspect::run(args),
    }
}
