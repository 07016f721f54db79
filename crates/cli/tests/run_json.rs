//! End-to-end: `redline run --json` on the bundled stories260K against llama.cpp's greedy
//! continuation (tests/data/stories260K.reference.jsonl).

use std::process::Command;

fn reference() -> serde_json::Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/data/stories260K.reference.jsonl"
    );
    let text = std::fs::read_to_string(path).expect("reference file");
    serde_json::from_str(text.lines().next().expect("one line")).expect("json")
}

fn run_json(extra: &[&str]) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_redline"))
        .args(["run", "-p", "Once upon a time", "--json", "-t", "2"])
        .args(extra)
        .output()
        .expect("redline runs");
    assert!(
        out.status.success(),
        "redline failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("stdout is one JSON object")
}

#[test]
fn greedy_bundled_model_matches_llama_cpp() {
    let r = reference();
    let n = r["tokens"].as_array().unwrap().len().to_string();
    let got = run_json(&["--temp", "0", "-n", &n]);
    assert_eq!(
        got["tokens"], r["tokens"],
        "generated ids differ from llama.cpp's"
    );
    assert_eq!(got["text"], r["content"]);
    assert_eq!(
        got["prompt_tokens"].as_array().unwrap().len() as u64,
        r["prompt_n"].as_u64().unwrap()
    );
    assert_eq!(got["finish_reason"], "length");
    let t = &got["timings"];
    assert_eq!(t["predicted_n"].as_u64(), Some(64));
    assert!(t["predicted_per_second"].as_f64().unwrap() > 0.0);
}

#[test]
fn same_seed_same_output() {
    let a = run_json(&["--temp", "1.0", "--seed", "42", "-n", "24"]);
    let b = run_json(&["--temp", "1.0", "--seed", "42", "-n", "24"]);
    assert_eq!(a["tokens"], b["tokens"]);
    assert_eq!(a["seed"], 42);
    let c = run_json(&["--temp", "1.0", "--seed", "43", "-n", "24"]);
    assert_ne!(a["tokens"], c["tokens"]);
}

#[test]
fn stop_string_ends_the_text() {
    let got = run_json(&["--temp", "0", "-n", "64", "--stop", "Lily"]);
    assert_eq!(got["text"], ", there was a little girl named ");
    assert_eq!(got["finish_reason"], "stop");
}

#[test]
fn logit_bias_bans_a_token() {
    // Banning the first greedy token (432, ",") changes the continuation.
    let got = run_json(&["--temp", "0", "-n", "8", "-l", "432-inf"]);
    let first = got["tokens"][0].as_u64().unwrap();
    assert_ne!(first, 432);
    assert!(!got["tokens"].as_array().unwrap().iter().any(|t| t == 432));
}

/// Chat mode reads turns from stdin until EOF: two turns through a model with a chat template
/// (the qwen2 fixture) and one without (stories260K, plain continuation).
#[test]
fn chat_mode_answers_each_turn_and_exits_on_eof() {
    use std::io::Write;
    use std::process::Stdio;
    let qwen2 = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/data/fixtures/qwen2/model-q8_0.gguf"
    );
    for model in [Some(qwen2), None] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_redline"));
        cmd.args(["run", "--temp", "0", "-n", "5", "-t", "2"]);
        if let Some(m) = model {
            cmd.args(["-m", m, "--system", "Be brief."]);
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(b"Once upon a time\nThe end\n")
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        // one prompt marker per turn plus the final one before EOF
        assert_eq!(stderr.matches("> ").count(), 3, "{stderr}");
        // one reply line per turn
        assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 2);
    }
}

/// A prompt longer than `-c` is refused with what to do, before anything reaches stdout.
#[test]
fn a_prompt_over_the_context_is_refused_before_any_output() {
    let prompt = "word ".repeat(50);
    let out = Command::new(env!("CARGO_BIN_EXE_redline"))
        .args(["run", "-p", &prompt, "-c", "16", "-n", "4", "-t", "2"])
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("redline runs");
    assert!(!out.status.success());
    assert!(
        out.stdout.is_empty(),
        "stdout: {:?}",
        String::from_utf8_lossy(&out.stdout)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("does not fit the context (16)") && err.contains("raise -c"),
        "{err}"
    );
}
