//! Constrained decoding under random logits: every rollout over a real vocabulary must find
//! an allowed token at every step, end as text that parses as JSON and validates against the
//! schema (checked by an independent checker), and never accept a forbidden token.

#[path = "constrained/json_syntax.rs"]
mod json_syntax;
#[path = "constrained/schema_check.rs"]
mod schema_check;

use engine::{ConstraintError, ConstraintVocab, Tokenizer};
use serde_json::{json, Value};

const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data");

fn model_tokenizer(rel: &str) -> Tokenizer {
    let file = gguf::GgufFile::open(format!("{DATA}/../../{rel}")).unwrap();
    Tokenizer::from_gguf(file.metadata()).unwrap()
}

fn vocab_tokenizer(name: &str) -> Tokenizer {
    let path = format!("{DATA}/vocab/ggml-vocab-{name}.gguf.zst");
    let compressed = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut decoder = ruzstd::decoding::StreamingDecoder::new(compressed.as_slice()).unwrap();
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut decoder, &mut bytes).unwrap();
    let file = gguf::GgufFile::from_bytes(bytes).unwrap();
    Tokenizer::from_gguf(file.metadata()).unwrap()
}

/// xorshift64*: a seeded, dependency-free stream of random numbers.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
}

fn schemas() -> Vec<(&'static str, Value)> {
    vec![
        ("json_object", json!({"type": "object"})),
        (
            "record",
            json!({
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 12},
                    "age": {"type": "integer", "minimum": 0, "maximum": 150},
                    "tags": {"type": "array", "items": {"enum": ["a", "b\"q", "ü"]}, "maxItems": 3},
                    "ok": {"type": "boolean"},
                    "kind": {"const": "x"},
                    "score": {"type": "number"},
                    "nested": {
                        "type": "object",
                        "properties": {"z": {"type": "null"}, "w": {"type": ["string", "integer"], "maxLength": 5}},
                        "required": ["z"],
                        "additionalProperties": false
                    }
                },
                "required": ["name", "age", "nested"],
                "additionalProperties": false
            }),
        ),
        (
            "int_array",
            json!({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 4}),
        ),
        (
            "any_of",
            json!({"anyOf": [
                {"type": "integer", "minimum": -5, "maximum": 5},
                {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"], "additionalProperties": false}
            ]}),
        ),
    ]
}

/// Outcome of one rollout: Some(text) if the document completed within `cap` tokens.
fn rollout(
    vocab: &ConstraintVocab,
    tok: &Tokenizer,
    schema: &Value,
    rng: &mut Rng,
    cap: usize,
) -> Option<String> {
    let mut c = vocab.json_schema(schema).unwrap();
    let n = tok.n_vocab();
    // Tokens that help close a document, favoured on some steps so most rollouts finish.
    let closers: Vec<bool> = (0..n as u32)
        .map(|id| tok.piece(id, false).iter().any(|b| b"\"]},".contains(b)))
        .collect();
    let mut out = Vec::new();
    let mut logits = vec![0f32; n];
    for _ in 0..cap {
        let scale = 1.0 + 4.0 * rng.unit();
        let favour_closers = rng.unit() < 0.5;
        for (id, l) in logits.iter_mut().enumerate() {
            *l = scale * (rng.unit() - 0.5);
            if favour_closers && closers[id] {
                *l += 3.0;
            }
        }
        c.mask_logits(&mut logits);
        let allowed: Vec<usize> = (0..n).filter(|&i| logits[i].is_finite()).collect();
        assert!(
            !allowed.is_empty(),
            "dead end after {:?}",
            String::from_utf8_lossy(&out)
        );
        if c.is_stopped() {
            assert!(
                allowed.iter().all(|&i| tok.is_eog(i as u32)),
                "only an end may follow"
            );
        }
        // Sample from softmax over the allowed tokens.
        let max = allowed.iter().map(|&i| logits[i]).fold(f32::MIN, f32::max);
        let weights: Vec<f32> = allowed.iter().map(|&i| (logits[i] - max).exp()).collect();
        let mut r = rng.unit() * weights.iter().sum::<f32>();
        let mut pick = allowed[allowed.len() - 1];
        for (&i, &w) in allowed.iter().zip(&weights) {
            if r < w {
                pick = i;
                break;
            }
            r -= w;
        }
        // At the start, a random forbidden token must be refused by a fresh constraint.
        let forbidden = (rng.next() % n as u64) as usize;
        if out.is_empty() && !logits[forbidden].is_finite() {
            let mut probe = vocab.json_schema(schema).unwrap();
            let refused = probe.accept(forbidden as u32);
            assert!(matches!(refused, Err(ConstraintError::Rejected { .. })));
        }
        if tok.is_eog(pick as u32) {
            assert!(
                c.is_complete(),
                "end allowed before the document is complete"
            );
            c.accept(pick as u32).unwrap();
            return Some(String::from_utf8(out).expect("constrained output is UTF-8"));
        }
        c.accept(pick as u32).unwrap();
        out.extend(tok.piece(pick as u32, false));
    }
    None
}

