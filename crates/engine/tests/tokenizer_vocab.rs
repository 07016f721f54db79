//! Tokenizers from real vocab-only GGUFs against llama.cpp's tokenizer test cases
//! (tests/data/vocab/*.inp → *.out: ids without BOS, add_special = false,
//! parse_special = false), plus the fixture models' own vocabularies.

use engine::{StreamDecoder, Tokenizer};

const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data");

fn load_vocab_metadata(name: &str) -> gguf::Metadata {
    let path = format!("{DATA}/vocab/ggml-vocab-{name}.gguf.zst");
    let compressed = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut decoder = ruzstd::decoding::StreamingDecoder::new(compressed.as_slice()).unwrap();
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut decoder, &mut bytes).unwrap();
    gguf::GgufFile::from_bytes(bytes)
        .unwrap()
        .metadata()
        .clone()
}

fn load_vocab(name: &str) -> Tokenizer {
    Tokenizer::from_gguf(&load_vocab_metadata(name)).unwrap()
}

fn load_model_tokenizer(rel: &str) -> Tokenizer {
    let file = gguf::GgufFile::open(format!("{DATA}/../../{rel}")).unwrap();
    Tokenizer::from_gguf(file.metadata()).unwrap()
}

/// The cases of a `.inp` file (separated by "\n__ggml_vocab_test__\n", as llama.cpp's
/// test-tokenizer-0 reads them) and the ids of the matching `.out` lines.
fn read_cases(name: &str) -> Vec<(String, Vec<u32>)> {
    let inp = std::fs::read_to_string(format!("{DATA}/vocab/ggml-vocab-{name}.gguf.inp")).unwrap();
    let out = std::fs::read_to_string(format!("{DATA}/vocab/ggml-vocab-{name}.gguf.out")).unwrap();
    let texts: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
    // The file ends with a separator, so the last split is empty.
    let texts = &texts[..texts.len() - 1];
    let ids: Vec<Vec<u32>> = out
        .lines()
        .map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect())
        .collect();
    assert_eq!(
        texts.len(),
        ids.len(),
        "{name}: .inp and .out disagree on the case count"
    );
    texts.iter().map(|t| t.to_string()).zip(ids).collect()
}

