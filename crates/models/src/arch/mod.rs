//! One file per GGUF `general.architecture`.

pub mod bert;
pub mod common;
pub mod gemma3;
pub mod gpt_oss;
pub mod granite;
pub mod granitehybrid;
pub mod granitemoe;
pub mod llama;
pub mod mamba2;
pub mod nemotron;
pub mod nemotron_h;
pub mod nemotron_h_moe;
pub mod nomic_bert;
pub mod phi3;
pub mod qwen2;
pub mod qwen3;
pub mod qwen3moe;
