//! One module per subcommand.

pub mod batched_bench;
pub mod bench;
pub mod chat;
pub mod embed;
pub mod inspect;
pub mod perplexity;
pub mod pull;
pub mod run;
pub mod synth;
pub mod tokenize;
