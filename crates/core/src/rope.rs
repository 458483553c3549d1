//! RoPE parameters, chosen per architecture from metadata.

/// Which dimensions are rotated together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// ggml "normal": pairs (2i, 2i+1) (Llama GGUFs, whose Q/K rows were permuted at conversion).
    Normal,
    /// GPT-NeoX: pairs (i, i + n_rot/2) (Qwen, Gemma, ...).
    Neox,
}

#[derive(Clone, Debug)]
pub struct RopeParams {
    pub style: RopeStyle,
    /// Number of rotated dimensions per head (`rope.dimension_count`).
    pub n_rot: usize,
    pub freq_base: f32,
    /// 1 / linear scaling factor.
    pub freq_scale: f32,
    /// Per-frequency divisors (`rope_freqs.weight`, Llama 3.1 style), n_rot/2 of them.
    pub freq_factors: Option<Vec<f32>>,
}
