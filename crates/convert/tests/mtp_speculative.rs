//! The Qwen3.5 MTP fixture: the HF fixture checkpoint (shared/fixtures-hf/qwen35) plus one
//! MTP layer of seeded random weights (`mtp_num_hidden_layers: 1`), converted with
//! `convert_hf`. Checks that the main forward ignores the MTP block, that the MTP drafter's
//! lazily kept cache equals an offline MTP pass, and that greedy output with MTP speculation
//! equals plain greedy output.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use engine::sampler::{Sampler, SamplerConfig};
use engine::speculative::{MtpSpec, SpecModel, SpecOptions, SpeculativeDecoder};
use model::{KvType, LoadOptions, Model};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[path = "support/safetensors.rs"]
mod safetensors;
use safetensors::write_safetensors;

const HF: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/fixtures-hf");
const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data/fixtures");

/// The converted MTP fixture (built once per test process).
fn mtp_fixture() -> Option<PathBuf> {
    static PATH: OnceLock<Option<PathBuf>> = OnceLock::new();
    PATH.get_or_init(build_mtp_fixture).clone()
}

/// Builds the MTP checkpoint next to a copy of the fixture and converts it to an F32 GGUF.
/// `None` when shared/fixtures-hf is not beside the checkout.
fn build_mtp_fixture() -> Option<PathBuf> {
    let src = Path::new(HF).join("qwen35");
    if !src.exists() {
        eprintln!("skipping: {} is absent", src.display());
        return None;
    }
    // Under cargo's per-target scratch folder (reused run after run), not the system temp dir,
    // where one 27 MB folder per test process piled up.
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("mtp-speculative-fixture");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    cfg["mtp_num_hidden_layers"] = 1.into();
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    std::fs::copy(
        src.join("model.safetensors"),
        dir.join("model-00001-of-00002.safetensors"),
    )
    .unwrap();
    // Shapes of the fixture (hidden 256, 4 heads of 64 with a query gate, 2 KV heads, MLP
    // 512); HF RMSNorm weights are stored as w - 1 (the converter adds 1).
    let mut rng = StdRng::seed_from_u64(0x3_7a0);
    let mut rand = |n: usize, scale: f32| -> Vec<f32> {
        (0..n).map(|_| rng.random_range(-scale..scale)).collect()
    };
    let mut mtp: Vec<(String, Vec<usize>, Vec<f32>)> = vec![
        (
            "mtp.fc.weight".into(),
            vec![256, 512],
            rand(256 * 512, 0.08),
        ),
        (
            "mtp.pre_fc_norm_embedding.weight".into(),
            vec![256],
            rand(256, 0.1),
        ),
        (
            "mtp.pre_fc_norm_hidden.weight".into(),
            vec![256],
            rand(256, 0.1),
        ),
        ("mtp.norm.weight".into(), vec![256], rand(256, 0.1)),
    ];
    for (n, s, scale) in [
        ("input_layernorm.weight", vec![256], 0.1),
        ("post_attention_layernorm.weight", vec![256], 0.1),
        ("self_attn.q_proj.weight", vec![512, 256], 0.08),
        ("self_attn.k_proj.weight", vec![128, 256], 0.08),
        ("self_attn.v_proj.weight", vec![128, 256], 0.08),
        ("self_attn.o_proj.weight", vec![256, 256], 0.08),
        ("self_attn.q_norm.weight", vec![64], 0.1),
        ("self_attn.k_norm.weight", vec![64], 0.1),
        ("mlp.gate_proj.weight", vec![512, 256], 0.08),
        ("mlp.up_proj.weight", vec![512, 256], 0.08),
        ("mlp.down_proj.weight", vec![256, 512], 0.06),
    ] {
        let len = s.iter().product();
        mtp.push((format!("mtp.layers.0.{n}"), s, rand(len, scale)));
    }
    write_safetensors(&dir.join("model-00002-of-00002.safetensors"), &mtp);
    let mut map = serde_json::Map::new();
    map.insert(
        "model.norm.weight".into(),
        "model-00001-of-00002.safetensors".into(),
    );
    for (n, _, _) in &mtp {
        map.insert(n.clone(), "model-00002-of-00002.safetensors".into());
    }
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        serde_json::json!({"metadata": {}, "weight_map": map}).to_string(),
    )
    .unwrap();
    let out = dir.join("qwen35-mtp-f32.gguf");
    convert::convert_hf(&dir, &out, convert::OutType::F32, &mut |_, _| {}).unwrap();
    Some(out)
}

