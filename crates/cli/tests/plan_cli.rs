//! `redline plan` end to end: the Qwen3.5-27B shape on a 16 GB V100, JSON output, a real GGUF
//! fixture, and bad input.

use std::process::Command;

fn redline(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_redline"))
        .args(args)
        .output()
        .expect("run redline");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn line_starting<'a>(text: &'a str, prefix: &str) -> &'a str {
    text.lines()
        .find(|l| l.trim_start().starts_with(prefix))
        .unwrap_or_else(|| panic!("no line starting {prefix:?} in:\n{text}"))
}

#[test]
fn qwen35_27b_q4_k_m_on_a_16_gb_v100() {
    let (ok, out, err) = redline(&[
        "plan",
        "--shape",
        "qwen3.5-27b",
        "--type",
        "Q4_K_M",
        "--gpu",
        "v100-16gb",
    ]);
    assert!(ok, "{err}");
    assert!(
        out.contains("NVIDIA V100 16 GB: 15.78 GiB usable, 900 GB/s"),
        "{out}"
    );
    assert!(
        line_starting(&out, "fits:").starts_with("fits: no, needs"),
        "{out}"
    );
    assert!(line_starting(&out, "fits:").contains("short by"));
    let offload = line_starting(&out, "offloaded");
    assert!(
        offload.starts_with("offloaded 63/65 layers to GPU"),
        "{offload}"
    );
    assert!(offload.contains("run on the CPU"));
    assert!(line_starting(&out, "decode ceiling: 57.2 tok/s (900 GB/s").contains("15.73 GB"));
    assert!(line_starting(&out, "expected:").contains("slower than the ceiling"));
    // The suggestions: this file marked, Q4_K_M not fitting, IQ4_XS and Q4_0 fitting.
    assert!(line_starting(&out, "* Q4_K_M").contains("no ("), "{out}");
    for q in ["IQ4_XS", "Q4_0", "Q4_K_S", "Q3_K_M"] {
        assert!(line_starting(&out, q).contains("yes"), "{q}: {out}");
    }
    for q in ["Q8_0", "Q6_K", "Q5_K_M"] {
        assert!(line_starting(&out, q).contains("no ("), "{q}: {out}");
    }
    assert!(line_starting(&out, "largest context with this file").contains("q8_0 KV none"));
}

#[test]
fn iq4_xs_fits_and_json_says_the_same() {
    let args = [
        "plan",
        "--shape",
        "qwen3.5-27b",
        "--type",
        "IQ4_XS",
        "--gpu",
        "V100-16GB",
        "-c",
        "4096",
        "--cache-type-k",
        "q8_0",
        "--cache-type-v",
        "q8_0",
    ];
    let (ok, out, err) = redline(&args);
    assert!(ok, "{err}");
    assert!(
        line_starting(&out, "fits:").starts_with("fits: yes"),
        "{out}"
    );
    assert!(line_starting(&out, "offloaded").starts_with("offloaded 65/65 layers to GPU"));

    let mut json_args = args.to_vec();
    json_args.push("--json");
    let (ok, out, err) = redline(&json_args);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("one JSON object");
    assert_eq!(v["fits"], true);
    assert_eq!(v["layers_on_gpu"], 65);
    assert_eq!(v["layers_total"], 65);
    assert_eq!(v["file_type"], "IQ4_XS");
    assert_eq!(v["cache_type_k"], "q8_0");
    assert_eq!(v["kv_bytes_per_token"], 34816);
    assert_eq!(v["state_bytes_per_seq"], 48 * 3_268_608);
    assert_eq!(v["gpu"]["usable_bytes"], 16160u64 << 20);
    let ceiling = v["ceiling_tok_s"].as_f64().unwrap();
    let bytes = v["bytes_per_token"].as_f64().unwrap();
    assert!((ceiling - 900e9 / bytes).abs() < 1e-6);
    assert_eq!(v["suggestions"]["quants"].as_array().unwrap().len(), 9);
    assert_eq!(v["layers"].as_array().unwrap().len(), 64);
}

