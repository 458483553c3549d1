//! `qwen3`: Qwen3 dense models. The [`super::llama`] decoder with NeoX-style RoPE and a
//! per-head RMSNorm of queries and keys before RoPE (`attn_q_norm`, `attn_k_norm`); the head
//! width (`attention.key_length`, 128) need not be `n_embd / n_head`.

use super::llama::{load_variant, Variant, LLAMA};
use crate::Model;
use quarrel_core::{Backend, Result, RopeStyle};
use quarrel_gguf::Gguf;
use std::sync::Arc;

pub const QWEN3: Variant = Variant { arch: "qwen3", rope_style: RopeStyle::Neox, qk_norm: true, sliding_window: false, ..LLAMA };

pub fn load<B: Backend>(be: &B, g: &Arc<Gguf>) -> Result<Box<dyn Model<B>>> {
    load_variant(be, g, QWEN3)
}