fn load(path: &Path) -> Model {
    Model::load(path, &LoadOptions::default()).unwrap()
}

const PROMPT: [u32; 6] = [1, 42, 7, 300, 9, 11];

#[test]
fn mtp_fixture_main_forward_ignores_the_mtp_block() {
    let Some(path) = mtp_fixture() else { return };
    let with = load(&path);
    assert_eq!(with.config().n_layer, 4);
    assert_eq!(with.config().n_mtp_layer, 1);
    assert!(!with.has_mtp(), "not loaded unless asked");
    let without = load(&Path::new(FIXTURES).join("qwen35/model-f32.gguf"));
    let run = |m: &Model| {
        let mut s = m.new_state(32, KvType::F32).unwrap();
        m.forward(&mut s, &PROMPT, true).unwrap()
    };
    assert_eq!(run(&with), run(&without));
}

/// The MTP cache kept through draft steps, a partial (or full) accept and re-queued entries
/// equals one offline MTP pass over the final sequence with the target's hidden states.
#[test]
fn mtp_drafter_cache_equals_an_offline_pass() {
    let Some(path) = mtp_fixture() else { return };
    let m = load(&path);
    assert!(m.load_mtp().unwrap());
    let (t, x, y, z) = (5u32, 17u32, 23u32, 99u32);
    for keep in 1..=3 {
        let mut spec =
            MtpSpec::new(&m, m.new_state(64, KvType::F32).unwrap(), KvType::F32).unwrap();
        spec.prefill(&PROMPT).unwrap();
        spec.draft_step(t).unwrap(); // exact entry (t, h(prompt.last))
        spec.draft_step(x).unwrap(); // chained entry, to be discarded
        spec.verify(&[t, x, y]).unwrap();
        spec.accept(keep).unwrap();
        let online = spec.draft_step(z).unwrap();

        let mut seq = PROMPT.to_vec();
        seq.extend(&[t, x, y][..keep]);
        seq.push(z);
        let mut s = m.new_state(64, KvType::F32).unwrap();
        let (_, hidden) = m
            .forward_hidden(&mut s, &seq[..seq.len() - 1], false)
            .unwrap();
        let mut mtp = m.new_mtp_state(64, KvType::F32).unwrap();
        let offline = m.mtp_forward(&mut mtp, &seq[1..], &hidden, false).unwrap();
        let err = online
            .iter()
            .zip(&offline.logits)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(err < 1e-4, "keep {keep}: max |Δlogit| {err}");
        assert_eq!(mtp.len(), seq.len() - 1);
    }
}

#[test]
fn mtp_speculation_greedy_equals_plain_greedy() {
    let Some(path) = mtp_fixture() else { return };
    let m = load(&path);
    assert!(m.load_mtp().unwrap());
    let n = 40;
    let mut state = m.new_state(128, KvType::F32).unwrap();
    let mut sampler = Sampler::new(SamplerConfig::greedy());
    let mut logits = m.forward(&mut state, &PROMPT, false).unwrap();
    let mut want = Vec::new();
    for _ in 0..n {
        let t = sampler.sample(&logits);
        want.push(t);
        logits = m.forward(&mut state, &[t], false).unwrap();
    }
    for draft_max in [1, 3] {
        let mut spec =
            MtpSpec::new(&m, m.new_state(128, KvType::F32).unwrap(), KvType::F32).unwrap();
        let mut sampler = Sampler::new(SamplerConfig::greedy());
        let opts = SpecOptions {
            draft_max,
            draft_min: 0,
            p_min: 0.0,
        };
        let mut dec = SpeculativeDecoder::new(&mut spec, &mut sampler, opts);
        dec.prefill(&PROMPT).unwrap();
        let mut got = Vec::new();
        while got.len() < n {
            got.extend(dec.next_tokens(n - got.len()).unwrap());
        }
        let stats = dec.stats();
        eprintln!("MTP k={draft_max}: {stats:?}");
        assert_eq!(got, want, "draft_max {draft_max}");
        assert!(stats.drafted > 0 && stats.rollbacks > 0);
    }
}