#[test]
fn plans_a_gguf_file_with_or_without_a_gpu() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/data/fixtures/qwen35/model-q8_0.gguf"
    );
    let (ok, out, err) = redline(&["plan", path]);
    assert!(ok, "{err}");
    assert!(out.contains("CPU only"), "{out}");
    assert!(
        out.contains("4 layers (2 attention, 2 recurrent DeltaNet)"),
        "{out}"
    );
    assert!(line_starting(&out, "decode ceiling:").contains("on the CPU"));

    let (ok, out, err) = redline(&["plan", "-m", path, "--vram", "2GiB", "--bandwidth", "300"]);
    assert!(ok, "{err}");
    assert!(out.contains("custom: 2.00 GiB usable, 300 GB/s"), "{out}");
    assert!(line_starting(&out, "fits:").starts_with("fits: yes"));
    assert!(line_starting(&out, "offloaded").starts_with("offloaded 5/5 layers to GPU"));
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    for args in [
        vec!["plan", "--shape", "qwen9"],
        vec!["plan", "--shape", "qwen3.5-27b", "--type", "Q9_K"],
        vec!["plan", "--shape", "qwen3.5-27b", "--gpu", "v101"],
        vec![
            "plan",
            "--shape",
            "qwen3.5-27b",
            "--gpu",
            "t4",
            "--cache-type-k",
            "q5_9",
        ],
        vec!["plan", "--shape", "qwen3.5-27b", "--vram", "lots"],
        vec!["plan", "/nonexistent/model.gguf"],
        vec!["plan"],
    ] {
        let (ok, _, err) = redline(&args);
        assert!(!ok, "{args:?} succeeded");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

/// `plan MODEL --md DRAFT`: stories260K drafting for itself. The draft lines equal the model's
/// own weights and KV cache, the buffers are the verify logits (6 × 512 f32), and a card that
/// holds the model alone with 1000 bytes to spare is short by the draft's bytes less those.
#[test]
fn plan_with_a_draft_model_counts_it_and_can_stop_fitting() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/stories260K.gguf");
    let json = |extra: &[&str]| -> serde_json::Value {
        let mut args = vec!["plan", path, "-c", "256", "--json"];
        args.extend_from_slice(extra);
        let (ok, out, err) = redline(&args);
        assert!(ok, "{err}");
        serde_json::from_str(&out).unwrap()
    };
    let u = |v: &serde_json::Value| v.as_u64().unwrap();
    let alone = json(&["--vram", "1GiB"]);
    let l = &alone["ledger"];
    let weights = u(&l["layer_weights"]) + u(&l["output_head"]) + u(&l["token_embedding"]);
    let spec = json(&["--vram", "1GiB", "--md", path, "--draft-max", "5"]);
    let s = &spec["ledger"];
    assert_eq!(u(&s["draft_weights"]), weights);
    assert_eq!(u(&s["draft_cache"]), u(&l["kv_cache"]));
    assert_eq!(u(&s["speculation_buffers"]), 4 * 6 * 512);
    let extra = weights + u(&l["kv_cache"]) + 4 * 6 * 512;
    assert_eq!(
        u(&spec["gpu_bytes_full"]),
        u(&alone["gpu_bytes_full"]) + extra
    );

    let vram = format!("{}b", u(&alone["gpu_bytes_full"]) + 1000);
    let (ok, out, err) = redline(&["plan", path, "-c", "256", "--vram", &vram]);
    assert!(ok, "{err}");
    assert!(
        line_starting(&out, "fits:").starts_with("fits: yes"),
        "{out}"
    );
    let tight = json(&["--vram", &vram, "--md", path, "--draft-max", "5"]);
    assert_eq!(tight["fits"], false);
    assert_eq!(u(&tight["short_by_bytes"]), extra - 1000);
    let (ok, out, err) = redline(&["plan", path, "-c", "256", "--vram", &vram, "--md", path]);
    assert!(ok, "{err}");
    assert!(
        line_starting(&out, "fits:").starts_with("fits: no"),
        "{out}"
    );
    for row in [
        "draft model weights",
        "draft KV cache (256 tokens)",
        "speculation buffers",
    ] {
        line_starting(&out, row);
    }
}
