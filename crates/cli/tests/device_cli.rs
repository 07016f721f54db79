//! End-to-end on the CPU (no GPU needed): the device/placement flags of `run` and `bench`, the
//! ledger and "offloaded X/Y" lines, and `bench -o json` with depth.

use std::process::{Command, Output};

fn redline(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_redline"))
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("redline runs")
}

#[test]
fn run_on_the_cpu_logs_the_ledger_and_the_offload_line() {
    let out = redline(&[
        "run", "-p", "Once", "-n", "4", "--temp", "0", "-t", "2", "--device", "cpu", "-ngl", "3",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("memory ledger"), "{err}");
    // stories260K: 5 layers + the output head.
    assert!(err.contains("offloaded 0/6 layers to GPU"), "{err}");
    assert!(
        err.contains("-ngl / --vram-limit do nothing on the CPU"),
        "{err}"
    );
    // The ledger goes to stderr; stdout is the text only.
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with("Once") && !text.contains("ledger"),
        "{text}"
    );
}

#[test]
fn an_unusable_gpu_named_explicitly_is_an_error_not_a_fallback() {
    // cuda:99 fails both with no driver and on a machine with fewer GPUs.
    let out = redline(&["run", "-p", "Once", "-n", "2", "--device", "cuda:99"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--device cuda:99"), "{err}");
}

#[test]
fn bad_flag_values_are_refused_with_the_accepted_forms() {
    let out = redline(&["bench", "--vram-limit", "lots"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("16GiB"));
    let out = redline(&["bench", "--fit", "maybe"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("gpu-only"));
}

#[test]
fn bench_json_on_the_cpu_with_depth() {
    let out = redline(&[
        "bench", "--device", "cpu", "-t", "2", "-p", "8", "-n", "4", "-d", "16", "-r", "2", "-o",
        "json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(v["backend"], "cpu");
    assert_eq!(v["n_gpu_layers"], 0);
    assert_eq!(v["n_layers"], 6);
    // The host's read bandwidth, measured with the bench's 2 threads: the CPU roofline.
    let bw = v["read_bandwidth_gbs"]
        .as_f64()
        .expect("a measured bandwidth");
    assert!(bw.is_finite() && bw > 0.0, "{bw}");
    let tests = v["tests"].as_array().unwrap();
    let names: Vec<&str> = tests.iter().map(|t| t["test"].as_str().unwrap()).collect();
    assert_eq!(names, ["pp8 @ d16", "tg4 @ d16"]);
    for t in tests {
        assert_eq!(t["n_depth"], 16);
        assert_eq!(t["samples"].as_array().unwrap().len(), 2);
        assert!(t["tokens_per_second_mean"].as_f64().unwrap() > 0.0);
        // Decode tests get bytes per token and a roofline share, prefill tests neither.
        let decode = t["test"].as_str().unwrap().starts_with("tg");
        assert_eq!(t["roofline_percent"].is_null(), !decode, "{t}");
        if decode {
            assert!(t["bytes_per_token"].as_f64().unwrap() > 0.0, "{t}");
            assert!(t["roofline_percent"].as_f64().unwrap() > 0.0, "{t}");
        }
    }
}

#[test]
fn bench_parallel_decodes_several_sequences_per_step() {
    let out = redline(&[
        "bench",
        "--device",
        "cpu",
        "-t",
        "2",
        "-p",
        "8",
        "-n",
        "4",
        "-d",
        "4",
        "-r",
        "1",
        "--parallel",
        "3",
        "-o",
        "json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    let tests = v["tests"].as_array().unwrap();
    let names: Vec<&str> = tests.iter().map(|t| t["test"].as_str().unwrap()).collect();
    // Prefill runs on one sequence; decode steps carry all three.
    assert_eq!(names, ["pp8 @ d4", "tg4 @ d4 ×3"]);
    assert_eq!(tests[0]["n_tokens"], 8);
    assert_eq!(tests[1]["n_tokens"], 12);
    assert_eq!(tests[1]["n_parallel"], 3);
    let out = redline(&["bench", "--device", "cpu", "--parallel", "0"]);
    assert!(!out.status.success());
}
