//! Turns a stream of token byte pieces into text that is safe to send: whole UTF-8
//! characters only, and nothing that might turn out to be the start of a stop sequence.

/// Result of pushing one token's bytes.
#[derive(Debug, Default, PartialEq)]
pub struct Pushed {
    /// Text that may be sent now.
    pub text: String,
    /// A stop sequence was found; `text` ends right before it and generation should end.
    pub stopped: bool,
}

pub struct TextStream {
    stops: Vec<String>,
    /// Bytes of an incomplete UTF-8 character.
    partial: Vec<u8>,
    /// Decoded text held back because it could begin a stop sequence.
    held: String,
    stopped: bool,
}

impl TextStream {
    /// Empty stop strings are ignored.
    pub fn new(stops: Vec<String>) -> TextStream {
        let stops = stops.into_iter().filter(|s| !s.is_empty()).collect();
        TextStream {
            stops,
            partial: Vec::new(),
            held: String::new(),
            stopped: false,
        }
    }

    pub fn push(&mut self, piece: &[u8]) -> Pushed {
        if self.stopped {
            return Pushed {
                text: String::new(),
                stopped: true,
            };
        }
        self.partial.extend_from_slice(piece);
        let decoded = take_complete_utf8(&mut self.partial);
        self.held.push_str(&decoded);

        if let Some(at) = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min()
        {
            self.stopped = true;
            let text = self.held[..at].to_string();
            self.held.clear();
            self.partial.clear();
            return Pushed {
                text,
                stopped: true,
            };
        }
        // Hold back the longest tail that is a proper prefix of some stop string.
        let keep = self
            .stops
            .iter()
            .map(|s| longest_suffix_prefix(&self.held, s))
            .max()
            .unwrap_or(0);
        let cut = self.held.len() - keep;
        let text = self.held[..cut].to_string();
        self.held.drain(..cut);
        Pushed {
            text,
            stopped: false,
        }
    }

    /// Flushes whatever is held back (generation ended without a stop sequence).
    pub fn finish(&mut self) -> String {
        if self.stopped {
            return String::new();
        }
        let mut text = std::mem::take(&mut self.held);
        text.push_str(&String::from_utf8_lossy(&std::mem::take(&mut self.partial)));
        text
    }
}

/// Removes and returns the longest decodable prefix of `bytes`; invalid bytes become U+FFFD,
/// an incomplete trailing character stays in `bytes`.
fn take_complete_utf8(bytes: &mut Vec<u8>) -> String {
    let mut out = String::new();
    let mut rest: &[u8] = bytes;
    loop {
        match std::str::from_utf8(rest) {
            Ok(s) => {
                out.push_str(s);
                rest = &[];
                break;
            }
            Err(e) => {
                let (good, after) = rest.split_at(e.valid_up_to());
                // SAFETY-free: `good` was just validated by from_utf8.
                out.push_str(std::str::from_utf8(good).unwrap_or_default());
                match e.error_len() {
                    Some(n) => {
                        out.push(char::REPLACEMENT_CHARACTER);
                        rest = &after[n..];
                    }
                    None => {
                        rest = after; // incomplete character at the end: wait for more
                        break;
                    }
                }
            }
        }
    }
    let keep = rest.to_vec();
    *bytes = keep;
    out
}

/// Length (bytes) of the longest suffix of `text` that is a proper prefix of `stop`,
/// on a character boundary of `text`.
pub(crate) fn longest_suffix_prefix(text: &str, stop: &str) -> usize {
    let max = (stop.len() - 1).min(text.len());
    (1..=max)
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len() - n)
                && stop
                    .as_bytes()
                    .starts_with(&text.as_bytes()[text.len() - n..])
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&[u8]]) -> (String, bool) {
        let mut s = TextStream::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for p in pieces {
            let r = s.push(p);
            out.push_str(&r.text);
            if r.stopped {
                return (out, true);
            }
        }
        out.push_str(&s.finish());
        (out, false)
    }

    #[test]
    fn utf8_split_across_tokens_is_joined() {
        let snow = "☃".as_bytes(); // 3 bytes
        let mut s = TextStream::new(vec![]);
        assert_eq!(s.push(&snow[..1]).text, "");
        assert_eq!(s.push(&snow[1..2]).text, "");
        assert_eq!(s.push(&snow[2..]).text, "☃");
        assert_eq!(
            run(&[], &[b"a\xff", b"b"]),
            ("a\u{fffd}b".to_string(), false)
        );
        assert_eq!(
            run(&[], &[b"x", &snow[..2]]),
            ("x\u{fffd}".to_string(), false)
        );
    }

    #[test]
    fn stop_sequence_spanning_tokens_is_cut_and_never_sent() {
        assert_eq!(
            run(&["END"], &[b"hello E", b"N", b"D more"]),
            ("hello ".into(), true)
        );
        assert_eq!(
            run(&["\n\n", "User:"], &[b"a\n", b"b Us", b"er: x"]),
            ("a\nb ".into(), true)
        );
        // A held-back partial match that does not complete is released.
        assert_eq!(run(&["END"], &[b"the EN", b"d"]), ("the ENd".into(), false));
        assert_eq!(run(&["END"], &[b"the EN"]), ("the EN".into(), false));
        assert_eq!(run(&[""], &[b"abc"]), ("abc".into(), false));
    }

    #[test]
    fn held_text_is_not_sent_early() {
        let mut s = TextStream::new(vec!["STOP".into()]);
        assert_eq!(s.push(b"go ST").text, "go ");
        assert_eq!(s.push(b"O").text, "");
        assert_eq!(s.push(b"x").text, "STOx");
    }

    #[test]
    fn suffix_prefix_respects_char_boundaries() {
        assert_eq!(longest_suffix_prefix("aé", "éz"), 2);
        assert_eq!(longest_suffix_prefix("abc", "bcd"), 2);
        assert_eq!(longest_suffix_prefix("abc", "x"), 0);
    }
}
