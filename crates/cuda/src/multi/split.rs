//! Which card each layer, and so each weight tensor, KV cache and recurrent state, lives on in a
//! layer split.
//!
//! The model is `n_layer + 1` positions: the repeating layers `0..n_layer`, then the output
//! layer (`output_norm` + `output`). Each position has a card; cards only ever increase along
//! the positions (llama.cpp's `--split-mode layer` cuts them into consecutive runs, see
//! `model::plan::split::layer_cards`), so the hidden state walks the cards in order and
//! crosses once per boundary. The token-embedding table sits on the card of layer 0 (the
//! embedding runs where the first layer is); when the output is tied to it (no
//! `output.weight`) and the output layer is on another card, the table is loaded there too.
//! Tensors that are neither per-layer nor output nor embedding (e.g. `rope_freqs.weight`, read
//! by every layer) are loaded on every card that holds a position.

use std::fmt;

use crate::hybrid::placement::block_index;

/// The layer → card map of one model over `n_cards` cards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerSplit {
    n_layer: usize,
    n_cards: usize,
    /// Card of each position; `cards[n_layer]` is the output layer's.
    cards: Vec<usize>,
}

/// Where a weight tensor is loaded: the cards holding a copy, the first one for the
/// embedding lookup, the last one for everything else.
pub type WeightCards = Vec<usize>;

impl LayerSplit {
    /// `cards[il]` for each of the `n_layer + 1` positions. `None` unless there are exactly
    /// `n_layer + 1` entries, each `< n_cards`, never decreasing.
    pub fn new(n_layer: usize, n_cards: usize, cards: Vec<usize>) -> Option<LayerSplit> {
        let ok = cards.len() == n_layer + 1
            && cards.iter().all(|&c| c < n_cards)
            && cards.windows(2).all(|w| w[0] <= w[1]);
        ok.then_some(LayerSplit {
            n_layer,
            n_cards,
            cards,
        })
    }

    /// `counts[d]` consecutive positions on card `d` (they must add up to `n_layer + 1`).
    pub fn from_counts(n_layer: usize, counts: &[usize]) -> Option<LayerSplit> {
        let cards: Vec<usize> = counts
            .iter()
            .enumerate()
            .flat_map(|(d, &n)| std::iter::repeat_n(d, n))
            .collect();
        LayerSplit::new(n_layer, counts.len(), cards)
    }

    /// Everything on card 0 of `n_cards` (a one-card run through the multi backend).
    pub fn single(n_layer: usize, n_cards: usize) -> LayerSplit {
        LayerSplit {
            n_layer,
            n_cards: n_cards.max(1),
            cards: vec![0; n_layer + 1],
        }
    }

    pub fn n_layer(&self) -> usize {
        self.n_layer
    }

    pub fn n_cards(&self) -> usize {
        self.n_cards
    }

    /// The card of repeating layer `il`; blocks past `n_layer` (MTP) go with the output.
    pub fn layer_card(&self, il: usize) -> usize {
        self.cards[il.min(self.n_layer)]
    }

    /// The output layer's card (final norm, head, logits).
    pub fn output_card(&self) -> usize {
        self.cards[self.n_layer]
    }

    /// The card the token embedding runs on: layer 0's.
    pub fn input_card(&self) -> usize {
        self.cards[0]
    }

    /// Cards holding at least one position, in order.
    pub fn active_cards(&self) -> Vec<usize> {
        let mut v = self.cards.clone();
        v.dedup();
        v
    }

    /// Positions per card ("offloaded X/Y layers to GPU d"); the total is `n_layer + 1`.
    pub fn positions(&self) -> Vec<usize> {
        let mut v = vec![0; self.n_cards];
        for &c in &self.cards {
            v[c] += 1;
        }
        v
    }

    /// Hidden-state crossings per forward pass: card changes along the positions.
    pub fn boundaries(&self) -> usize {
        self.active_cards().len().saturating_sub(1)
    }

    /// Where the weight `name` is loaded (see the module notes). `file_has_output`: the file
    /// has `output.weight`.
    pub fn weight_cards(&self, name: &str, file_has_output: bool) -> WeightCards {
        if let Some(il) = block_index(name) {
            return vec![self.layer_card(il)];
        }
        if name.starts_with("token_embd.") {
            let mut v = vec![self.input_card()];
            if name == "token_embd.weight" && !file_has_output {
                v.push(self.output_card());
                v.dedup();
            }
            return v;
        }
        if name.starts_with("output") {
            return vec![self.output_card()];
        }
        self.active_cards()
    }
}

impl fmt::Display for LayerSplit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for d in self.active_cards() {
            let start = self.cards.iter().position(|&c| c == d).unwrap_or(0);
            let end = self.cards.iter().rposition(|&c| c == d).unwrap_or(0);
            if !first {
                f.write_str(", ")?;
            }
            first = false;
            let end_layer = end.min(self.n_layer.saturating_sub(1));
            if start < self.n_layer {
                write!(f, "card {d}: blk {start}..={end_layer}")?;
                if end == self.n_layer {
                    f.write_str(" + output")?;
                }
            } else {
                write!(f, "card {d}: output")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_positions_and_homes() {
        let s = LayerSplit::from_counts(4, &[3, 2]).unwrap();
        assert_eq!(s.positions(), vec![3, 2]);
        assert_eq!(
            (s.layer_card(2), s.layer_card(3), s.output_card()),
            (0, 1, 1)
        );
        assert_eq!(s.layer_card(7), 1, "MTP blocks go with the output");
        assert_eq!(s.boundaries(), 1);
        assert_eq!(s.weight_cards("blk.3.attn_q.weight", true), vec![1]);
        assert_eq!(s.weight_cards("output_norm.weight", true), vec![1]);
        assert_eq!(s.weight_cards("token_embd.weight", true), vec![0]);
        assert_eq!(s.weight_cards("token_embd.weight", false), vec![0, 1]);
        assert_eq!(s.weight_cards("rope_freqs.weight", true), vec![0, 1]);
        assert_eq!(
            s.to_string(),
            "card 0: blk 0..=2, card 1: blk 3..=3 + output"
        );
        let out_only = LayerSplit::from_counts(2, &[2, 1]).unwrap();
        assert_eq!(out_only.to_string(), "card 0: blk 0..=1, card 1: output");
        assert!(LayerSplit::from_counts(4, &[3, 3]).is_none());
        assert!(LayerSplit::new(2, 2, vec![1, 0, 1]).is_none());
        let one = LayerSplit::single(4, 2);
        assert_eq!((one.boundaries(), one.positions()), (0, vec![5, 0]));
        assert_eq!(one.weight_cards("token_embd.weight", false), vec![0]);
        let skip = LayerSplit::from_counts(2, &[1, 0, 2]).unwrap();
        assert_eq!(skip.active_cards(), vec![0, 2]);
    }
}
