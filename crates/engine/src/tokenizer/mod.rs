//! Tokenizers built from GGUF metadata, with llama.cpp's semantics (src/llama-vocab.cpp),
//! whose tokenizer test suite is our oracle:
//!
//! - `gpt2` vocabularies: byte-level BPE ([`bpe`]) with the pre-tokenizer regex named by
//!   `tokenizer.ggml.pre` (default, gpt-2, llama-bpe/llama3, qwen2, qwen35);
//! - `llama` vocabularies: SentencePiece BPE with byte fallback ([`spm`]).
//!
//! Special tokens (control, user-defined, unknown) are cut out of the text before either
//! runs ([`special`]); user-defined ones always, control ones only with `parse_special`.

mod bpe;
mod special;
mod spm;
mod stream;
mod vocab;

use std::sync::Arc;

pub use stream::StreamDecoder;
pub use vocab::{TokenKind, VocabType};

use bpe::ByteLevelBpe;
use special::Fragment;
use vocab::Vocab;

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("tokenizer metadata key {0} is missing")]
    MissingKey(String),
    #[error("tokenizer metadata key {0} has the wrong type or length")]
    BadKey(String),
    #[error("unsupported tokenizer model '{0}' (supported: gpt2, llama)")]
    UnsupportedModel(String),
    #[error(
        "unsupported pre-tokenizer '{0}' (supported: default, gpt-2, llama-bpe, qwen2, qwen35)"
    )]
    UnsupportedPre(String),
    #[error("duplicate token in vocabulary: {0:?}")]
    DuplicateToken(String),
    #[error("malformed BPE merge {0:?}")]
    BadMerge(String),
    #[error("tokenizer backend: {0}")]
    Backend(String),
}

struct Inner {
    vocab: Vocab,
    /// Present for byte-level BPE vocabularies.
    bpe: Option<ByteLevelBpe>,
}

/// A tokenizer read from GGUF metadata. Cloning is cheap (shared, immutable).
#[derive(Clone)]
pub struct Tokenizer {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let v = &self.inner.vocab;
        f.debug_struct("Tokenizer")
            .field("type", &v.vocab_type)
            .field("pre", &v.pre)
            .field("n_vocab", &v.tokens.len())
            .field("bos", &v.bos)
            .field("eos", &v.eos)
            .finish()
    }
}

impl Tokenizer {
    pub fn from_gguf(meta: &gguf::Metadata) -> Result<Tokenizer, TokenizerError> {
        let vocab = Vocab::from_gguf(meta)?;
        let bpe = match vocab.vocab_type {
            VocabType::Bpe => Some(ByteLevelBpe::new(&vocab)?),
            VocabType::Spm => None,
        };
        Ok(Tokenizer {
            inner: Arc::new(Inner { vocab, bpe }),
        })
    }

    fn vocab(&self) -> &Vocab {
        &self.inner.vocab
    }

    /// Token ids of `text`. `add_special` adds BOS/EOS as the metadata says
    /// (`tokenizer.ggml.add_bos_token` …); `parse_special` lets control tokens written in the
    /// text (`<|im_start|>`) become their ids instead of being spelled out.
    pub fn encode(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        let v = self.vocab();
        let fragments = special::partition(v, text, parse_special);
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && v.add_bos {
            out.extend(v.bos);
        }
        match v.vocab_type {
            VocabType::Spm => {
                // A leading space is added to the text at the start and after each special
                // token (SentencePiece's add_dummy_prefix, as llama.cpp applies it).
                let mut prev_special = true;
                for frag in &fragments {
                    match *frag {
                        Fragment::Text(a, b) => {
                            let mut piece = String::with_capacity(b - a + 1);
                            if v.add_space_prefix && prev_special {
                                piece.push(' ');
                            }
                            piece.push_str(&text[a..b]);
                            spm::encode(v, &piece.replace(' ', "\u{2581}"), &mut out);
                            prev_special = false;
                        }
                        Fragment::Token(id) => {
                            out.push(id);
                            prev_special = true;
                        }
                    }
                }
            }
            VocabType::Bpe => {
                let bpe = self
                    .inner
                    .bpe
                    .as_ref()
                    .ok_or_else(|| TokenizerError::Backend("BPE model not built".to_owned()))?;
                for frag in &fragments {
                    match *frag {
                        Fragment::Text(a, b) => bpe.encode(&text[a..b], &mut out)?,
                        Fragment::Token(id) => out.push(id),
                    }
                }
            }
        }
        if add_special && v.add_eos {
            out.extend(v.eos);
        }
        Ok(out)
    }

    /// The bytes a token stands for, special tokens written out (`<|im_end|>`); empty for an
    /// id outside the vocabulary. Byte tokens (`<0xE2>`, byte-level `Ã¢`) give raw bytes that
    /// may be part of a UTF-8 character: join pieces before converting to text.
    pub fn token_to_piece(&self, id: u32) -> Vec<u8> {
        self.piece(id, true)
    }

    /// As [`Tokenizer::token_to_piece`]; with `special == false` control and unknown tokens
    /// give nothing (llama.cpp `token_to_piece(…, special)`).
    pub fn piece(&self, id: u32, special: bool) -> Vec<u8> {
        let v = self.vocab();
        let Some(tok) = v.tokens.get(id as usize) else {
            return Vec::new();
        };
        match tok.kind {
            TokenKind::Control | TokenKind::Unknown if !special => Vec::new(),
            TokenKind::Control | TokenKind::Unknown | TokenKind::UserDefined => {
                tok.text.as_bytes().to_vec()
            }
            TokenKind::Normal => match v.vocab_type {
                VocabType::Spm => tok.text.replace('\u{2581}', " ").into_bytes(),
                VocabType::Bpe => bpe::byte_level_decode(&tok.text),
            },
            TokenKind::Byte => parse_byte_token(&tok.text)
                .map(|b| vec![b])
                .unwrap_or_default(),
            TokenKind::Unused | TokenKind::Undefined => Vec::new(),
        }
    }

