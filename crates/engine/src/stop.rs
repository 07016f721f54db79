//! Stop strings over streamed text.
//!
//! Text arrives in pieces (one token's worth at a time). A stop string may straddle pieces, so
//! the matcher holds back the longest tail of the pending text that could still grow into a
//! stop string, and releases it once it cannot. When a stop string appears, the text before it
//! is released and generation ends; the stop string itself is never emitted.

/// Incremental stop-string matcher.
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// Text received but not yet released (a possible stop-string prefix).
    pending: String,
    stopped: Option<usize>,
}

/// What one [`StopMatcher::push`] released.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopOutput {
    /// Text that is safe to show now.
    pub text: String,
    /// Index (into the stop list) of the stop string that was found, if one was.
    pub stop: Option<usize>,
}

impl StopMatcher {
    /// Empty stop strings are ignored.
    pub fn new(stops: impl IntoIterator<Item = impl Into<String>>) -> StopMatcher {
        StopMatcher {
            stops: stops
                .into_iter()
                .map(Into::into)
                .filter(|s: &String| !s.is_empty())
                .collect(),
            pending: String::new(),
            stopped: None,
        }
    }

    pub fn stops(&self) -> &[String] {
        &self.stops
    }

    /// Index of the stop string already matched, if any.
    pub fn stopped(&self) -> Option<usize> {
        self.stopped
    }

    /// Adds `piece` and returns what can be released. After a stop string was found every
    /// further push releases nothing.
    pub fn push(&mut self, piece: &str) -> StopOutput {
        if let Some(i) = self.stopped {
            return StopOutput {
                text: String::new(),
                stop: Some(i),
            };
        }
        self.pending.push_str(piece);
        // Earliest occurrence of any stop string wins (ties: the longer string, then list order).
        let mut hit: Option<(usize, usize)> = None; // (byte position, stop index)
        for (i, s) in self.stops.iter().enumerate() {
            if let Some(pos) = self.pending.find(s.as_str()) {
                let better = match hit {
                    None => true,
                    Some((p, j)) => pos < p || (pos == p && s.len() > self.stops[j].len()),
                };
                if better {
                    hit = Some((pos, i));
                }
            }
        }
        if let Some((pos, i)) = hit {
            self.stopped = Some(i);
            let text = self.pending[..pos].to_owned();
            self.pending.clear();
            return StopOutput {
                text,
                stop: Some(i),
            };
        }
        let hold = self.held_tail_len();
        let cut = self.pending.len() - hold;
        let text = self.pending[..cut].to_owned();
        self.pending.drain(..cut);
        StopOutput { text, stop: None }
    }

    /// Releases whatever is still held (the stream ended without a stop string).
    pub fn finish(&mut self) -> String {
        if self.stopped.is_some() {
            return String::new();
        }
        std::mem::take(&mut self.pending)
    }

    /// Length in bytes of the longest suffix of `pending` that is a proper prefix of some stop
    /// string (always on a char boundary, since stop strings are valid UTF-8).
    fn held_tail_len(&self) -> usize {
        let p = self.pending.as_str();
        let mut best = 0;
        for s in &self.stops {
            let max = (s.len() - 1).min(p.len());
            for len in (best + 1..=max).rev() {
                let start = p.len() - len;
                if p.is_char_boundary(start) && s.as_bytes().starts_with(&p.as_bytes()[start..]) {
                    best = len;
                    break;
                }
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds pieces, returns (all released text, stop index).
    fn feed(stops: &[&str], pieces: &[&str]) -> (String, Option<usize>) {
        let mut m = StopMatcher::new(stops.iter().copied());
        let mut out = String::new();
        for p in pieces {
            let o = m.push(p);
            out.push_str(&o.text);
            if o.stop.is_some() {
                return (out, o.stop);
            }
        }
        out.push_str(&m.finish());
        (out, None)
    }

    #[test]
    fn no_stops_passes_through_immediately() {
        let mut m = StopMatcher::new(Vec::<String>::new());
        assert_eq!(m.push("abc").text, "abc");
        assert_eq!(m.finish(), "");
    }

    #[test]
    fn stop_inside_one_piece() {
        assert_eq!(
            feed(&["END"], &["hello END world"]),
            ("hello ".into(), Some(0))
        );
    }

    #[test]
    fn stop_split_across_pieces_is_never_shown() {
        let mut m = StopMatcher::new(["</s>"]);
        assert_eq!(m.push("hi <").text, "hi ");
        assert_eq!(m.push("/").text, "");
        let o = m.push("s> tail");
        assert_eq!(o.text, "");
        assert_eq!(o.stop, Some(0));
        assert_eq!(m.push("more").text, "");
    }

    #[test]
    fn held_text_is_released_when_it_cannot_be_a_stop() {
        let mut m = StopMatcher::new(["</s>"]);
        assert_eq!(m.push("a </").text, "a ");
        assert_eq!(m.push("x").text, "</x");
        assert_eq!(m.push(" <").text, " ");
        assert_eq!(m.finish(), "<");
    }

    #[test]
    fn earliest_stop_wins() {
        assert_eq!(
            feed(&["world", "lo"], &["hello world"]),
            ("hel".into(), Some(1))
        );
        assert_eq!(feed(&["ab", "abc"], &["xx", "abc"]), ("xx".into(), Some(1)));
    }

    #[test]
    fn multibyte_text_and_stops() {
        assert_eq!(
            feed(&["éé"], &["caf", "é", "!", "é", "é"]),
            ("café!".into(), Some(0))
        );
        assert_eq!(feed(&["→x"], &["a→", "b"]), ("a→b".into(), None));
    }

    #[test]
    fn empty_stop_is_ignored() {
        assert_eq!(feed(&[""], &["abc"]), ("abc".into(), None));
    }
}
