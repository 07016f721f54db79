//! models/stories260K.gguf (a trained tiny Llama) reproduces llama.cpp's greedy continuation
//! token for token (tests/data/stories260K.reference.jsonl).

use std::path::PathBuf;

use model::{KvType, LoadOptions, Model};

fn data(rel: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).join(rel)
}

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// "Once upon a time" with BOS (README of the reference data).
const PROMPT: [u32; 5] = [1, 403, 407, 261, 378];

fn expected_tokens() -> Vec<u32> {
    let text = std::fs::read_to_string(data("tests/data/stories260K.reference.jsonl")).unwrap();
    let line = text.lines().next().unwrap();
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    assert_eq!(v["prompt_n"].as_u64(), Some(PROMPT.len() as u64));
    v["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn greedy(kv: KvType, ubatch_size: usize) -> Vec<u32> {
    let m = Model::load(
        &data("models/stories260K.gguf"),
        &LoadOptions {
            n_threads: 2,
            ubatch_size,
        },
    )
    .unwrap();
    let want = expected_tokens();
    let mut s = m.new_state(128, kv).unwrap();
    let mut logits = m.forward(&mut s, &PROMPT, false).unwrap();
    let mut got = Vec::new();
    while got.len() < want.len() {
        let t = argmax(&logits);
        got.push(t);
        logits = m.forward(&mut s, &[t], false).unwrap();
    }
    got
}

#[test]
fn greedy_continuation_matches_llama_cpp() {
    assert_eq!(greedy(KvType::F16, 512), expected_tokens());
}

#[test]
fn greedy_continuation_with_f32_cache_and_tiny_ubatches() {
    assert_eq!(greedy(KvType::F32, 2), expected_tokens());
}
