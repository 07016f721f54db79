//! engine

pub mod sampler;
pub mod stop;
