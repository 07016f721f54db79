//! One module per subcommand.

pub mod bench;
pub mod convert;
pub mod device_args;
pub mod imatrix;
pub mod inspect;
pub mod multi_gpu;
pub mod perplexity;
pub mod placement;
pub mod plan;
pub mod quantize;
pub mod run;
pub mod selftest;
pub mod serve;
pub mod speculate;
pub mod synth;
pub mod tokenize;
