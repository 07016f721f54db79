//! Architectures (llama, qwen2, qwen3, qwen35) written as straight-line code over the
//! `backend` op set, weights loaded in place from GGUF, and per-sequence KV cache and
//! recurrent state.
//!
//! ```no_run
//! use model::{KvType, LoadOptions, Model};
//! let m = Model::load("model.gguf".as_ref(), &LoadOptions::default())?;
//! let mut s = m.new_state(4096, KvType::F16)?;
//! let logits = m.forward(&mut s, &[1, 2, 3], false)?; // [n_vocab]
//! # Ok::<(), model::ModelError>(())
//! ```

pub mod arch;
pub mod blocks;
pub mod config;
mod error;
pub mod loader;
mod model;
pub mod plan;
pub mod state;
pub mod synth;

pub use backend::KvType;
pub use config::{Arch, ModelConfig, SsmConfig};
pub use error::ModelError;
pub use model::{LoadOptions, Model, ModelOn, SeqState};
pub use state::SeqStateOn;
