//! `phi3`: Phi-3, Phi-3.5 and Phi-4-mini. The [`super::llama`] decoder with q, k and v fused
//! in `attn_qkv` and the gate and up projections fused in `ffn_up` (both cut apart at load),
//! NeoX-style RoPE (partial where `rope.dimension_count` is below the head width), the queries
//! scaled before attention, and LongRoPE: `rope_factors_short` up to the original context,
//! `rope_factors_long` beyond it, cos and sin scaled by `rope.scaling.attn_factor`.
//! Phi-3's sliding window is not applied (llama.cpp's choice: the files' window metadata is
//! unreliable).

use super::llama::{load_variant, Variant, LLAMA};
use crate::Model;
use quarrel_core::{Backend, Result, RopeStyle};
use quarrel_gguf::Gguf;
use std::sync::Arc;

pub const PHI3: Variant = Variant { arch: "phi3", rope_style: RopeStyle::Neox, sliding_window: false, scale_q: true, ..LLAMA };

pub fn load<B: Backend>(be: &B, g: &Arc<Gguf>) -> Result<Box<dyn Model<B>>> {
    load_variant(be, g, PHI3)
}
