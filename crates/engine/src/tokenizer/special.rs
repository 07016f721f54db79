//! Cutting special tokens out of the text before the BPE / SentencePiece pass
//! (llama.cpp `tokenizer_st_partition`): longest special text first, every occurrence in
//! every remaining text piece, left to right.

use super::vocab::{TokenKind, Vocab};

/// A piece of the input: raw text (byte range) still to tokenize, or a special token id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fragment {
    Text(usize, usize),
    Token(u32),
}

/// Splits `text` at special tokens. User-defined tokens are always split out (as Hugging
/// Face does with added tokens); control and unknown tokens only when `parse_special`.
pub fn partition(vocab: &Vocab, text: &str, parse_special: bool) -> Vec<Fragment> {
    let mut fragments = Vec::new();
    if text.is_empty() {
        return fragments;
    }
    fragments.push(Fragment::Text(0, text.len()));
    for &id in &vocab.special_by_len {
        let tok = &vocab.tokens[id as usize];
        if !parse_special && matches!(tok.kind, TokenKind::Control | TokenKind::Unknown) {
            continue;
        }
        let needle = tok.text.as_str();
        if needle.is_empty() || !fragments.iter().any(|f| matches!(f, Fragment::Text(..))) {
            continue;
        }
        let mut next = Vec::with_capacity(fragments.len());
        for frag in fragments {
            let Fragment::Text(mut a, b) = frag else {
                next.push(frag);
                continue;
            };
            while let Some(pos) = text[a..b].find(needle) {
                let m = a + pos;
                if m > a {
                    next.push(Fragment::Text(a, m));
                }
                next.push(Fragment::Token(id));
                a = m + needle.len();
            }
            if a < b {
                next.push(Fragment::Text(a, b));
            }
        }
        fragments = next;
    }
    fragments
}
