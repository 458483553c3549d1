//! One file per GGUF `general.architecture`.

pub mod llama;
