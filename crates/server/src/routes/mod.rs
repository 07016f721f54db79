//! HTTP handlers, one file per endpoint family.

pub mod chat;
pub mod completions;
pub mod info;
pub mod metrics;
pub mod page;
mod sse;
