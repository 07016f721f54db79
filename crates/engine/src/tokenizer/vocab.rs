//! The vocabulary as GGUF metadata describes it: token texts, scores, types, special ids and
//! the flags that steer encoding (add_bos, add_space_prefix …).
//!
//! Keys and defaults follow llama.cpp's `llama_vocab::impl::load` (src/llama-vocab.cpp), which
//! is the reference for how a GGUF vocabulary is meant to be read.

use std::collections::{BTreeSet, HashMap};

use gguf::{Array, Metadata};

use super::TokenizerError;

/// `tokenizer.ggml.token_type` values (gguf-py `TokenType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenKind {
    Normal,
    Unknown,
    Control,
    UserDefined,
    Unused,
    Byte,
    Undefined,
}

impl TokenKind {
    fn from_gguf(v: i64) -> TokenKind {
        match v {
            1 => TokenKind::Normal,
            2 => TokenKind::Unknown,
            3 => TokenKind::Control,
            4 => TokenKind::UserDefined,
            5 => TokenKind::Unused,
            6 => TokenKind::Byte,
            _ => TokenKind::Undefined,
        }
    }
}

/// Which algorithm turns text into ids (`tokenizer.ggml.model`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VocabType {
    /// `llama`: SentencePiece BPE with score-ranked merges and `<0xXX>` byte fallback.
    Spm,
    /// `gpt2`: byte-level BPE with ranked merges and a regex pre-tokenizer.
    Bpe,
}

#[derive(Debug, Clone)]
pub struct TokenData {
    pub text: String,
    pub score: f32,
    pub kind: TokenKind,
}

#[derive(Debug, Clone)]
pub struct Vocab {
    pub vocab_type: VocabType,
    /// `tokenizer.ggml.pre` ("" when absent).
    pub pre: String,
    pub tokens: Vec<TokenData>,
    pub token_to_id: HashMap<String, u32>,
    /// BPE merges in rank order, split at the first space after position 0.
    pub merges: Vec<(String, String)>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub unk: Option<u32>,
    pub pad: Option<u32>,
    pub add_bos: bool,
    pub add_eos: bool,
    pub add_space_prefix: bool,
    /// Use merges-free lookup of whole pre-tokenized words first (llama3 style).
    pub ignore_merges: bool,
    /// llama.cpp's `clean_up_tokenization_spaces` emulation on detokenize.
    pub clean_spaces: bool,
    /// Ids that end generation (eos, eot, `<|im_end|>` …).
    pub eog: BTreeSet<u32>,
    /// Control, user-defined and unknown tokens, longest text first: split out of the
    /// text before BPE (llama.cpp `cache_special_tokens`).
    pub special_by_len: Vec<u32>,
}

const KEY_MODEL: &str = "tokenizer.ggml.model";
const KEY_PRE: &str = "tokenizer.ggml.pre";
const KEY_TOKENS: &str = "tokenizer.ggml.tokens";
const KEY_SCORES: &str = "tokenizer.ggml.scores";
const KEY_TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
const KEY_MERGES: &str = "tokenizer.ggml.merges";

/// Token texts that llama.cpp treats as end-of-turn when no eot id is given.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];

/// Token texts that end generation (llama.cpp `special_eog_ids`, by text).
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<｜end▁of▁sentence｜>",
];

fn integer_array(meta: &Metadata, key: &str) -> Result<Option<Vec<i64>>, TokenizerError> {
    let Some(arr) = meta.get_array(key) else {
        return Ok(None);
    };
    let v: Vec<i64> = match arr {
        Array::I32(v) => v.iter().map(|&x| x as i64).collect(),
        Array::U32(v) => v.iter().map(|&x| x as i64).collect(),
        Array::I8(v) => v.iter().map(|&x| x as i64).collect(),
        Array::U8(v) => v.iter().map(|&x| x as i64).collect(),
        Array::I16(v) => v.iter().map(|&x| x as i64).collect(),
        Array::U16(v) => v.iter().map(|&x| x as i64).collect(),
        Array::I64(v) => v.clone(),
        _ => return Err(TokenizerError::BadKey(key.to_owned())),
    };
    Ok(Some(v))
}

