//! `nomic-bert`: nomic-embed-text v1 / v1.5. The [`super::bert`] encoder with rotary
//! positions (NeoX style, `rope.freq_base`) instead of learned ones, q, k and v fused in
//! `attn_qkv`, and a SwiGLU feed-forward; its projections carry no biases.

use super::bert::{load_variant, Variant};
use crate::Model;
use quarrel_core::{Backend, Result};
use quarrel_gguf::Gguf;
use std::sync::Arc;

pub const NOMIC_BERT: Variant = Variant { arch: "nomic-bert", rotary: true, gated: true };

pub fn load<B: Backend>(be: &B, g: &Arc<Gguf>) -> Result<Box<dyn Model<B>>> {
    load_variant(be, g, NOMIC_BERT)
}
