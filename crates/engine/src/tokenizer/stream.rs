//! Streaming detokenization: token pieces are bytes, and a UTF-8 character can span several
//! tokens (byte-fallback `<0xE2><0x82><0xAC>`, or byte-level BPE pieces), so text is emitted
//! only up to the last complete character and the rest waits for the next token.

use super::Tokenizer;

pub struct StreamDecoder {
    tokenizer: Tokenizer,
    /// Bytes of an incomplete UTF-8 character (at most 3).
    pending: Vec<u8>,
    special: bool,
}

impl StreamDecoder {
    /// Control tokens (`<|im_end|>`) are not written out; see [`StreamDecoder::with_special`].
    pub fn new(tokenizer: &Tokenizer) -> StreamDecoder {
        StreamDecoder {
            tokenizer: tokenizer.clone(),
            pending: Vec::new(),
            special: false,
        }
    }

    /// Whether control tokens are written out as their text.
    pub fn with_special(mut self, special: bool) -> StreamDecoder {
        self.special = special;
        self
    }

    /// Adds one token; returns the text that is now complete (possibly empty).
    pub fn push(&mut self, id: u32) -> String {
        let piece = self.tokenizer.piece(id, self.special);
        self.pending.extend_from_slice(&piece);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    out.push_str(std::str::from_utf8(&self.pending[..valid]).unwrap_or_default());
                    match e.error_len() {
                        // Incomplete character at the end: keep it for the next token.
                        None => {
                            self.pending.drain(..valid);
                            return out;
                        }
                        // Bytes that can never start a character: replace and go on.
                        Some(n) => {
                            out.push('\u{FFFD}');
                            self.pending.drain(..valid + n);
                        }
                    }
                }
            }
        }
    }

    /// Whatever is left (an incomplete character at the end of the stream) as U+FFFD.
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }

    /// Bytes held back waiting for the rest of a character.
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }
}
