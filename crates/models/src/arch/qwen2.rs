//! `qwen2`: Qwen2 and Qwen2.5. The [`super::llama`] decoder with NeoX-style RoPE and biases
//! on the q, k and v projections (loaded wherever the file has them).

use super::llama::{load_variant, Variant, LLAMA};
use crate::Model;
use quarrel_core::{Backend, Result, RopeStyle};
use quarrel_gguf::Gguf;
use std::sync::Arc;

pub const QWEN2: Variant = Variant { arch: "qwen2", rope_style: RopeStyle::Neox, sliding_window: false, ..LLAMA };

pub fn load<B: Backend>(be: &B, g: &Arc<Gguf>) -> Result<Box<dyn Model<B>>> {
    load_variant(be, g, QWEN2)
}
