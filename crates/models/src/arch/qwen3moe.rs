//! `qwen3moe`: Qwen3 mixture-of-experts models (Qwen3-30B-A3B: 128 experts, 8 used, no shared
//! expert). [`super::qwen3`]'s attention; every layer's feed-forward is experts of
//! `expert_feed_forward_length`, softmax-routed, the top-k weights renormalized.

use super::llama::{load_variant, Variant};
use super::qwen3::QWEN3;
use crate::Model;
use quarrel_core::{Backend, Result};
use quarrel_gguf::Gguf;
use std::sync::Arc;

pub const QWEN3MOE: Variant = Variant { expert_width_key: Some("expert_feed_forward_length"), arch: "qwen3moe", ..QWEN3 };

pub fn load<B: Backend>(be: &B, g: &Arc<Gguf>) -> Result<Box<dyn Model<B>>> {
    load_variant(be, g, QWEN3MOE)
}
