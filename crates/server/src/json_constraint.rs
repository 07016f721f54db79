//! JSON output enforced by constrained decoding: llguidance compiles a JSON schema into a
//! grammar and, before each token, masks every token that could not continue valid output.

use std::sync::Arc;

use engine::scheduler::TokenConstraint;
use engine::Tokenizer;
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;

use crate::error::ApiError;

/// Our tokenizer as llguidance sees it: a trie of every token's bytes.
struct TokenizerView {
    trie: TokTrie,
}

impl TokenizerEnv for TokenizerView {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    // Greedy longest-match over the trie: our SentencePiece encoder would add its dummy
    // space prefix, which is wrong for text in the middle of an output.
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.greedy_tokenize(s)
    }
}

/// Builds constraints for one model's vocabulary (the trie is built once, at load).
pub struct JsonConstraints {
    factory: ParserFactory,
}

impl JsonConstraints {
    pub fn new(tokenizer: Arc<Tokenizer>) -> Result<JsonConstraints, ApiError> {
        let n_vocab = tokenizer.n_vocab();
        // Control tokens (no text) are marked special (0xFF + name), as llguidance expects.
        let words: Vec<Vec<u8>> = (0..n_vocab as u32)
            .map(|id| {
                let piece = tokenizer.piece(id, false);
                if piece.is_empty() {
                    let mut special = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    special.extend(tokenizer.piece(id, true));
                    special
                } else {
                    piece
                }
            })
            .collect();
        let eog: Vec<u32> = tokenizer.eog_ids().collect();
        let eos = tokenizer
            .eos()
            .or_else(|| eog.first().copied())
            .unwrap_or(0);
        let mut trie = TokTrie::from(&TokRxInfo::new(n_vocab as u32, eos), &words);
        if !eog.is_empty() {
            trie = trie.with_eos_tokens(&eog);
        }
        let env: TokEnv = Arc::new(TokenizerView { trie });
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| ApiError::Internal(format!("llguidance: {e}")))?;
        factory.quiet();
        Ok(JsonConstraints { factory })
    }

    /// A constraint for output matching `schema` (any JSON object when `None`).
    pub fn constraint(&self, schema: Option<&Value>) -> Result<Box<dyn TokenConstraint>, ApiError> {
        let mut schema = match schema {
            None => serde_json::json!({"type": "object"}),
            Some(Value::Bool(true)) => serde_json::json!({}),
            Some(s) => s.clone(),
        };
        // Fixed separators and no free whitespace: small models otherwise wander off into
        // endless blank lines that are valid JSON whitespace.
        if let Some(obj) = schema.as_object_mut() {
            obj.entry("x-guidance").or_insert_with(
                || serde_json::json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}),
            );
        }
        let grammar = TopLevelGrammar::from_json_schema(schema);
        let parser = self.factory.create_parser(grammar).map_err(|e| {
            ApiError::invalid_param("response_format", format!("unusable JSON schema: {e}"))
        })?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(ApiError::invalid_param(
                "response_format",
                format!("unusable JSON schema: {e}"),
            ));
        }
        Ok(Box::new(GrammarConstraint { matcher }))
    }
}

struct GrammarConstraint {
    matcher: Matcher,
}

impl TokenConstraint for GrammarConstraint {
    fn mask(&mut self, logits: &mut [f32]) {
        match self.matcher.compute_mask() {
            Ok(allowed) => {
                for (id, l) in logits.iter_mut().enumerate() {
                    if !allowed.is_allowed(id as TokenId) {
                        *l = f32::NEG_INFINITY;
                    }
                }
            }
            // A matcher in error allows nothing; the scheduler reports the dead end.
            Err(_) => logits.fill(f32::NEG_INFINITY),
        }
    }

    fn commit(&mut self, token: u32) -> bool {
        match self.matcher.consume_token(token) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!("constrained decoding rejected token {token}: {e}");
                false
            }
        }
    }

    fn is_finished(&self) -> bool {
        self.matcher.is_stopped()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stories_tokenizer() -> Arc<Tokenizer> {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/stories260K.gguf");
        let file = gguf::GgufFile::open(path).unwrap();
        Arc::new(Tokenizer::from_gguf(file.metadata()).unwrap())
    }

    #[test]
    fn first_token_must_open_an_object() {
        let tok = stories_tokenizer();
        let c = JsonConstraints::new(tok.clone()).unwrap();
        let mut k = c.constraint(None).unwrap();
        let mut logits = vec![0.0f32; tok.n_vocab()];
        k.mask(&mut logits);
        let allowed: Vec<String> = (0..tok.n_vocab())
            .filter(|&i| logits[i].is_finite())
            .map(|i| String::from_utf8_lossy(&tok.piece(i as u32, false)).into_owned())
            .collect();
        assert!(!allowed.is_empty());
        assert!(allowed.iter().all(|p| p.starts_with('{')), "{allowed:?}");
    }
}
