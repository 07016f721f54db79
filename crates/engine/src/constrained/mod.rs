//! Constrained decoding for `response_format`: output that always parses as JSON and, for
//! `json_schema`, validates against the schema.
//!
//! The grammar work is done by llguidance (Earley parser over a lexer compiled from the JSON
//! schema); we give it a token trie built from our own vocabulary (`Tokenizer::piece`), so the
//! mask is exact: a token is allowed iff its bytes keep the output a prefix of some valid
//! document. Once the document is complete only end-of-generation tokens stay allowed.
//!
//! Use: build a [`ConstraintVocab`] once per model (the trie costs ~O(n_vocab)), then one
//! [`Constraint`] per request; per step call [`Constraint::mask_logits`] before sampling and
//! [`Constraint::accept`] with the sampled token.

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{SimpleVob, TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;

use crate::scheduler::TokenConstraint;
use crate::Tokenizer;

#[derive(Debug, thiserror::Error)]
pub enum ConstraintError {
    /// The schema uses a feature the grammar compiler does not support, or is not a schema.
    #[error("unsupported JSON schema: {0}")]
    UnsupportedSchema(String),
    /// The vocabulary cannot be turned into a token trie (e.g. empty vocabulary).
    #[error("constraint vocabulary: {0}")]
    Vocab(String),
    /// `accept` got a token the mask forbids (or the constraint already failed).
    #[error("token {token} rejected by the constraint: {reason}")]
    Rejected { token: u32, reason: String },
}

/// Our tokenizer as llguidance sees it: a trie of every token's bytes.
struct TrieEnv {
    trie: TokTrie,
}

impl TokenizerEnv for TrieEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    // Greedy longest match over the trie. Only used by llguidance for forced text inside a
    // grammar; our SentencePiece encoder would add a dummy-space prefix mid-output.
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.greedy_tokenize(s)
    }
}

/// The per-model part of constrained decoding (token trie + grammar factory); cheap to share.
#[derive(Clone)]
pub struct ConstraintVocab {
    factory: Arc<ParserFactory>,
    n_vocab: usize,
}

impl ConstraintVocab {
    pub fn new(tok: &Tokenizer) -> Result<ConstraintVocab, ConstraintError> {
        let n_vocab = tok.n_vocab();
        if n_vocab == 0 {
            return Err(ConstraintError::Vocab("empty vocabulary".into()));
        }
        // Tokens with text are their decoded bytes (byte-fallback and byte-level already
        // undone, SPM '▁' already a space). Control tokens (empty text) are marked special
        // (0xFF + name) so the grammar never produces them as text.
        let words: Vec<Vec<u8>> = (0..n_vocab as u32)
            .map(|id| {
                let piece = tok.piece(id, false);
                if piece.is_empty() {
                    let mut special = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    special.extend(tok.piece(id, true));
                    special
                } else {
                    piece
                }
            })
            .collect();
        let eog: Vec<u32> = tok
            .eog_ids()
            .filter(|&id| (id as usize) < n_vocab)
            .collect();
        let eos = tok
            .eos()
            .filter(|&id| (id as usize) < n_vocab)
            .or_else(|| eog.first().copied())
            .ok_or_else(|| ConstraintError::Vocab("no end-of-generation token".into()))?;
        let mut trie = TokTrie::from(&TokRxInfo::new(n_vocab as u32, eos), &words);
        if !eog.is_empty() {
            trie = trie.with_eos_tokens(&eog);
        }
        let env: TokEnv = Arc::new(TrieEnv { trie });
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| ConstraintError::Vocab(e.to_string()))?;
        factory.quiet();
        Ok(ConstraintVocab {
            factory: Arc::new(factory),
            n_vocab,
        })
    }

    /// Any JSON object (`response_format: {"type": "json_object"}`).
    pub fn json_object(&self) -> Result<Constraint, ConstraintError> {
        self.json_schema(&serde_json::json!({"type": "object"}))
    }

    /// Output valid against `schema` (`response_format: {"type": "json_schema", ...}`).
    pub fn json_schema(&self, schema: &Value) -> Result<Constraint, ConstraintError> {
        let mut schema = match schema {
            Value::Bool(true) => serde_json::json!({}),
            Value::Object(_) => schema.clone(),
            other => {
                return Err(ConstraintError::UnsupportedSchema(format!(
                    "a schema must be an object, got {other}"
                )))
            }
        };
        // Fixed separators and no free whitespace: a model otherwise may wander off into
        // endless blank lines, which are valid JSON whitespace. The output is still JSON.
        if let Some(obj) = schema.as_object_mut() {
            obj.entry("x-guidance").or_insert_with(|| {
                serde_json::json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "})
            });
        }
        let grammar = TopLevelGrammar::from_json_schema(schema);
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| ConstraintError::UnsupportedSchema(e.to_string()))?;
        let mut matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(ConstraintError::UnsupportedSchema(e));
        }
        let complete = matcher.is_accepting().unwrap_or(false);
        Ok(Constraint {
            matcher,
            n_vocab: self.n_vocab,
            complete,
            mask: None,
        })
    }
}

