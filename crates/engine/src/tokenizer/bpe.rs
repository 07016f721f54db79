//! Byte-level BPE (`tokenizer.ggml.model = gpt2`) on the `tokenizers` crate: a regex
//! pre-tokenizer chosen by `tokenizer.ggml.pre`, GPT-2's byte-to-unicode mapping, then
//! rank-ordered merges within each pre-tokenized word.
//!
//! The regexes are llama.cpp's (src/llama-vocab.cpp, `llm_tokenizer_bpe`), which are the
//! tokenizer.json patterns with `(?i:…)` spelled out as character classes. Splitting and the
//! byte mapping are done here on byte ranges rather than through `tokenizers`'
//! `PreTokenizedString` (which tracks per-byte alignments): same result, ~3x faster; the
//! regex engine (fancy-regex, via `tokenizers::utils::SysRegex`) and the BPE model are the
//! crate's.

use tokenizers::models::bpe::{Vocab as BpeVocab, BPE};
use tokenizers::utils::SysRegex;
use tokenizers::Model;

use super::vocab::Vocab;
use super::TokenizerError;

const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen3.5: as Qwen2, but combining marks (\p{M}) stay with the letters they modify.
const QWEN35: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// llama.cpp's fallback for a missing or "default" pre-tokenizer: four passes.
const DEFAULT: &[&str] = &[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"];

/// The regex passes for a `tokenizer.ggml.pre` value; each pass splits every piece of the
/// previous one, keeping matches and the text between them.
pub fn pre_tokenizer_regexes(pre: &str) -> Result<&'static [&'static str], TokenizerError> {
    Ok(match pre {
        "" | "default" => DEFAULT,
        "gpt-2" => &[GPT2],
        "llama3" | "llama-v3" | "llama-bpe" => &[LLAMA3],
        "qwen2" | "deepseek-r1-qwen" => &[QWEN2],
        "qwen35" => &[QWEN35],
        other => return Err(TokenizerError::UnsupportedPre(other.to_owned())),
    })
}

fn backend(e: impl std::fmt::Display) -> TokenizerError {
    TokenizerError::Backend(e.to_string())
}

pub struct ByteLevelBpe {
    /// Regex passes of the pre-tokenizer (the `tokenizers` crate's regex type, fancy-regex).
    passes: Vec<SysRegex>,
    /// Byte → GPT-2 printable character.
    byte_chars: [char; 256],
    model: BPE,
}

impl ByteLevelBpe {
    pub fn new(vocab: &Vocab) -> Result<ByteLevelBpe, TokenizerError> {
        let passes = pre_tokenizer_regexes(&vocab.pre)?
            .iter()
            .map(|re| SysRegex::new(re).map_err(backend))
            .collect::<Result<Vec<_>, _>>()?;

        let bpe_vocab: BpeVocab = vocab
            .token_to_id
            .iter()
            .map(|(k, &v)| (k.clone(), v))
            .collect();
        // `tokenizers` rejects merges whose parts or result are not tokens; llama.cpp would
        // merge them and then spell the unknown result as bytes. Dropping them keeps every
        // real vocabulary loadable (none of the ones we test has such a merge).
        let merges: Vec<(String, String)> = vocab
            .merges
            .iter()
            .filter(|(a, b)| {
                vocab.token_to_id.contains_key(a)
                    && vocab.token_to_id.contains_key(b)
                    && vocab.token_to_id.contains_key(&format!("{a}{b}"))
            })
            .cloned()
            .collect();
        let model = BPE::builder()
            .vocab_and_merges(bpe_vocab, merges)
            .ignore_merges(vocab.ignore_merges)
            .build()
            .map_err(backend)?;
        Ok(ByteLevelBpe {
            passes,
            byte_chars: byte_to_char_table(),
            model,
        })
    }

    /// Byte ranges of the pre-tokenized words of `text`: each regex pass splits every
    /// piece of the previous pass into its matches and the text between them (the
    /// `Split(pattern, "isolated")` pre-tokenizer of tokenizer.json). Should fancy-regex
    /// give up (its backtrack limit), the rest of that piece stays one word: coarser
    /// tokens, never lost text.
    fn words(&self, text: &str) -> Vec<(usize, usize)> {
        let mut pieces = vec![(0, text.len())];
        for re in &self.passes {
            let mut next = Vec::with_capacity(pieces.len() * 2);
            for (a, b) in pieces {
                let mut last = a;
                for (s, e) in re.find_iter(&text[a..b]) {
                    let (s, e) = (a + s, a + e);
                    if s == e {
                        continue;
                    }
                    if s > last {
                        next.push((last, s));
                    }
                    next.push((s, e));
                    last = e;
                }
                if last < b {
                    next.push((last, b));
                }
            }
            pieces = next;
        }
        pieces
    }

    /// Appends the ids of `text` (which holds no special tokens) to `out`.
    pub fn encode(&self, text: &str, out: &mut Vec<u32>) -> Result<(), TokenizerError> {
        let mut word = String::new();
        for (a, b) in self.words(text) {
            // Byte-level: every byte of the word as its printable stand-in character.
            word.clear();
            word.extend(
                text[a..b]
                    .bytes()
                    .map(|byte| self.byte_chars[byte as usize]),
            );
            for tok in self.model.tokenize(&word).map_err(backend)? {
                out.push(tok.id);
            }
        }
        Ok(())
    }
}

/// GPT-2's reversible byte → printable character table: printable Latin-1 bytes map to
/// themselves, the other 68 bytes to U+0100.. in byte order (openai/gpt-2 encoder.py
/// `bytes_to_unicode`).
fn byte_to_char_table() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..=255u8 {
        let printable = (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
        table[b as usize] = if printable {
            b as char
        } else {
            let c = char::from_u32(next).unwrap_or('\u{FFFD}');
            next += 1;
            c
        };
    }
    table
}

/// Decodes a byte-level token text back to its bytes. A character outside the table
/// (a malformed vocabulary) is kept as its own UTF-8.
pub fn byte_level_decode(text: &str) -> Vec<u8> {
    thread_local! {
        static INVERSE: std::collections::HashMap<char, u8> = byte_to_char_table()
            .iter()
            .enumerate()
            .map(|(b, &c)| (c, b as u8))
            .collect();
    }
    INVERSE.with(|inv| {
        let mut out = Vec::with_capacity(text.len());
        for c in text.chars() {
            match inv.get(&c) {
                Some(&b) => out.push(b),
                None => {
                    let mut buf = [0u8; 4];
                    out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                }
            }
        }
        out
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_table_matches_gpt2() {
        let t = byte_to_char_table();
        assert_eq!(t[b' ' as usize], 'Ġ'); // U+0120: space is the 33rd unprintable byte
        assert_eq!(t[b'\n' as usize], 'Ċ'); // U+010A
        assert_eq!(t[b'a' as usize], 'a');
        assert_eq!(t[0xAD], '\u{143}'); // soft hyphen: the 68th unprintable byte
        let all: std::collections::HashSet<char> = t.iter().copied().collect();
        assert_eq!(all.len(), 256);
        assert_eq!(byte_level_decode("ĠhelloĊ"), b" hello\n");
    }
}