fn check_vocab(name: &str) {
    let tok = load_vocab(name);
    let cases = read_cases(name);
    let mut failures = Vec::new();
    for (text, want) in &cases {
        let got = tok.encode(text, false, false).unwrap();
        if &got != want {
            failures.push(format!("{text:?}\n   want {want:?}\n    got {got:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{name}: {} of {} cases differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn vocab_gpt2() {
    check_vocab("gpt-2");
}

#[test]
fn vocab_llama_bpe() {
    check_vocab("llama-bpe");
}

#[test]
fn vocab_llama_spm() {
    check_vocab("llama-spm");
}

#[test]
fn vocab_qwen2() {
    check_vocab("qwen2");
}

/// Qwen3.5's vocab is Qwen2's token list with a pre-tokenizer that keeps combining marks
/// (\p{M}) with letters. Where no combining mark is involved it must agree with Qwen2 on
/// every llama.cpp case; where one is, the mark joins the word.
#[test]
fn vocab_qwen35_matches_qwen2_without_marks() {
    let q35 = load_vocab("qwen35");
    let mut compared = 0;
    for (text, want) in read_cases("qwen2") {
        let has_mark = text.chars().any(|c| {
            // Combining Diacritical Marks and the Indic/Thai vowel signs used in the cases.
            matches!(c as u32, 0x0300..=0x036F | 0x0900..=0x097F | 0x0E31 | 0x0E34..=0x0E3A | 0x0E47..=0x0E4E)
        });
        if has_mark {
            continue;
        }
        assert_eq!(q35.encode(&text, false, false).unwrap(), want, "{text:?}");
        compared += 1;
    }
    assert!(compared > 30, "only {compared} cases compared");
}

/// Thai vowel and tone marks are \p{M}: Qwen2 cuts words at them, Qwen3.5 keeps them with
/// their letters. Expected ids come from Hugging Face `tokenizers` (Python) with this vocab,
/// its merges, and each model's tokenizer.json pre-tokenizer regex (`(?i:…)` form).
#[test]
fn vocab_qwen35_keeps_combining_marks_with_letters() {
    let q2 = load_vocab("qwen2");
    let q35 = load_vocab("qwen35");
    let cases: [(&str, &[u32], &[u32]); 3] = [
        (
            "สวัสดีครับ",
            &[143126, 23271, 125136, 28319, 123886, 83546],
            &[35648, 124294, 35648, 124311, 125459],
        ),
        (
            "ภาษาไทย ที่นี่",
            &[127382, 125451, 220, 35884, 47171, 20184, 47171],
            &[127382, 125451, 128477, 126670],
        ),
        ("ผู้ใหญ่", &[84794, 123959, 125526, 18625], &[124258, 125527]),
    ];
    for (text, want2, want35) in cases {
        assert_eq!(
            q2.encode(text, false, false).unwrap(),
            want2,
            "qwen2 {text}"
        );
        assert_eq!(
            q35.encode(text, false, false).unwrap(),
            want35,
            "qwen35 {text}"
        );
        assert_eq!(q35.decode(want35, false), text);
    }
}

#[test]
fn special_tokens_parse_on_and_off() {
    let tok = load_vocab("qwen2");
    let im_start = tok.text_to_id("<|im_start|>").unwrap();
    let im_end = tok.text_to_id("<|im_end|>").unwrap();
    let text = "<|im_start|>user\nhi<|im_end|>";
    let parsed = tok.encode(text, false, true).unwrap();
    assert_eq!(parsed.first(), Some(&im_start));
    assert_eq!(parsed.last(), Some(&im_end));
    let literal = tok.encode(text, false, false).unwrap();
    assert!(!literal.contains(&im_start) && !literal.contains(&im_end));
    // Both spell the same text.
    assert_eq!(tok.decode(&parsed, false), text);
    assert_eq!(tok.decode(&literal, false), text);
    // Skipping specials drops the control tokens.
    assert_eq!(tok.decode(&parsed, true), "user\nhi");
    assert!(tok.is_eog(im_end));
    assert!(tok.is_eog(tok.text_to_id("<|endoftext|>").unwrap()));
    assert!(!tok.is_eog(im_start));
}

#[test]
fn add_bos_follows_metadata() {
    // llama-bpe: pre-tokenizer llama3 adds BOS by default.
    let llama3 = load_vocab("llama-bpe");
    let ids = llama3.encode("Hello", true, false).unwrap();
    assert_eq!(ids[0], 128000);
    assert_eq!(
        &ids[1..],
        &llama3.encode("Hello", false, false).unwrap()[..]
    );
    // Qwen2 metadata has no add_bos_token, and qwen2 does not add one.
    let qwen = load_vocab("qwen2");
    assert_eq!(
        qwen.encode("Hello", true, false).unwrap(),
        qwen.encode("Hello", false, false).unwrap()
    );
    // SPM: add_bos_token = true.
    let spm = load_vocab("llama-spm");
    assert_eq!(spm.encode("Hello", true, false).unwrap()[0], 1);
    assert_eq!(spm.encode("", true, false).unwrap(), vec![1]);
    assert!(spm.encode("", false, false).unwrap().is_empty());
}

#[test]
fn spm_decode_round_trips() {
    let spm = load_vocab("llama-spm");
    for (text, ids) in read_cases("llama-spm") {
        // llama.cpp removes the space SentencePiece prefixed; the round trip is exact.
        assert_eq!(spm.decode(&ids, false), text, "{ids:?}");
    }
}

#[test]
fn qwen2_decode_round_trips() {
    let q = load_vocab("qwen2");
    for (text, ids) in read_cases("qwen2") {
        assert_eq!(q.decode(&ids, false), text, "{ids:?}");
    }
}

#[test]
fn stream_decoder_holds_split_characters() {
    let spm = load_vocab("llama-spm");
    // "€" = E2 82 AC: not a token of this vocab on its own? Force byte tokens explicitly.
    let bytes = "€😀".as_bytes();
    let ids: Vec<u32> = bytes
        .iter()
        .map(|b| spm.text_to_id(&format!("<0x{b:02X}>")).unwrap())
        .collect();
    let mut dec = StreamDecoder::new(&spm);
    let mut out = Vec::new();
    for &id in &ids {
        out.push(dec.push(id));
    }
    assert_eq!(out, vec!["", "", "€", "", "", "", "😀"]);
    assert_eq!(dec.finish(), "");

    // A stream cut inside a character: the tail comes out as U+FFFD at finish.
    let mut dec = StreamDecoder::new(&spm);
    assert_eq!(dec.push(ids[0]), "");
    assert_eq!(dec.pending_len(), 1);
    assert_eq!(dec.finish(), "\u{FFFD}");

    // Byte-level BPE: every piece of an encoded multi-byte text joins back exactly.
    let q = load_vocab("qwen2");
    let text = "Ⓐ 🦙 ปี่ 擁有 – ok";
    let ids = q.encode(text, false, false).unwrap();
    let mut dec = StreamDecoder::new(&q);
    let mut joined = String::new();
    for &id in &ids {
        joined.push_str(&dec.push(id));
    }
    joined.push_str(&dec.finish());
    assert_eq!(joined, text);
}

#[test]
fn stream_decoder_skips_control_tokens_unless_asked() {
    let q = load_vocab("qwen2");
    let im_end = q.text_to_id("<|im_end|>").unwrap();
    let mut dec = StreamDecoder::new(&q);
    assert_eq!(dec.push(im_end), "");
    let mut dec = StreamDecoder::new(&q).with_special(true);
    assert_eq!(dec.push(im_end), "<|im_end|>");
}

/// The four fixture models' own 512-token vocabularies (the tokenizers the model tests use):
/// the prompt gives transformers' `prompt_ids` (no BOS: add_bos_token is false).
#[test]
fn fixture_prompt_ids() {
    for arch in ["llama", "qwen2", "qwen3", "qwen35"] {
        let tok = load_model_tokenizer(&format!("tests/data/fixtures/{arch}/model-f32.gguf"));
        let reference: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(format!("{DATA}/fixtures/{arch}/reference.json")).unwrap(),
        )
        .unwrap();
        let prompt = reference["prompt"].as_str().unwrap();
        let want: Vec<u32> = reference["prompt_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(tok.encode(prompt, true, false).unwrap(), want, "{arch}");
        assert_eq!(tok.decode(&want, false), prompt, "{arch}");
        assert_eq!(tok.n_vocab(), 512, "{arch}");
        assert!(tok.is_eog(511), "{arch}: eos 511 ends generation");
    }
}

#[test]
fn stories260k_with_bos() {
    let tok = load_model_tokenizer("models/stories260K.gguf");
    assert_eq!(
        tok.encode("Once upon a time", true, false).unwrap(),
        vec![1, 403, 407, 261, 378]
    );
    assert_eq!(tok.bos(), Some(1));
    assert_eq!(tok.eos(), Some(2));
    assert!(tok.is_eog(2));
    assert_eq!(
        tok.decode(&[1, 403, 407, 261, 378], true),
        "Once upon a time"
    );
}

/// Random texts from a pool that mixes ASCII, accents, CJK, emoji, combining marks,
/// whitespace runs, control characters and special-token spellings: encoding then decoding
/// gives the text back, for byte-level BPE and for SentencePiece (byte fallback).
#[test]
fn random_texts_round_trip() {
    const POOL: &[&str] = &[
        "a",
        "Z",
        "7",
        " ",
        "  ",
        "\n",
        "\t",
        "\r\n",
        "'s",
        "'LL",
        ".",
        ",",
        "!",
        "?",
        "é",
        "e\u{301}",
        "ß",
        "中",
        "文",
        "😀",
        "🦙",
        "👨‍👩‍👧",
        "ก",
        "ั",
        "क्ष",
        "\u{0}",
        "\u{7f}",
        "\u{2581}",
        "Ġ",
        "<s>",
        "</s>",
        "<|im_end|>",
        "<|endoftext|>",
        "<0x0A>",
        "hello",
        " world",
        "123456",
        "—",
        "\u{fffd}",
    ];
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let qwen = load_vocab("qwen2");
    let spm = load_vocab("llama-spm");
    for case in 0..300 {
        let len = (next() % 24) as usize;
        let text: String = (0..len)
            .map(|_| POOL[(next() % POOL.len() as u64) as usize])
            .collect();
        let parse_special = case % 2 == 0;
        let ids = qwen.encode(&text, false, parse_special).unwrap();
        assert_eq!(qwen.decode(&ids, false), text, "qwen2 {text:?} {ids:?}");
        // SentencePiece puts a space after every parsed special token (llama.cpp does) and
        // spells spaces as "▁", so its exact round trip holds with special tokens left as
        // text and no literal "▁".
        if text.contains('\u{2581}') {
            continue;
        }
        let ids = spm.encode(&text, false, false).unwrap();
        assert_eq!(spm.decode(&ids, false), text, "spm {text:?} {ids:?}");
    }
}

#[test]
fn out_of_range_ids_decode_to_nothing() {
    let q = load_vocab("qwen2");
    assert!(q.token_to_piece(u32::MAX).is_empty());
    assert_eq!(q.decode(&[u32::MAX, 9707], false), "Hello");
    let mut dec = StreamDecoder::new(&q);
    assert_eq!(dec.push(u32::MAX), "");
}

/// llama.cpp's fallback pre-tokenizer ("default": four regex passes) on the GPT-2 vocab.
/// Expected ids from Hugging Face `tokenizers` (Python): a Sequence of the same four
/// regexes as isolated splits, then ByteLevel, over this vocab and its merges.
#[test]
fn default_pre_tokenizer_on_gpt2_vocab() {
    let mut meta = load_vocab_metadata("gpt-2");
    meta.insert("tokenizer.ggml.pre", gguf::Value::String("default".into()));
    let tok = Tokenizer::from_gguf(&meta).unwrap();
    let cases: [(&str, &[u32]); 3] = [
        (
            "Hello, world! It's 12345 <=> $x+y^2 | ~z",
            &[
                15496, 11, 995, 0, 632, 6, 82, 220, 10163, 2231, 220, 27, 14804, 220, 3, 87, 10,
                88, 61, 17, 220, 91, 220, 93, 89,
            ],
        ),
        (
            "price: $1,234.56 (approx.) -- don't!",
            &[
                20888, 25, 220, 3, 16, 11, 24409, 13, 3980, 220, 7, 1324, 13907, 2014, 220, 438,
                836, 6, 83, 0,
            ],
        ),
        (
            "  spaced\tout\n\nlines 2024",
            &[220, 38980, 197, 448, 198, 198, 6615, 220, 19004, 19],
        ),
    ];
    for (text, want) in cases {
        assert_eq!(tok.encode(text, false, false).unwrap(), want, "{text:?}");
    }
}
