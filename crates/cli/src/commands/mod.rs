//! One module per subcommand.

pub mod inspect;
pub mod bench;
pub mod run;
pub mod synth;
pub mod tokenize;
pub mod serve;
pub mod plan;
pub mod selftest;
pub mod quantize;
pub mod convert;
pub mod perplexity;
pub mod imatrix;