    /// Text of `ids`. `skip_special` drops control tokens (and a trailing EOS the tokenizer
    /// adds itself); otherwise they are written out. As SentencePiece decodes: the space that
    /// encoding put before the first word is removed from the first non-empty piece (llama.cpp
    /// removes it from the first token only, so a skipped BOS would keep it). Vocabularies
    /// with `clean_up_tokenization_spaces` get llama.cpp's space cleaning. Invalid UTF-8
    /// becomes U+FFFD.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> String {
        let v = self.vocab();
        let mut ids = ids;
        if skip_special && v.add_eos && ids.last().is_some_and(|&l| Some(l) == v.eos) {
            ids = &ids[..ids.len() - 1];
        }
        let mut remove_space = v.add_space_prefix;
        let mut bytes = Vec::new();
        for &id in ids {
            let piece = self.piece(id, !skip_special);
            if piece.is_empty() {
                continue;
            }
            let piece = if remove_space && piece[0] == b' ' {
                &piece[1..]
            } else {
                &piece[..]
            };
            bytes.extend_from_slice(piece);
            remove_space = false;
        }
        if v.clean_spaces {
            bytes = clean_up_spaces(&bytes);
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    pub fn bos(&self) -> Option<u32> {
        self.vocab().bos
    }
    pub fn eos(&self) -> Option<u32> {
        self.vocab().eos
    }
    pub fn eot(&self) -> Option<u32> {
        self.vocab().eot
    }
    pub fn eom(&self) -> Option<u32> {
        self.vocab().eom
    }
    pub fn unk(&self) -> Option<u32> {
        self.vocab().unk
    }
    pub fn pad(&self) -> Option<u32> {
        self.vocab().pad
    }
    /// Whether encoding with `add_special` puts BOS first (metadata or the model's default).
    pub fn add_bos(&self) -> bool {
        self.vocab().add_bos
    }
    pub fn add_eos(&self) -> bool {
        self.vocab().add_eos
    }
    /// End of generation: eos, eot, eom and tokens such as `<|im_end|>`, `<|endoftext|>`.
    pub fn is_eog(&self, id: u32) -> bool {
        self.vocab().eog.contains(&id)
    }
    pub fn eog_ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.vocab().eog.iter().copied()
    }
    pub fn n_vocab(&self) -> usize {
        self.vocab().tokens.len()
    }
    pub fn vocab_type(&self) -> VocabType {
        self.vocab().vocab_type
    }
    /// The token's text as stored in the vocabulary (`Ġhello`, `▁hello`, `<0x0A>`).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.vocab()
            .tokens
            .get(id as usize)
            .map(|t| t.text.as_str())
    }
    pub fn token_kind(&self, id: u32) -> Option<TokenKind> {
        self.vocab().kind(id)
    }
    pub fn text_to_id(&self, text: &str) -> Option<u32> {
        self.vocab().text_to_id(text)
    }
}

/// `<0xAB>` → 0xAB.
fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// llama.cpp's emulation of `clean_up_tokenization_spaces`: " ?" " !" " ." " ," lose the
/// space, " ' " becomes "'", and " 's" " 'm" " 're" " 've" lose the space.
fn clean_up_spaces(text: &[u8]) -> Vec<u8> {
    let pass1: Vec<u8> = {
        let mut out = Vec::with_capacity(text.len());
        for (i, &x) in text.iter().enumerate() {
            if i > 0 && text[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
                out.pop();
            }
            out.push(x);
        }
        out
    };
    let pass2: Vec<u8> = {
        // In place like llama.cpp: the dropped space after the apostrophe reads as NUL.
        let mut t = pass1;
        let mut out = Vec::with_capacity(t.len());
        let mut i = 0;
        while i < t.len() {
            let x = t[i];
            if i > 0 && x == b'\'' && i + 1 < t.len() && t[i - 1] == b' ' && t[i + 1] == b' ' {
                out.pop();
                out.push(x);
                t[i + 1] = 0;
                i += 2;
                continue;
            }
            out.push(x);
            i += 1;
        }
        out
    };
    let t = &pass2;
    let mut out = Vec::with_capacity(t.len());
    for (i, &x) in t.iter().enumerate() {
        if i > 0 && t[i - 1] == b' ' && x == b'\'' && i + 1 < t.len() {
            let x1 = t[i + 1];
            let x2 = t.get(i + 2).copied();
            let drop = matches!(x1, b's' | b'm')
                || (i + 2 < t.len() && matches!((x1, x2), (b'r', Some(b'e')) | (b'v', Some(b'e'))));
            if drop {
                out.pop();
            }
        }
        out.push(x);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_tokens_parse() {
        assert_eq!(parse_byte_token("<0x0A>"), Some(10));
        assert_eq!(parse_byte_token("<0xFF>"), Some(255));
        assert_eq!(parse_byte_token("<0x1>"), None);
        assert_eq!(parse_byte_token("hello"), None);
    }

    #[test]
    fn clean_spaces_like_llama_cpp() {
        let c = |s: &str| String::from_utf8(clean_up_spaces(s.as_bytes())).unwrap();
        assert_eq!(c("Hello , world !"), "Hello, world!");
        assert_eq!(c("it ' s"), "it's");
        assert_eq!(c("he 's here , we 're"), "he's here, we're");
        assert_eq!(c("don 't"), "don 't");
    }
}
