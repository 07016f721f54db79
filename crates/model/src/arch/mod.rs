//! One file per architecture, each a small loader (and, where it differs, a layer) over the
//! shared blocks.

pub mod llama;
pub mod qwen2;
pub mod qwen3;
pub mod qwen35;
pub mod qwen35_mtp;
