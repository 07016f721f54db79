//! engine
pub mod scheduler;

pub mod generate;
pub mod sampler;
pub mod speculative;
pub mod stop;

pub mod tokenizer;
pub use tokenizer::{StreamDecoder, Tokenizer, TokenizerError};
pub mod chat_template;
pub use chat_template::{ChatTemplate, TemplateError};
pub mod constrained;
pub use constrained::{Constraint, ConstraintError, ConstraintVocab};
pub mod tool_calls;