fn score_array(meta: &Metadata, key: &str) -> Result<Option<Vec<f32>>, TokenizerError> {
    let Some(arr) = meta.get_array(key) else {
        return Ok(None);
    };
    match arr {
        Array::F32(v) => Ok(Some(v.clone())),
        Array::F64(v) => Ok(Some(v.iter().map(|&x| x as f32).collect())),
        Array::I32(v) => Ok(Some(v.iter().map(|&x| x as f32).collect())),
        _ => Err(TokenizerError::BadKey(key.to_owned())),
    }
}

/// A special-token id from metadata, if present and inside the vocabulary; an id out of
/// range (stories260K stores 0xFFFFFFFF for "none") keeps the default, as llama.cpp does.
fn special_id(meta: &Metadata, key: &str, default: Option<u32>, n: usize) -> Option<u32> {
    let default = default.filter(|&d| (d as usize) < n);
    match meta.get_u64(key) {
        Some(id) if (id as usize) < n => Some(id as u32),
        _ => default,
    }
}

impl Vocab {
    pub fn from_gguf(meta: &Metadata) -> Result<Vocab, TokenizerError> {
        let model = meta
            .get_str(KEY_MODEL)
            .ok_or_else(|| TokenizerError::MissingKey(KEY_MODEL.to_owned()))?;
        let vocab_type = match model {
            "llama" => VocabType::Spm,
            "gpt2" => VocabType::Bpe,
            other => return Err(TokenizerError::UnsupportedModel(other.to_owned())),
        };
        let pre = meta.get_str(KEY_PRE).unwrap_or("").to_owned();

        let texts = meta
            .get_str_array(KEY_TOKENS)
            .ok_or_else(|| TokenizerError::MissingKey(KEY_TOKENS.to_owned()))?;
        let n = texts.len();
        if n == 0 || n > u32::MAX as usize {
            return Err(TokenizerError::BadKey(KEY_TOKENS.to_owned()));
        }
        let scores = score_array(meta, KEY_SCORES)?;
        if scores.as_ref().is_some_and(|s| s.len() < n) {
            return Err(TokenizerError::BadKey(KEY_SCORES.to_owned()));
        }
        let types = integer_array(meta, KEY_TOKEN_TYPE)?;
        if types.as_ref().is_some_and(|t| t.len() < n) {
            return Err(TokenizerError::BadKey(KEY_TOKEN_TYPE.to_owned()));
        }

        let mut tokens = Vec::with_capacity(n);
        let mut token_to_id = HashMap::with_capacity(n);
        for (i, text) in texts.iter().enumerate() {
            // llama.cpp renames empty tokens so that every text maps to one id.
            let text = if text.is_empty() {
                format!("[EMPTY_{i}]")
            } else {
                text.clone()
            };
            if token_to_id.insert(text.clone(), i as u32).is_some() {
                return Err(TokenizerError::DuplicateToken(text));
            }
            tokens.push(TokenData {
                text,
                score: scores.as_ref().map_or(0.0, |s| s[i]),
                kind: types
                    .as_ref()
                    .map_or(TokenKind::Normal, |t| TokenKind::from_gguf(t[i])),
            });
        }

        let mut merges = Vec::new();
        if vocab_type == VocabType::Bpe {
            let raw = meta
                .get_str_array(KEY_MERGES)
                .ok_or_else(|| TokenizerError::MissingKey(KEY_MERGES.to_owned()))?;
            merges.reserve(raw.len());
            for m in raw {
                // Split at the first space after position 0 (a merge part may itself be " ").
                let pos = m.bytes().skip(1).position(|b| b == b' ').map(|p| p + 1);
                match pos {
                    Some(p) => merges.push((m[..p].to_owned(), m[p + 1..].to_owned())),
                    None => return Err(TokenizerError::BadMerge(m.clone())),
                }
            }
        }

        // Defaults per model type, then per pre-tokenizer, then explicit metadata.
        let (def_bos, def_eos, def_unk) = match vocab_type {
            VocabType::Spm => (Some(1), Some(2), Some(0)),
            VocabType::Bpe => (Some(11), Some(11), None),
        };
        let mut add_bos = false;
        let mut add_eos = false;
        let mut add_space_prefix = false;
        let mut ignore_merges = false;
        let mut clean_spaces = false;
        match vocab_type {
            VocabType::Spm => {
                add_space_prefix = true;
                add_bos = true;
            }
            VocabType::Bpe => {
                clean_spaces = true;
                match pre.as_str() {
                    "" | "default" | "gpt-2" => {}
                    "llama3" | "llama-v3" | "llama-bpe" => {
                        ignore_merges = true;
                        add_bos = true;
                    }
                    "qwen2" | "deepseek-r1-qwen" | "qwen35" => clean_spaces = false,
                    other => return Err(TokenizerError::UnsupportedPre(other.to_owned())),
                }
            }
        }
        if let Some(b) = meta.get_bool("tokenizer.ggml.add_space_prefix") {
            add_space_prefix = b;
        }

        let bos = special_id(meta, "tokenizer.ggml.bos_token_id", def_bos, n);
        let eos = special_id(meta, "tokenizer.ggml.eos_token_id", def_eos, n);
        let mut eot = special_id(meta, "tokenizer.ggml.eot_token_id", None, n);
        let mut eom = special_id(meta, "tokenizer.ggml.eom_token_id", None, n);
        let unk = special_id(meta, "tokenizer.ggml.unknown_token_id", def_unk, n);
        let pad = special_id(meta, "tokenizer.ggml.padding_token_id", None, n);
        if let Some(b) = meta.get_bool("tokenizer.ggml.add_bos_token") {
            add_bos = b;
        }
        if let Some(b) = meta.get_bool("tokenizer.ggml.add_eos_token") {
            add_eos = b;
        }
        if add_bos && bos.is_none() {
            return Err(TokenizerError::MissingKey(
                "tokenizer.ggml.bos_token_id".to_owned(),
            ));
        }
        if add_eos && eos.is_none() {
            return Err(TokenizerError::MissingKey(
                "tokenizer.ggml.eos_token_id".to_owned(),
            ));
        }

        // Auto-detect eot/eom and end-of-generation tokens by text, marking them control
        // (llama.cpp does the same: converters do not always flag them). llama.cpp takes the
        // first match in hash order; we take the first text of EOT_TEXTS present, so a vocab
        // with both `<|im_end|>` and `<|endoftext|>` gets `<|im_end|>`.
        if eot.is_none() {
            eot = EOT_TEXTS.iter().find_map(|t| token_to_id.get(*t).copied());
        }
        if eom.is_none() {
            eom = token_to_id.get("<|eom_id|>").copied();
        }
        let mut eog: BTreeSet<u32> = EOG_TEXTS
            .iter()
            .filter_map(|t| token_to_id.get(*t).copied())
            .collect();
        for id in eog.iter().chain(eot.iter()).chain(eom.iter()) {
            tokens[*id as usize].kind = TokenKind::Control;
        }
        eog.extend([eos, eot, eom].into_iter().flatten());

        let mut special_by_len: Vec<u32> = (0..n as u32)
            .filter(|&id| {
                matches!(
                    tokens[id as usize].kind,
                    TokenKind::Control | TokenKind::UserDefined | TokenKind::Unknown
                )
            })
            .collect();
        special_by_len.sort_by(|&a, &b| {
            tokens[b as usize]
                .text
                .len()
                .cmp(&tokens[a as usize].text.len())
                .then(a.cmp(&b))
        });

        Ok(Vocab {
            vocab_type,
            pre,
            tokens,
            token_to_id,
            merges,
            bos,
            eos,
            eot,
            eom,
            unk,
            pad,
            add_bos,
            add_eos,
            add_space_prefix,
            ignore_merges,
            clean_spaces,
            eog,
            special_by_len,
        })
    }

