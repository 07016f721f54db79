//! `redline inspect` on real files; expected numbers cross-checked with gguf-py
//! (sum of `ReaderTensor.n_elements` / `n_bytes`, metadata via `ReaderField.contents()`).

use std::process::Command;

use serde_json::Value;

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

fn inspect(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_redline"))
        .arg("inspect")
        .args(args)
        .output()
        .unwrap()
}

fn inspect_json(path: &str) -> Value {
    let out = inspect(&["--json", path]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn json_for_llama_q8_0_fixture() {
    let j = inspect_json(&format!("{ROOT}/tests/data/fixtures/llama/model-q8_0.gguf"));
    assert_eq!(j["architecture"], "llama");
    assert_eq!(j["file_type"], "Q8_0");
    assert_eq!(j["n_tensors"], 21);
    assert_eq!(j["n_params"], 1_443_072);
    assert_eq!(j["tensor_bytes"], 1_537_024);
    let by_type = j["by_type"].as_array().unwrap();
    let bytes_of = |ty: &str| by_type.iter().find(|t| t["type"] == ty).unwrap()["n_bytes"].clone();
    assert_eq!(bytes_of("q8_0"), 1_531_904);
    assert_eq!(bytes_of("f32"), 5_120);
    assert_eq!(j["hyperparameters"]["block_count"], 2);
    assert_eq!(j["hyperparameters"]["attention.head_count_kv"], 2);
    let tok = &j["tokenizer"];
    assert_eq!(tok["model"], "gpt2");
    assert_eq!(tok["pre"], "llama-bpe");
    assert_eq!(tok["vocab_size"], 512);
    assert_eq!(tok["eos_token_id"], 511);
    assert_eq!(tok["eos_token"], "<|im_end|>");
    assert_eq!(tok["add_bos_token"], false);
    assert_eq!(tok["has_chat_template"], true);
    let emb = j["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "token_embd.weight");
    assert_eq!(emb.unwrap()["shape"], serde_json::json!([256, 512]));
}

#[test]
fn json_for_stories260k() {
    let j = inspect_json(&format!("{ROOT}/models/stories260K.gguf"));
    assert_eq!(j["n_tensors"], 48);
    assert_eq!(j["n_params"], 292_800);
    assert_eq!(j["bits_per_weight"], 32.0);
    assert_eq!(j["tokenizer"]["model"], "llama");
    assert_eq!(j["tokenizer"]["bos_token_id"], 1);
    assert_eq!(j["tokenizer"]["bos_token"], "<s>");
    assert_eq!(j["tokenizer"]["has_chat_template"], false);
}

#[test]
fn human_output_reads_well() {
    let out = inspect(&[&format!(
        "{ROOT}/tests/data/fixtures/qwen35/model-q8_0.gguf"
    )]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    // 2,630,224 params and 2,808,384 tensor bytes per gguf-py.
    assert!(
        text.contains("2.63 M params in 53 tensors, 2.7 MiB of weights, 8.54 bits/weight"),
        "{text}"
    );
    assert!(text.contains("hyperparameters (qwen35.*)"));
    assert!(text.contains("eos token      511 \"<|im_end|>\""), "{text}");
    assert!(text.contains("ssm.conv_kernel"));
}

#[test]
fn errors_say_what_to_do() {
    let out = inspect(&["/nonexistent/model.gguf"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("check the path"));
    let out = inspect(&[&format!("{ROOT}/Cargo.toml")]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a GGUF file"));
}
