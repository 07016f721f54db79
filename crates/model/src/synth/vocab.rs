//! A synthetic byte-level BPE vocabulary of a real model's size.
//!
//! A synthetic model must load like the real one, so its GGUF carries a full-size
//! `tokenizer.ggml.*` vocabulary: the 256 byte tokens (GPT-2's byte-to-unicode mapping, as
//! every byte-level BPE has), then tokens made of two and then three byte characters, each with
//! the merge that builds it, and the model's special tokens at their real ids. Encoding and
//! decoding work; the text a random-weight model generates is meaningless.

use gguf::{Array, Value};

use super::shape::Arch;

/// GPT-2's byte → printable char map (`bytes_to_unicode` in openai/gpt-2 encoder.py): bytes
/// that are printable Latin-1 map to themselves, the others to U+0100 and up, in byte order.
pub fn byte_chars() -> [char; 256] {
    let mut out = ['\0'; 256];
    let mut next = 256u32;
    for (b, slot) in out.iter_mut().enumerate() {
        let printable =
            (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
        let cp = if printable {
            b as u32
        } else {
            let c = next;
            next += 1;
            c
        };
        *slot = char::from_u32(cp).expect("bytes_to_unicode yields valid chars");
    }
    out
}

/// Special tokens (id, text) of an architecture's real tokenizer, and BOS / EOS / EOT ids.
pub struct Specials {
    pub tokens: Vec<(usize, &'static str)>,
    pub bos: usize,
    pub eos: usize,
    pub eot: Option<usize>,
    pub add_bos: bool,
    pub pre: &'static str,
    pub chat_template: &'static str,
}

const CHATML: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + \
message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}\
{{ '<|im_start|>assistant\\n' }}{% endif %}";

const LLAMA3: &str = "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + \
message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}\
{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\
{% endif %}";

/// The special tokens at the ids the real models use (clamped into small test vocabularies).
pub fn specials(arch: Arch, n_vocab: usize) -> Specials {
    let fit = |id: usize, k: usize| if id < n_vocab { id } else { n_vocab - 8 + k };
    match arch {
        Arch::Llama => Specials {
            tokens: vec![
                (fit(128000, 0), "<|begin_of_text|>"),
                (fit(128001, 1), "<|end_of_text|>"),
                (fit(128006, 2), "<|start_header_id|>"),
                (fit(128007, 3), "<|end_header_id|>"),
                (fit(128009, 4), "<|eot_id|>"),
            ],
            bos: fit(128000, 0),
            eos: fit(128001, 1),
            eot: Some(fit(128009, 4)),
            add_bos: true,
            pre: "llama-bpe",
            chat_template: LLAMA3,
        },
        Arch::Qwen2 | Arch::Qwen35 => {
            let base = if arch == Arch::Qwen35 { 248044 } else { 151643 };
            Specials {
                tokens: vec![
                    (fit(base, 0), "<|endoftext|>"),
                    (fit(base + 1, 1), "<|im_start|>"),
                    (fit(base + 2, 2), "<|im_end|>"),
                ],
                bos: fit(base, 0),
                eos: fit(base + 2, 2),
                eot: Some(fit(base + 2, 2)),
                add_bos: false,
                pre: if arch == Arch::Qwen35 {
                    "qwen35"
                } else {
                    "qwen2"
                },
                chat_template: CHATML,
            }
        }
    }
}

/// The `tokenizer.*` metadata entries for a vocabulary of `n_vocab` tokens (n_vocab >= 264).
pub fn tokenizer_metadata(arch: Arch, n_vocab: usize) -> Vec<(&'static str, Value)> {
    assert!(
        n_vocab >= 264,
        "synthetic vocab needs room for 256 bytes and specials"
    );
    let sp = specials(arch, n_vocab);
    let bytes = byte_chars();

    let mut tokens: Vec<String> = vec![String::new(); n_vocab];
    let mut types: Vec<i32> = vec![1; n_vocab]; // 1 = normal
    let mut is_special = vec![false; n_vocab];
    for &(id, text) in &sp.tokens {
        tokens[id] = text.to_owned();
        types[id] = 3; // control
        is_special[id] = true;
    }

    // Normal tokens in id order, skipping the special ids: bytes, then pairs, then triples.
    let mut merges: Vec<String> = Vec::new();
    let mut free_ids = (0..n_vocab).filter(|&i| !is_special[i]);
    let mut generated = 0usize;
    let n_normal = n_vocab - sp.tokens.len();
    'fill: {
        for &c in &bytes {
            let Some(id) = free_ids.next() else {
                break 'fill;
            };
            tokens[id] = c.to_string();
            generated += 1;
        }
        for &a in &bytes {
            for &b in &bytes {
                if generated == n_normal {
                    break 'fill;
                }
                let id = free_ids.next().expect("counted");
                tokens[id] = format!("{a}{b}");
                merges.push(format!("{a} {b}"));
                generated += 1;
            }
        }
        for &a in &bytes {
            for &b in &bytes {
                for &c in &bytes {
                    if generated == n_normal {
                        break 'fill;
                    }
                    let id = free_ids.next().expect("counted");
                    tokens[id] = format!("{a}{b}{c}");
                    merges.push(format!("{a} {b}{c}"));
                    generated += 1;
                }
            }
        }
    }

    let mut meta = vec![
        ("tokenizer.ggml.model", Value::String("gpt2".into())),
        ("tokenizer.ggml.pre", Value::String(sp.pre.into())),
        ("tokenizer.ggml.tokens", Value::Array(Array::String(tokens))),
        ("tokenizer.ggml.token_type", Value::Array(Array::I32(types))),
        ("tokenizer.ggml.merges", Value::Array(Array::String(merges))),
        ("tokenizer.ggml.bos_token_id", Value::U32(sp.bos as u32)),
        ("tokenizer.ggml.eos_token_id", Value::U32(sp.eos as u32)),
    ];
    if let Some(eot) = sp.eot {
        meta.push(("tokenizer.ggml.eot_token_id", Value::U32(eot as u32)));
    }
    meta.push(("tokenizer.ggml.add_bos_token", Value::Bool(sp.add_bos)));
    meta.push((
        "tokenizer.chat_template",
        Value::String(sp.chat_template.into()),
    ));
    meta
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn byte_chars_are_gpt2s() {
        let b = byte_chars();
        assert_eq!(b[b'A' as usize], 'A');
        assert_eq!(b[b' ' as usize], 'Ġ'); // U+0120
        assert_eq!(b[b'\n' as usize], 'Ċ'); // U+010A
        assert_eq!(b[173], 'Ń'); // U+0143, the last remapped byte
        assert_eq!(b.iter().collect::<HashSet<_>>().len(), 256);
    }

    fn vocab(meta: &[(&str, Value)]) -> (Vec<String>, Vec<String>, Vec<i32>) {
        let get = |k: &str| meta.iter().find(|(n, _)| *n == k).unwrap().1.clone();
        let (
            Value::Array(Array::String(t)),
            Value::Array(Array::String(m)),
            Value::Array(Array::I32(ty)),
        ) = (
            get("tokenizer.ggml.tokens"),
            get("tokenizer.ggml.merges"),
            get("tokenizer.ggml.token_type"),
        )
        else {
            panic!("types")
        };
        (t, m, ty)
    }

    #[test]
    fn full_size_vocab_is_consistent() {
        let n = 151936;
        let meta = tokenizer_metadata(Arch::Qwen2, n);
        let (tokens, merges, types) = vocab(&meta);
        assert_eq!(tokens.len(), n);
        assert_eq!(types.len(), n);
        let set: HashSet<&str> = tokens.iter().map(|s| s.as_str()).collect();
        assert_eq!(set.len(), n, "tokens unique");
        assert_eq!(tokens[151645], "<|im_end|>");
        assert_eq!(types[151645], 3);
        // every merge joins two existing tokens into an existing token
        for m in &merges {
            let (a, b) = m.split_once(' ').unwrap();
            assert!(set.contains(a) && set.contains(b));
            assert!(set.contains(format!("{a}{b}").as_str()), "{m}");
        }
        assert_eq!(merges.len(), n - 3 - 256);
    }

    #[test]
    fn small_vocab_keeps_specials_inside() {
        let meta = tokenizer_metadata(Arch::Llama, 300);
        let (tokens, _, types) = vocab(&meta);
        assert_eq!(tokens.len(), 300);
        assert_eq!(types.iter().filter(|&&t| t == 3).count(), 5);
        assert!(tokens.iter().all(|t| !t.is_empty()));
    }
}