    pub fn text_to_id(&self, text: &str) -> Option<u32> {
        self.token_to_id.get(text).copied()
    }

    pub fn kind(&self, id: u32) -> Option<TokenKind> {
        self.tokens.get(id as usize).map(|t| t.kind)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gguf::Value;

    fn strings(v: &[&str]) -> Value {
        Value::Array(Array::String(v.iter().map(|s| s.to_string()).collect()))
    }

    fn bpe_meta() -> Metadata {
        let mut m = Metadata::new();
        m.insert("tokenizer.ggml.model", Value::String("gpt2".into()));
        m.insert("tokenizer.ggml.pre", Value::String("qwen2".into()));
        m.insert(
            "tokenizer.ggml.tokens",
            strings(&["a", "b", "ab", "<|endoftext|>"]),
        );
        m.insert("tokenizer.ggml.merges", strings(&["a b"]));
        m
    }

    #[test]
    fn reads_a_small_bpe_vocab() {
        let v = Vocab::from_gguf(&bpe_meta()).unwrap();
        assert_eq!(v.merges, vec![("a".to_string(), "b".to_string())]);
        // Default BPE bos/eos id 11 is outside this vocab: none, as llama.cpp disables it.
        assert_eq!((v.bos, v.eos), (None, None));
        assert!(!v.add_bos);
        // `<|endoftext|>` is found by text: eot, end of generation, control.
        assert_eq!(v.eot, Some(3));
        assert!(v.eog.contains(&3));
        assert_eq!(v.kind(3), Some(TokenKind::Control));
        assert_eq!(v.special_by_len, vec![3]);
    }

    #[test]
    fn hostile_metadata_gives_errors() {
        let err = |m: &Metadata| Vocab::from_gguf(m).unwrap_err();

        assert!(matches!(
            err(&Metadata::new()),
            TokenizerError::MissingKey(_)
        ));

        let mut m = bpe_meta();
        m.insert("tokenizer.ggml.model", Value::String("bert".into()));
        assert!(matches!(err(&m), TokenizerError::UnsupportedModel(_)));

        let mut m = bpe_meta();
        m.insert("tokenizer.ggml.pre", Value::String("nonesuch".into()));
        assert!(matches!(err(&m), TokenizerError::UnsupportedPre(_)));

        let mut m = bpe_meta();
        m.insert(
            "tokenizer.ggml.token_type",
            Value::Array(Array::I32(vec![1, 1])),
        );
        assert!(matches!(err(&m), TokenizerError::BadKey(_)));

        let mut m = bpe_meta();
        m.insert(
            "tokenizer.ggml.scores",
            Value::Array(Array::String(vec!["x".into()])),
        );
        assert!(matches!(err(&m), TokenizerError::BadKey(_)));

        let mut m = bpe_meta();
        m.insert("tokenizer.ggml.merges", strings(&["ab"]));
        assert!(matches!(err(&m), TokenizerError::BadMerge(_)));

        let mut m = Metadata::new();
        m.insert("tokenizer.ggml.model", Value::String("gpt2".into()));
        m.insert("tokenizer.ggml.tokens", strings(&["a"]));
        assert!(
            matches!(err(&m), TokenizerError::MissingKey(_)),
            "no merges"
        );

        let mut m = bpe_meta();
        m.insert("tokenizer.ggml.tokens", strings(&["a", "a"]));
        assert!(matches!(err(&m), TokenizerError::DuplicateToken(_)));

        let mut m = bpe_meta();
        m.insert("tokenizer.ggml.tokens", strings(&[]));
        assert!(matches!(err(&m), TokenizerError::BadKey(_)));

        // add_bos asked for but no usable BOS id.
        let mut m = bpe_meta();
        m.insert("tokenizer.ggml.add_bos_token", Value::Bool(true));
        m.insert("tokenizer.ggml.bos_token_id", Value::U32(u32::MAX));
        assert!(matches!(err(&m), TokenizerError::MissingKey(_)));
    }

    #[test]
    fn out_of_range_special_ids_fall_back() {
        let mut m = bpe_meta();
        m.insert("tokenizer.ggml.eos_token_id", Value::U32(u32::MAX));
        m.insert("tokenizer.ggml.padding_token_id", Value::U32(2));
        let v = Vocab::from_gguf(&m).unwrap();
        assert_eq!(v.eos, None);
        assert_eq!(v.pad, Some(2));
    }
}
