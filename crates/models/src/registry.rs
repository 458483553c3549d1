//! Architecture name -> loader. Registering an architecture is one line in `registry!` below.

use crate::{arch, Model};
use quarrel_core::{Backend, CoreError, Result};
use quarrel_gguf::Gguf;
use std::sync::Arc;

macro_rules! registry {
    ($($name:literal => $loader:path),* $(,)?) => {
        /// Names of the architectures this build runs (GGUF `general.architecture`).
        pub const ARCHITECTURES: &[&str] = &[$($name),*];

        fn dispatch<B: Backend>(arch: &str, be: &B, g: &Arc<Gguf>) -> Option<Result<Box<dyn Model<B>>>> {
            match arch {
                $($name => Some($loader(be, g)),)*
                _ => None,
            }
        }
    };
}

registry! {
    "llama" => arch::llama::load,
    "bert" => arch::bert::load,
    "nomic-bert" => arch::nomic_bert::load,
    "gemma3" => arch::gemma3::load,
    "gpt-oss" => arch::gpt_oss::load,
    "granite" => arch::granite::load,
    "granitemoe" => arch::granitemoe::load,
    "granitehybrid" => arch::granitehybrid::load,
    "mamba2" => arch::mamba2::load,
    "nemotron" => arch::nemotron::load,
    "nemotron_h" => arch::nemotron_h::load,
    "nemotron_h_moe" => arch::nemotron_h_moe::load,
    "phi3" => arch::phi3::load,
    "qwen2" => arch::qwen2::load,
    "qwen3" => arch::qwen3::load,
    "qwen3moe" => arch::qwen3moe::load,
}

/// The architectures among [`ARCHITECTURES`] that are encoders (embedding and reranking
/// models: bidirectional attention, no logits).
pub const ENCODER_ARCHITECTURES: &[&str] = &["bert", "nomic-bert"];

pub fn supported_architectures() -> &'static [&'static str] {
    ARCHITECTURES
}

/// Load the model in `g` on backend `be`, dispatching on `general.architecture`.
pub fn load<B: Backend>(be: &B, g: &Arc<Gguf>) -> Result<Box<dyn Model<B>>> {
    let arch = g.architecture()?;
    dispatch(arch, be, g)
        .unwrap_or_else(|| Err(CoreError::Unsupported(format!("architecture {arch:?} (supported: {})", ARCHITECTURES.join(", ")))))
}
