//! `redline tokenize` through the binary: llama.cpp's expected ids for a Qwen2 vocab case,
//! BOS handling on the bundled SentencePiece model, and the `id -> 'piece'` listing.

use std::process::Command;

const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data");

fn redline(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_redline"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "redline {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// tests/data/vocab/ggml-vocab-qwen2.gguf.zst decompressed to a temporary file.
fn qwen2_vocab_file() -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!(
        "redline-tokenize-qwen2-{}.gguf",
        std::process::id()
    ));
    let compressed = std::fs::read(format!("{DATA}/vocab/ggml-vocab-qwen2.gguf.zst")).unwrap();
    let mut dec = ruzstd::decoding::StreamingDecoder::new(compressed.as_slice()).unwrap();
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut dec, &mut bytes).unwrap();
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn ids_match_llama_cpp_vocab_cases() {
    let inp = std::fs::read_to_string(format!("{DATA}/vocab/ggml-vocab-qwen2.gguf.inp")).unwrap();
    let out = std::fs::read_to_string(format!("{DATA}/vocab/ggml-vocab-qwen2.gguf.out")).unwrap();
    let texts: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
    let ids: Vec<&str> = out.lines().collect();
    let vocab = qwen2_vocab_file();
    let vocab_arg = vocab.to_str().unwrap();
    // "Hello, world!", a Unicode-heavy case, and digits (llama.cpp's case order).
    let mut checked = 0;
    for (text, want) in texts.iter().zip(&ids) {
        if !(text.starts_with("Hello, world") || text.contains("🦙") || text.starts_with("3333"))
        {
            continue;
        }
        let want: Vec<&str> = want.split_whitespace().collect();
        let got = redline(&["tokenize", "-m", vocab_arg, "-p", text, "--ids"]);
        assert_eq!(got, format!("[{}]\n", want.join(", ")), "{text:?}");
        checked += 1;
    }
    std::fs::remove_file(&vocab).ok();
    assert!(checked >= 2, "only {checked} cases found");
}

#[test]
fn bos_and_listing_on_stories260k() {
    let model = format!("{DATA}/../../models/stories260K.gguf");
    assert_eq!(
        redline(&["tokenize", "-m", &model, "-p", "Once upon a time", "--ids"]),
        "[1, 403, 407, 261, 378]\n"
    );
    assert_eq!(
        redline(&[
            "tokenize",
            "-m",
            &model,
            "-p",
            "Once upon a time",
            "--ids",
            "--no-bos"
        ]),
        "[403, 407, 261, 378]\n"
    );
    let listing = redline(&["tokenize", "-m", &model, "-p", "Once upon a time"]);
    let lines: Vec<&str> = listing.lines().collect();
    assert_eq!(lines.len(), 5, "{listing}");
    assert_eq!(lines[0], "     1 -> '<s>'");
    assert!(lines[1].starts_with("   403 -> ' "), "{listing}");
}

#[test]
fn reads_text_from_file() {
    let model = format!("{DATA}/../../models/stories260K.gguf");
    let path =
        std::env::temp_dir().join(format!("redline-tokenize-text-{}.txt", std::process::id()));
    std::fs::write(&path, "Once upon a time").unwrap();
    let got = redline(&[
        "tokenize",
        "-m",
        &model,
        "-f",
        path.to_str().unwrap(),
        "--ids",
    ]);
    std::fs::remove_file(&path).ok();
    assert_eq!(got, "[1, 403, 407, 261, 378]\n");
}