/// One request's constraint state.
pub struct Constraint {
    matcher: Matcher,
    n_vocab: usize,
    /// The output so far is a complete document (end-of-generation is allowed).
    complete: bool,
    /// The mask of the current state (computing one walks the whole token trie, so
    /// `mask_logits` + `accept` of the same step share it); None after each accept.
    mask: Option<SimpleVob>,
}

impl Constraint {
    /// Any JSON object. Builds the vocabulary trie; prefer [`ConstraintVocab`] per model.
    pub fn json_object(tok: &Tokenizer) -> Result<Constraint, ConstraintError> {
        ConstraintVocab::new(tok)?.json_object()
    }

    /// Output valid against `schema`. Builds the vocabulary trie; prefer [`ConstraintVocab`].
    pub fn json_schema(tok: &Tokenizer, schema: &Value) -> Result<Constraint, ConstraintError> {
        ConstraintVocab::new(tok)?.json_schema(schema)
    }

    /// The current state's mask, computed once per step; None if the constraint failed.
    fn current_mask(&mut self) -> Option<&SimpleVob> {
        if self.mask.is_none() {
            // A stopped matcher (document complete) allows exactly the end-of-generation tokens.
            self.mask = self.matcher.compute_mask_or_eos().ok();
        }
        self.mask.as_ref()
    }

    /// Allowed next tokens as a bitmap over the vocabulary (`allowed[id]`). All false if the
    /// constraint is in an error state.
    pub fn allowed_tokens(&mut self) -> Vec<bool> {
        let n_vocab = self.n_vocab;
        match self.current_mask() {
            Some(mask) => (0..n_vocab)
                .map(|id| mask.is_allowed(id as TokenId))
                .collect(),
            None => vec![false; n_vocab],
        }
    }

    /// Sets the logits of forbidden tokens to -inf. `logits`: [n_vocab] (extra entries beyond
    /// the tokenizer's vocabulary, e.g. padded output rows, are always forbidden).
    pub fn mask_logits(&mut self, logits: &mut [f32]) {
        let n_vocab = self.n_vocab;
        match self.current_mask() {
            Some(mask) => {
                for (id, l) in logits.iter_mut().enumerate() {
                    if id >= n_vocab || !mask.is_allowed(id as TokenId) {
                        *l = f32::NEG_INFINITY;
                    }
                }
            }
            None => logits.fill(f32::NEG_INFINITY),
        }
    }

    /// Advances on the sampled token. A forbidden token is an error and leaves the
    /// constraint failed (every later mask is empty).
    pub fn accept(&mut self, token: u32) -> Result<(), ConstraintError> {
        let rejected = |reason: &str| ConstraintError::Rejected {
            token,
            reason: reason.to_string(),
        };
        if token as usize >= self.n_vocab {
            return Err(rejected("outside the vocabulary"));
        }
        // consume_token trusts the caller; check the mask so a bad token cannot slip by.
        let allowed = match self.current_mask() {
            Some(mask) => mask.is_allowed(token),
            None => return Err(rejected("the constraint already failed")),
        };
        if !allowed {
            return Err(rejected("not allowed here"));
        }
        if self.matcher.is_stopped() {
            // Complete document: the allowed (end-of-generation) token changes nothing.
            return Ok(());
        }
        self.mask = None;
        self.matcher
            .consume_token(token)
            .map_err(|e| rejected(&e.to_string()))?;
        self.complete = self.matcher.is_accepting().unwrap_or(false);
        Ok(())
    }

    /// True once the output is a complete, valid document (end-of-generation allowed).
    pub fn is_complete(&self) -> bool {
        self.complete
    }

    /// True once nothing more may be generated (an end token was accepted, or failure).
    pub fn is_stopped(&self) -> bool {
        self.matcher.is_stopped()
    }
}

/// The scheduler's hook: `commit` reports rejection instead of erroring.
impl TokenConstraint for Constraint {
    fn mask(&mut self, logits: &mut [f32]) {
        self.mask_logits(logits);
    }

    fn commit(&mut self, token: u32) -> bool {
        self.accept(token).is_ok()
    }

    fn is_finished(&self) -> bool {
        self.matcher.is_stopped()
    }
}
