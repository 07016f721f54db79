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
    /// Print the token ids of a text under a model's tokenizer (llama-tokenize style).
    Tokenize(commands::tokenize::Args),
    /// Complete a prompt (-p), or chat; with no -m, the bundled tiny story model.
    Run(commands::run::Args),
    /// Measure prefill and decode speed (llama-bench style).
    Bench(commands::bench::Args),
    /// Write a GGUF of a real model's shape with random weights.
    Synth(commands::synth::Args),
    /// Serve the model over an OpenAI-compatible HTTP API (chat page at /).
    Serve(commands::serve::Args),
    /// Plan memory on a GPU: the ledger, layers that fit, decode ceiling, what would fit.
    Plan(commands::plan::Args),
    /// Check the GPU path: driver, NVRTC, kernels, bandwidth, matvec vs the CPU reference.
    Selftest(commands::selftest::Args),
    /// Quantize a GGUF file (llama-quantize mixes: Q4_K_M, Q8_0, IQ4_XS …).
    Quantize(commands::quantize::Args),
    /// Convert a Hugging Face checkpoint (safetensors) to GGUF.
    Convert(commands::convert::Args),
    /// Perplexity of a text, and KL divergence against a base model (llama-perplexity).
    Perplexity(commands::perplexity::Args),
    /// Compute an importance matrix from a text, for quantize --imatrix (llama-imatrix).
    Imatrix(commands::imatrix::Args),
    /// Cost of one speculative verify pass of k tokens vs one decode step (and a draft step).
    VerifyBench(commands::speculate::BenchArgs),
}

fn main() -> anyhow::Result<()> {
    keep_freed_heap();
    // `-ngl N` (llama.cpp's spelling) becomes `--ngl N`: clap's short flags are one letter.
    let cli = Cli::parse_from(commands::device_args::rewrite_llama_flags(
        std::env::args_os(),
    ));
    match cli.command {
        Command::Inspect(args) => commands::inspect::run(args),
        Command::Tokenize(args) => commands::tokenize::run(args),
        Command::Run(args) => commands::run::run(args),
        Command::Bench(args) => commands::bench::run(args),
        Command::Synth(args) => commands::synth::run(args),
        Command::Serve(args) => commands::serve::run(args),
        Command::Plan(args) => commands::plan::run(args),
        Command::Selftest(args) => commands::selftest::run(args),
        Command::Quantize(args) => commands::quantize::run(args),
        Command::Convert(args) => commands::convert::run(args),
        Command::Perplexity(args) => commands::perplexity::run(args),
        Command::Imatrix(args) => commands::imatrix::run(args),
        Command::VerifyBench(args) => commands::speculate::bench(args),
    }
}

/// Keeps freed heap memory in the process instead of handing it back to the system at once
/// (glibc's malloc). Every decode step returns its logits in a fresh vector: 32 sequences of a
/// 152064-token vocabulary are 19.5 MB a step, twice (the download and the batch's vector).
/// With glibc's defaults, freeing them returned the memory and the next step faulted it in
/// again, page by page: on an H100 a 32-row step of the 32B took 28 ms on the card and 63 ms in
/// all, 24 rows 22 and 47 ms, while 16 rows (9.7 MB, under the thresholds) lost 2.6 ms. With
/// `MALLOC_TRIM_THRESHOLD_=2000000000` the same runs gave 978.9 tok/s at 32 rows against 558.3,
/// and 926.5 against 591.3 at 24 (session 24). Here: blocks up to 32 MiB (glibc's ceiling for
/// this setting) come from the heap, and up to 1 GiB of free heap top stays mapped.
///
/// And one arena for all threads: the server decodes on its scheduler thread, whose own arena
/// gave each step's logits a heap of their own that glibc unmapped when they were freed (the
/// trim threshold does not keep a whole empty heap). 8 serve streams of the 32B on an H100
/// spent 15.5 ms in a step's forward with 12.0 on the card; `MALLOC_ARENA_MAX=1` gave 12.5 ms
/// and 612.9 tok/s against 491.2 (session 24). The server's other threads allocate little
/// (requests, JSON, tokens), so one arena's lock costs nothing measurable beside a step.
fn keep_freed_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes malloc's tuning; called once, before any other thread runs.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}
