//! SentencePiece BPE (`tokenizer.ggml.model = llama`) as llama.cpp runs it
//! (src/llama-vocab.cpp, `llm_tokenizer_spm_session`): start from UTF-8 characters, merge
//! the adjacent pair whose concatenation is the highest-scoring token (leftmost on ties)
//! until none is left, then spell any symbol that is not a token as `<0xXX>` byte tokens.
//!
//! The `tokenizers` crate cannot express this: its BPE ranks explicit merges, while here the
//! rank is the score of the merged token and there is no merge list at all.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::vocab::Vocab;

#[derive(Clone, Copy)]
struct Symbol {
    /// Byte range of the symbol in the text; `len == 0` once merged into its left neighbour.
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

struct Bigram {
    left: usize,
    right: usize,
    score: f32,
    /// Byte length of the pair when queued; a different length later means it is stale.
    size: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    /// Max-heap order: higher score first, then the leftmost pair.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

/// Appends the ids of `text` (spaces already escaped to `▁`) to `out`.
pub fn encode(vocab: &Vocab, text: &str, out: &mut Vec<u32>) {
    let mut symbols: Vec<Symbol> = Vec::new();
    for (start, c) in text.char_indices() {
        let i = symbols.len();
        symbols.push(Symbol {
            start,
            len: c.len_utf8(),
            prev: i.checked_sub(1),
            next: None,
        });
        if i > 0 {
            symbols[i - 1].next = Some(i);
        }
    }
    if symbols.is_empty() {
        return;
    }

    let mut queue = BinaryHeap::new();
    let try_add = |left: Option<usize>,
                   right: Option<usize>,
                   symbols: &[Symbol],
                   queue: &mut BinaryHeap<Bigram>| {
        let (Some(l), Some(r)) = (left, right) else {
            return;
        };
        let start = symbols[l].start;
        let size = symbols[l].len + symbols[r].len;
        let Some(id) = vocab.text_to_id(&text[start..start + size]) else {
            return;
        };
        queue.push(Bigram {
            left: l,
            right: r,
            score: vocab.tokens[id as usize].score,
            size,
        });
    };

    for i in 1..symbols.len() {
        try_add(Some(i - 1), Some(i), &symbols, &mut queue);
    }

    while let Some(bigram) = queue.pop() {
        let (l, r) = (bigram.left, bigram.right);
        if symbols[l].len == 0
            || symbols[r].len == 0
            || symbols[l].len + symbols[r].len != bigram.size
        {
            continue;
        }
        symbols[l].len += symbols[r].len;
        symbols[r].len = 0;
        symbols[l].next = symbols[r].next;
        if let Some(n) = symbols[r].next {
            symbols[n].prev = Some(l);
        }
        let (prev, next) = (symbols[l].prev, symbols[l].next);
        try_add(prev, Some(l), &symbols, &mut queue);
        try_add(Some(l), next, &symbols, &mut queue);
    }

    // Every merge produced a token, so a symbol that is not a token is one character that
    // no token spells: write it as byte tokens (llama.cpp `resegment`).
    let mut i = Some(0);
    while let Some(idx) = i {
        let piece = &text[symbols[idx].start..symbols[idx].start + symbols[idx].len];
        match vocab.text_to_id(piece) {
            Some(id) => out.push(id),
            None => out.extend(piece.bytes().filter_map(|b| byte_token(vocab, b))),
        }
        i = symbols[idx].next;
    }
}

/// The `<0xXX>` token of a byte, or the byte itself as a one-character token (llama.cpp
/// `byte_to_token` for SPM).
pub fn byte_token(vocab: &Vocab, b: u8) -> Option<u32> {
    vocab.text_to_id(&format!("<0x{b:02X}>")).or_else(|| {
        std::str::from_utf8(&[b])
            .ok()
            .and_then(|s| vocab.text_to_id(s))
    })
}

#[cfg(test)]
mod tests {
    use gguf::{Array, Metadata, Value};

    use super::super::vocab::Vocab;
    use super::*;

    /// A hand-made SentencePiece vocab: `<unk> <s> </s>`, two byte tokens, then pieces with
    /// scores chosen so that the merge order is visible.
    fn vocab() -> Vocab {
        let tokens = [
            "<unk>", "<s>", "</s>", "<0xC3>", "<0xA9>", "▁", "a", "b", "c", "ab", "▁a", "bc",
            "▁abc",
        ];
        let scores = [
            0.0, 0.0, 0.0, 0.0, 0.0, -5.0, -6.0, -6.0, -6.0, -1.0, -0.5, -0.8, -0.1,
        ];
        let types = [2, 3, 3, 6, 6, 1, 1, 1, 1, 1, 1, 1, 1];
        let mut m = Metadata::new();
        m.insert("tokenizer.ggml.model", Value::String("llama".into()));
        m.insert(
            "tokenizer.ggml.tokens",
            Value::Array(Array::String(
                tokens.iter().map(|s| s.to_string()).collect(),
            )),
        );
        m.insert(
            "tokenizer.ggml.scores",
            Value::Array(Array::F32(scores.to_vec())),
        );
        m.insert(
            "tokenizer.ggml.token_type",
            Value::Array(Array::I32(types.to_vec())),
        );
        Vocab::from_gguf(&m).unwrap()
    }

    fn ids(text: &str) -> Vec<u32> {
        let mut out = Vec::new();
        encode(&vocab(), text, &mut out);
        out
    }

    #[test]
    fn highest_score_merges_first() {
        // "▁a"(-0.5) beats "ab"(-1.0) and "bc"(-0.8); then "b"+"c" → "bc"; then
        // "▁a"+"bc" → "▁abc".
        assert_eq!(ids("▁abc"), vec![12]);
        // Without "c": "▁a" + "b" is no token, so they stay apart.
        assert_eq!(ids("▁ab"), vec![10, 7]);
        // Without the leading ▁: "ab" merges.
        assert_eq!(ids("ab"), vec![9]);
    }

    #[test]
    fn unknown_characters_fall_back_to_bytes() {
        // "é" = C3 A9 has byte tokens; "ü" = C3 BC has only its first byte: the missing
        // byte is dropped (llama.cpp throws there; a malformed vocab must not stop us).
        assert_eq!(ids("aé"), vec![6, 3, 4]);
        assert_eq!(ids("ü"), vec![3]);
        assert!(ids("").is_empty());
    }
}
