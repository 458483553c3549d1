//! # quarrel-models: architectures as GGUF describes them
//!
//! ```text
//!  Gguf ──registry::load──► arch/<general.architecture>.rs: Config::from_gguf ─► Weights::load
//!                                                           └─► forward(batch, kv) ─► logits
//!                     shared building blocks: layers/{attention, mlp, moe, mamba2}.rs over the Backend trait
//! ```
//!
//! | module     | responsibility |
//! |------------|----------------|
//! | `model`    | the `Model` trait every architecture implements; `ModelInfo` |
//! | `describe` | `ModelDescription`: routed experts, recurrent state, read before loading; the default `Numerics` |
//! | `hparams`  | typed reading of `{arch}.*` metadata keys |
//! | `layers`   | attention (paged, GQA, RoPE), SwiGLU / squared-ReLU MLP, MoE FFN, Mamba2 mixer |
//! | `arch`     | one file per GGUF architecture name (llama, qwen2, qwen3*, phi3, gpt-oss, nemotron, gemma3, granite*, mamba2, nemotron_h*) |
//! | `registry` | architecture name -> loader, one line each |
//! | `ftype`    | llama.cpp's file types (`general.file_type`): id, name, default tensor type |
//! | `quantize` | conversion to another file type: llama-quantize's per-tensor mix, the plan, the streamed output |
//!
//! Models own no state: the KV cache and the recurrent (Mamba2) state are the engine's, passed
//! into `forward`; a model declares its recurrent layers in `ModelInfo::recurrent`.

pub mod arch;
mod describe;
mod ftype;
pub mod hparams;
pub mod layers;
mod model;
pub mod quantize;
pub mod registry;

pub use describe::ModelDescription;
pub use ftype::Ftype;
pub use model::{Model, ModelInfo};
pub use registry::{load, supported_architectures, ENCODER_ARCHITECTURES};
