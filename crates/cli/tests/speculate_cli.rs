//! `redline run --md` / `--mtp` and `redline verify-bench` through the binary (CPU).

use std::process::Command;

use serde_json::Value;

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

fn redline(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_redline"))
        .args(args)
        .output()
        .unwrap()
}

fn run_json(extra: &[&str]) -> Value {
    let stories = format!("{ROOT}/models/stories260K.gguf");
    let mut args = vec![
        "run",
        "-m",
        &stories,
        "-p",
        "Once upon a time",
        "-n",
        "48",
        "--temp",
        "0",
        "--json",
        "--ignore-eos",
        "--device",
        "cpu",
    ];
    args.extend_from_slice(extra);
    let out = redline(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn run_with_a_self_draft_gives_the_plain_greedy_tokens_and_full_acceptance() {
    let stories = format!("{ROOT}/models/stories260K.gguf");
    let plain = run_json(&[]);
    let spec = run_json(&["-md", &stories, "--draft-max", "5", "--draft-p-min", "0"]);
    assert_eq!(spec["tokens"], plain["tokens"]);
    assert_eq!(spec["text"], plain["text"]);
    let s = &spec["speculative"];
    assert!(s["drafted"].as_u64().unwrap() > 0);
    assert_eq!(s["acceptance_rate"].as_f64(), Some(1.0));
    assert!(s["tokens_per_pass"].as_f64().unwrap() > 5.0);
}

#[test]
fn mtp_on_a_model_without_one_and_a_foreign_draft_are_clear_errors() {
    let stories = format!("{ROOT}/models/stories260K.gguf");
    let out = redline(&["run", "-m", &stories, "-p", "a", "--mtp", "--device", "cpu"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("multi-token-prediction"));
    let qwen = format!("{ROOT}/tests/data/fixtures/qwen35/model-q8_0.gguf");
    let out = redline(&[
        "run", "-m", &stories, "-p", "a", "--md", &qwen, "--device", "cpu",
    ]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("vocabulary"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn verify_bench_prints_one_row_per_k() {
    let stories = format!("{ROOT}/models/stories260K.gguf");
    let out = redline(&[
        "verify-bench",
        "-m",
        &stories,
        "-k",
        "1,3",
        "-d",
        "16",
        "-r",
        "2",
        "--json",
        "--device",
        "cpu",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j: Value = serde_json::from_slice(&out.stdout).unwrap();
    let passes = j["passes"].as_array().unwrap();
    assert_eq!(passes.len(), 3, "decode step + k=1 + k=3");
    assert_eq!(passes[0]["x_decode_step"].as_f64(), Some(1.0));
    assert!(passes.iter().all(|p| p["ms"].as_f64().unwrap() > 0.0));
}
