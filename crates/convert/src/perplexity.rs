//! Perplexity over a text in chunks, and KL divergence of a model against saved base logits
//! (llama.cpp's `llama-perplexity`, `--kl-divergence-base` / `--kl-divergence`).
//!
//! As llama.cpp does: the text is split into chunks of `n_ctx` tokens; each chunk is evaluated
//! from an empty cache (its first token replaced by BOS when the model adds one) and only the
//! second half of its positions is scored, so every scored token has at least n_ctx/2 of context.
//!
//! Base logits file (ours, little-endian): magic `RLKLD001`, u32 n_vocab, u32 n_ctx, u32 n_chunks,
//! u32 n_tokens + the token ids, then for every scored position its log-softmax over the
//! vocabulary as f16 ([n_chunks * (n_ctx - 1 - n_ctx/2), n_vocab]); f16 keeps the file half the
//! size of f32 and errs by < 1e-2 nats only on tokens of negligible probability.

use std::io::{Read, Write};

use model::{KvType, Model};

use crate::error::ConvertError;

pub const KLD_MAGIC: &[u8; 8] = b"RLKLD001";

/// log-softmax of one row of logits, in f64 for the sums.
pub fn log_softmax(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
    let lse = max as f64 + sum.ln();
    logits.iter().map(|&l| (l as f64 - lse) as f32).collect()
}

/// KL(base || model) in nats, from two log-softmax rows.
pub fn kl_divergence(base_logp: &[f32], logp: &[f32]) -> f64 {
    base_logp
        .iter()
        .zip(logp)
        .map(|(&b, &q)| (b as f64).exp() * (b as f64 - q as f64))
        .sum::<f64>()
        .max(0.0)
}

fn argmax(x: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best
}

/// Running totals of a perplexity / KL run.
#[derive(Debug, Clone, Default)]
pub struct Scores {
    pub n_scored: u64,
    /// Sum of -log p(next token) in nats.
    pub nll: f64,
    pub nll_sq: f64,
    /// Against base logits: sum of KL, and positions whose argmax matches.
    pub kl: f64,
    pub kl_sq: f64,
    pub top1_same: u64,
    pub n_kl: u64,
    pub chunk_ppl: Vec<f64>,
}

impl Scores {
    pub fn perplexity(&self) -> f64 {
        (self.nll / self.n_scored.max(1) as f64).exp()
    }

    /// Standard error of the perplexity estimate (delta method on the mean NLL).
    pub fn perplexity_stderr(&self) -> f64 {
        let n = self.n_scored.max(2) as f64;
        let mean = self.nll / n;
        let var = (self.nll_sq / n - mean * mean).max(0.0) * n / (n - 1.0);
        self.perplexity() * (var / n).sqrt()
    }

    pub fn mean_kl(&self) -> f64 {
        self.kl / self.n_kl.max(1) as f64
    }

    pub fn top1_agreement(&self) -> f64 {
        self.top1_same as f64 / self.n_kl.max(1) as f64
    }
}

