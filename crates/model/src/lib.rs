//! model

pub mod synth;
