//! Perplexity and KL divergence end to end: the bundled stories260K on text it generated,
//! and a quantized fixture against its F32 base.

use std::path::PathBuf;

use convert::{evaluate, make_chunks, quantize_file, KlMode, QuantizeOptions};
use model::synth::FileType;
use model::{LoadOptions, Model};

fn repo(p: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../")).join(p)
}

/// The continuations in stories260K.reference.jsonl, joined: text the model itself produced.
fn story_text() -> String {
    let s = std::fs::read_to_string(repo("tests/data/stories260K.reference.jsonl")).unwrap();
    s.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| {
            Some(format!(
                "{}{}",
                v["prompt"].as_str()?,
                v["content"].as_str()?
            ))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn stories_perplexity_is_low_on_its_own_text() {
    let model = Model::load(&repo("models/stories260K.gguf"), &LoadOptions::default()).unwrap();
    let tok = engine::Tokenizer::from_gguf(model.gguf().metadata()).unwrap();
    let tokens = tok.encode(&story_text(), false, false).unwrap();
    let chunks = make_chunks(&tokens, 64, None, tok.bos());
    assert!(!chunks.is_empty(), "{} tokens", tokens.len());
    let s = evaluate(&model, &chunks, KlMode::None, &mut |_, _, _| {}).unwrap();
    eprintln!(
        "stories260K: ppl {:.3} over {} tokens",
        s.perplexity(),
        s.n_scored
    );
    // Greedy text scores far below a uniform guess over the 512-token vocabulary.
    assert!(
        s.perplexity() > 1.0 && s.perplexity() < 20.0,
        "ppl {}",
        s.perplexity()
    );
}

#[test]
fn kl_divergence_self_is_zero_and_quantized_is_not() {
    let f32_path = repo("tests/data/fixtures/qwen2/model-f32.gguf");
    let tokens: Vec<u32> = (0..96).map(|i| (i * 29 + 3) % 500).collect();
    let chunks = make_chunks(&tokens, 32, None, None);
    let base = Model::load(&f32_path, &LoadOptions::default()).unwrap();
    let mut saved = Vec::new();
    let s0 = evaluate(
        &base,
        &chunks,
        KlMode::SaveBase(&mut saved),
        &mut |_, _, _| {},
    )
    .unwrap();
    assert_eq!(s0.n_scored, 3 * 15);

    let s_self = evaluate(
        &base,
        &chunks,
        KlMode::Compare(&mut saved.as_slice()),
        &mut |_, _, _| {},
    )
    .unwrap();
    assert_eq!(s_self.n_kl, 45);
    // Only the f16 rounding of the saved log-probabilities remains.
    assert!(s_self.mean_kl() < 1e-4, "self KL {}", s_self.mean_kl());
    // The fixture's logits are nearly flat: f16 rounding can swap a near-tie (1 of 45 here).
    assert!(
        s_self.top1_agreement() >= 0.95,
        "{}",
        s_self.top1_agreement()
    );

    let q = std::env::temp_dir().join(format!("redline-kl-{}.gguf", std::process::id()));
    let opts = QuantizeOptions {
        ftype: FileType::Q4KM,
        imatrix: None,
        threads: Some(2),
        pure: false,
    };
    quantize_file(&f32_path, &q, &opts, &mut |_, _| {}).unwrap();
    let qm = Model::load(&q, &LoadOptions::default()).unwrap();
    let sq = evaluate(
        &qm,
        &chunks,
        KlMode::Compare(&mut saved.as_slice()),
        &mut |_, _, _| {},
    )
    .unwrap();
    eprintln!(
        "qwen2 Q4_K_M vs F32: KL {:.5}, top-1 {:.3}, ppl {:.3} vs {:.3}",
        sq.mean_kl(),
        sq.top1_agreement(),
        sq.perplexity(),
        s0.perplexity()
    );
    assert!(sq.mean_kl() > 10.0 * s_self.mean_kl().max(1e-6));
    assert!(sq.mean_kl() < 0.5, "KL {}", sq.mean_kl());

    // A base file from another text is refused.
    let other = make_chunks(&tokens[1..], 32, None, None);
    assert!(evaluate(
        &qm,
        &other,
        KlMode::Compare(&mut saved.as_slice()),
        &mut |_, _, _| {}
    )
    .is_err());
    let _ = std::fs::remove_file(q);
}
