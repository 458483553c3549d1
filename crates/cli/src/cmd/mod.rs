//! One module per subcommand.

pub mod batched_bench;
pub mod bench;
pub mod bench_spec;
pub mod chat;
pub mod completions;
pub mod consistency;
pub mod embed;
pub mod gpu;
pub mod inspect;
pub mod keys;
pub mod loadtest;
pub mod models;
pub mod perplexity;
pub mod pull;
pub mod quantize;
pub mod run;
pub mod serve;
pub mod synth;
pub mod tokenize;