fn run_rollouts(tok: &Tokenizer, n_rollouts: usize, seed: u64) {
    let vocab = ConstraintVocab::new(tok).unwrap();
    for (name, schema) in schemas() {
        let mut rng = Rng(seed ^ (name.len() as u64 * 0x9e37_79b9));
        let mut completed = 0;
        for _ in 0..n_rollouts {
            let Some(text) = rollout(&vocab, tok, &schema, &mut rng, 400) else {
                continue;
            };
            completed += 1;
            let v: Value = json_syntax::parse(&text)
                .unwrap_or_else(|e| panic!("{name}: output {text:?} is not JSON: {e}"));
            schema_check::check(&schema, &v, "$")
                .unwrap_or_else(|e| panic!("{name}: output {text:?} violates the schema: {e}"));
        }
        eprintln!("{name}: {completed}/{n_rollouts} rollouts completed within the cap");
        assert!(
            completed * 2 >= n_rollouts,
            "{name}: only {completed}/{n_rollouts} completed"
        );
    }
}

#[test]
fn qwen2_byte_level_vocab_rollouts_are_schema_valid() {
    run_rollouts(
        &model_tokenizer("tests/data/fixtures/qwen2/model-f32.gguf"),
        300,
        1,
    );
}

#[test]
fn stories_spm_vocab_rollouts_are_schema_valid() {
    run_rollouts(&model_tokenizer("models/stories260K.gguf"), 300, 2);
}

#[test]
fn full_qwen2_vocab_rollouts_are_schema_valid() {
    let tok = vocab_tokenizer("qwen2");
    let t0 = std::time::Instant::now();
    let vocab = ConstraintVocab::new(&tok).unwrap();
    eprintln!("trie of {} tokens: {:?}", tok.n_vocab(), t0.elapsed());
    // Per-step cost on a 150k vocabulary: one mask + one accept.
    let mut c = vocab.json_object().unwrap();
    let mut logits = vec![0f32; tok.n_vocab()];
    let text = "{\"key\": [1, 2.5, \"val\"], \"b\": {\"c\": null}}";
    let ids = tok.encode(text, false, false).unwrap();
    let t0 = std::time::Instant::now();
    for &id in &ids {
        logits.fill(0.0);
        c.mask_logits(&mut logits);
        assert!(
            logits[id as usize].is_finite(),
            "{:?} forbidden",
            tok.piece(id, false)
        );
        c.accept(id).unwrap();
    }
    assert!(c.is_complete());
    eprintln!(
        "mask+accept per step: {:?}",
        t0.elapsed() / ids.len() as u32
    );
    // A finished top-level object allows only end-of-generation tokens.
    logits.fill(0.0);
    c.mask_logits(&mut logits);
    let allowed: Vec<u32> = (0..tok.n_vocab() as u32)
        .filter(|&i| logits[i as usize].is_finite())
        .collect();
    assert!(
        !allowed.is_empty() && allowed.iter().all(|&i| tok.is_eog(i)),
        "{allowed:?}"
    );
    eprintln!("stopped after the object: {}", c.is_stopped());
    run_rollouts(&tok, 3, 3);
}

#[test]
fn first_token_opens_an_object_and_others_are_rejected() {
    let tok = model_tokenizer("models/stories260K.gguf");
    let vocab = ConstraintVocab::new(&tok).unwrap();
    let mut c = vocab.json_object().unwrap();
    let mut logits = vec![0f32; tok.n_vocab() + 3];
    c.mask_logits(&mut logits);
    assert!(logits[tok.n_vocab()..]
        .iter()
        .all(|l| *l == f32::NEG_INFINITY));
    let allowed: Vec<u32> = (0..tok.n_vocab() as u32)
        .filter(|&i| logits[i as usize].is_finite())
        .collect();
    assert!(!allowed.is_empty());
    for &id in &allowed {
        assert!(
            tok.piece(id, false).starts_with(b"{"),
            "{:?}",
            tok.piece(id, false)
        );
    }
    assert!(!c.is_complete());
    let not_allowed = (0..tok.n_vocab() as u32)
        .find(|i| !allowed.contains(i))
        .unwrap();
    assert!(c.accept(not_allowed).is_err());
    assert!(c.accept(tok.n_vocab() as u32 + 7).is_err());
    if let Some(eos) = tok.eos() {
        assert!(
            vocab.json_object().unwrap().accept(eos).is_err(),
            "EOS before any JSON"
        );
    }
}

#[test]
fn unsupported_schemas_are_clear_errors() {
    let tok = model_tokenizer("models/stories260K.gguf");
    let vocab = ConstraintVocab::new(&tok).unwrap();
    assert!(matches!(
        vocab.json_schema(&json!(17)),
        Err(ConstraintError::UnsupportedSchema(_))
    ));
    assert!(matches!(
        vocab.json_schema(&json!({"type": "no-such-type"})),
        Err(ConstraintError::UnsupportedSchema(_))
    ));
    assert!(matches!(
        vocab.json_schema(&json!({"$ref": "#/definitions/missing"})),
        Err(ConstraintError::UnsupportedSchema(_))
    ));
}

#[test]
fn llama_bpe_and_spm_vocab_rollouts_are_schema_valid() {
    // 128k byte-level BPE (Llama 3) and 32k SentencePiece with byte-fallback tokens.
    run_rollouts(&vocab_tokenizer("llama-bpe"), 3, 4);
    run_rollouts(&vocab_tokenizer("llama-spm"), 20, 5);
}