/// What to do with the logits besides perplexity.
pub enum KlMode<'a> {
    None,
    /// Write the base model's log-probabilities.
    SaveBase(&'a mut dyn Write),
    /// Read base log-probabilities (written by `SaveBase` on the same text and n_ctx).
    Compare(&'a mut dyn Read),
}

/// Scores one evaluated chunk. logits: [n_ctx, n_vocab]; tokens: the chunk's n_ctx tokens.
pub fn score_chunk(
    logits: &[f32],
    tokens: &[u32],
    n_vocab: usize,
    kl: &mut KlMode,
    scores: &mut Scores,
) -> Result<(), ConvertError> {
    let n_ctx = tokens.len();
    let first = n_ctx / 2;
    let mut chunk_nll = 0.0;
    let mut base = vec![0u8; n_vocab * 2];
    for j in first..n_ctx.saturating_sub(1) {
        let logp = log_softmax(&logits[j * n_vocab..(j + 1) * n_vocab]);
        let next = tokens[j + 1] as usize;
        let nll = -(*logp.get(next).ok_or_else(|| {
            ConvertError::Input(format!("token {next} outside the vocabulary of {n_vocab}"))
        })? as f64);
        chunk_nll += nll;
        scores.nll += nll;
        scores.nll_sq += nll * nll;
        scores.n_scored += 1;
        match kl {
            KlMode::None => {}
            KlMode::SaveBase(w) => {
                for (b, &v) in base.chunks_exact_mut(2).zip(&logp) {
                    b.copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
                }
                w.write_all(&base)
                    .map_err(|e| ConvertError::io("kl-divergence base", e))?;
            }
            KlMode::Compare(r) => {
                r.read_exact(&mut base).map_err(|e| {
                    ConvertError::Input(format!("kl-divergence base ends early: {e}"))
                })?;
                let b: Vec<f32> = base
                    .chunks_exact(2)
                    .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                    .collect();
                let d = kl_divergence(&b, &logp);
                scores.kl += d;
                scores.kl_sq += d * d;
                scores.n_kl += 1;
                if argmax(&b) == argmax(&logp) {
                    scores.top1_same += 1;
                }
            }
        }
    }
    let n = (n_ctx.saturating_sub(1) - first).max(1) as f64;
    scores.chunk_ppl.push((chunk_nll / n).exp());
    Ok(())
}

fn header(n_vocab: usize, n_ctx: usize, chunks: &[Vec<u32>]) -> Vec<u8> {
    let mut h = KLD_MAGIC.to_vec();
    for v in [n_vocab, n_ctx, chunks.len(), chunks.len() * n_ctx] {
        h.extend_from_slice(&(v as u32).to_le_bytes());
    }
    for t in chunks.iter().flatten() {
        h.extend_from_slice(&t.to_le_bytes());
    }
    h
}

/// Splits `tokens` into whole chunks of `n_ctx` (at most `max_chunks`), first token -> `bos`.
pub fn make_chunks(
    tokens: &[u32],
    n_ctx: usize,
    max_chunks: Option<usize>,
    bos: Option<u32>,
) -> Vec<Vec<u32>> {
    let mut chunks: Vec<Vec<u32>> = tokens
        .chunks_exact(n_ctx.max(2))
        .take(max_chunks.unwrap_or(usize::MAX))
        .map(|c| c.to_vec())
        .collect();
    if let Some(b) = bos {
        chunks.iter_mut().for_each(|c| c[0] = b);
    }
    chunks
}

/// Evaluates `chunks` (each n_ctx tokens) with `model`; `progress(chunk, n_chunks, scores)`.
pub fn evaluate(
    model: &Model,
    chunks: &[Vec<u32>],
    mut kl: KlMode,
    progress: &mut dyn FnMut(usize, usize, &Scores),
) -> Result<Scores, ConvertError> {
    let n_vocab = model.config().n_vocab;
    let n_ctx = chunks.first().map_or(0, |c| c.len());
    if n_ctx < 2 {
        return Err(ConvertError::Input(
            "the text has fewer tokens than one chunk (-c)".into(),
        ));
    }
    let h = header(n_vocab, n_ctx, chunks);
    match &mut kl {
        KlMode::None => {}
        KlMode::SaveBase(w) => w
            .write_all(&h)
            .map_err(|e| ConvertError::io("kl-divergence base", e))?,
        KlMode::Compare(r) => {
            let mut theirs = vec![0u8; h.len()];
            r.read_exact(&mut theirs)
                .map_err(|e| ConvertError::Input(format!("kl-divergence base: {e}")))?;
            if theirs[..8] != KLD_MAGIC[..] {
                return Err(ConvertError::Input(
                    "kl-divergence base: not a redline base-logits file".into(),
                ));
            }
            if theirs != h {
                return Err(ConvertError::Input(
                    "kl-divergence base was made with another text, -c, chunk count or vocabulary"
                        .into(),
                ));
            }
        }
    }
    let mut scores = Scores::default();
    for (i, chunk) in chunks.iter().enumerate() {
        let mut state = model.new_state(n_ctx, KvType::F32)?;
        let logits = model.forward(&mut state, chunk, true)?;
        score_chunk(&logits, chunk, n_vocab, &mut kl, &mut scores)?;
        progress(i + 1, chunks.len(), &scores);
    }
    Ok(scores)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_softmax_and_kl_by_hand() {
        let l = log_softmax(&[0.0, (2.0f32).ln(), (5.0f32).ln()]);
        // softmax = [1/8, 2/8, 5/8]
        assert!((l[0] - (0.125f32).ln()).abs() < 1e-6);
        assert!((l[2] - (0.625f32).ln()).abs() < 1e-6);
        assert_eq!(kl_divergence(&l, &l), 0.0);
        let q = log_softmax(&[0.0, 0.0, 0.0]);
        // KL(p || uniform) = sum p ln(p) + ln 3
        let p = [0.125f64, 0.25, 0.625];
        let want: f64 = p.iter().map(|p| p * p.ln()).sum::<f64>() + 3f64.ln();
        assert!((kl_divergence(&l, &q) - want).abs() < 1e-6);
    }

    #[test]
    fn scores_only_the_second_half() {
        // 4 tokens, vocab 2; uniform logits: each scored position costs ln 2.
        let logits = vec![0.0; 8];
        let mut s = Scores::default();
        score_chunk(&logits, &[0, 1, 0, 1], 2, &mut KlMode::None, &mut s).unwrap();
        // first = 2: position 2 predicts token 3 only.
        assert_eq!(s.n_scored, 1);
        assert!((s.perplexity() - 2.0).abs() < 1e-6);
        assert!(score_chunk(&logits, &[0, 1, 0, 7], 2, &mut KlMode::None, &mut s).is_err());
    }

    #[test]
    fn chunks_take_bos() {
        let c = make_chunks(&[5, 6, 7, 8, 9], 2, None, Some(1));
        assert_eq!(c, vec![vec![1, 6], vec![1, 8]]);
        assert_eq!(make_chunks(&[5, 6, 7, 8], 2, Some(1), None).len(), 1);
    }
}
