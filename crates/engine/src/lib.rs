//! engine
pub mod scheduler;

pub mod sampler;
pub mod stop;
