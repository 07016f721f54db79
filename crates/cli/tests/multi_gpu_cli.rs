//! End-to-end without a GPU: `redline plan --gpus N` (per-card ledgers of a layer or tensor
//! split) and the several-card flags of `run` failing cleanly where no card can be opened.

use std::process::{Command, Output};

fn redline(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_redline"))
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("redline runs")
}

fn stdout_ok(args: &[&str]) -> String {
    let out = redline(args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn plan_two_v100s_holds_the_32b_that_one_cannot() {
    let base = ["plan", "--shape", "qwen2.5-32b", "--gpu", "v100-16gb"];
    let one = stdout_ok(&base);
    assert!(one.contains("fits: no"), "{one}");
    let two = stdout_ok(&[&base[..], &["--gpus", "2"]].concat());
    assert!(two.contains("split    layer over 2 cards"), "{two}");
    assert!(two.contains("offloaded 33/65 layers to GPU 0"), "{two}");
    assert!(two.contains("offloaded 32/65 layers to GPU 1"), "{two}");
    assert!(two.contains("blk 33–63 + output"), "{two}");
    assert!(two.contains("fits: yes, on every card"), "{two}");
    let ts = stdout_ok(&[&base[..], &["--gpus", "2", "--tensor-split", "3,1"]].concat());
    assert!(ts.contains("offloaded 49/65 layers to GPU 0"), "{ts}");
    let tp = stdout_ok(&[&base[..], &["--gpus", "4", "--split-mode", "tensor"]].concat());
    assert!(tp.contains("all (25 % of each)"), "{tp}");
    assert!(tp.contains("all-reduce buffers"), "{tp}");
    let json = stdout_ok(&[&base[..], &["--gpus", "2", "--json"]].concat());
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["mode"], "layer");
    assert_eq!(v["cards"].as_array().unwrap().len(), 2);
    assert_eq!(v["fits"], true);
}

#[test]
fn bad_split_flags_are_errors() {
    let base = ["plan", "--shape", "qwen2.5-32b", "--gpu", "v100-16gb"];
    for extra in [
        &["--gpus", "2", "--tensor-split", "1,1,1"][..],
        &["--gpus", "2", "--tensor-split", "0,0"],
        &["--gpus", "2", "--split-mode", "sideways"],
        &["--gpus", "2", "-ngl", "10"],
        &["--gpus", "0"],
    ] {
        let out = redline(&[&base[..], extra].concat());
        assert!(!out.status.success(), "{extra:?} should fail");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{extra:?}: {err}");
    }
}

#[test]
fn run_on_logical_cards_without_a_gpu_fails_cleanly() {
    if std::path::Path::new("/dev/nvidia0").exists() {
        return; // a GPU is here: the device package runs the split for real
    }
    let out = redline(&["run", "-p", "Once", "-n", "2", "--devices", "cuda:0,cuda:0"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("opening cuda:0 for the split"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let out = redline(&["run", "-p", "Once", "-n", "2", "--devices", "cuda:0"]);
    assert!(!out.status.success());
}
