//! `redline perplexity` through the binary against llama.cpp's `llama-perplexity` on the same
//! model and text (owner: quality). The expected value was measured with llama.cpp build
//! 0c1e570 (vendored in llama-cpp-python 0.3.36), CPU:
//!   llama-perplexity -m models/stories260K.gguf -f tests/data/vocab/ggml-vocab-llama-spm.gguf.inp
//!     -c 128 -t 2 -ctk f32 -ctv f32 -fa off   ->  13 chunks, Final estimate: PPL = 455014.6402
//! (f32 cache and flash attention off: llama.cpp's attention is then plain f32, like redline's
//! perplexity). The text is llama.cpp's tokenizer edge cases, so the perplexity is huge; what
//! matters is that both programs score the same tokens (BOS, chunking, second half of each
//! chunk) with the same model arithmetic.

use std::process::Command;

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
const LLAMA_CPP_PPL: f64 = 455014.6402;

#[test]
fn perplexity_matches_llama_cpp_on_stories260k() {
    let out = Command::new(env!("CARGO_BIN_EXE_redline"))
        .args([
            "perplexity",
            "-m",
            &format!("{ROOT}/models/stories260K.gguf"),
            "-f",
            &format!("{ROOT}/tests/data/vocab/ggml-vocab-llama-spm.gguf.inp"),
            "-c",
            "128",
            "-t",
            "2",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // 1746 text tokens + BOS, as llama.cpp tokenizes it: 13 chunks.
    assert!(stderr.contains("1747 tokens; 13 chunks of 128"), "{stderr}");
    let ppl: f64 = stdout
        .split("perplexity: ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no perplexity in {stdout}"));
    let rel = (ppl / LLAMA_CPP_PPL - 1.0).abs();
    assert!(
        rel < 1e-5,
        "perplexity {ppl} vs llama.cpp {LLAMA_CPP_PPL} (relative {rel:.2e})"
    );
}
