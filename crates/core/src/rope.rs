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
    /// Magnitude and YaRN blend (`RopeScaling::NONE` for plain RoPE).
    pub scaling: RopeScaling,
}

/// Magnitude and YaRN settings of a rotation (ggml's `attn_factor`, `ext_factor` and
/// correction dimensions): cos and sin are multiplied by the magnitude; with YaRN
/// (`ext_factor` > 0) the angle of pair `i` blends the interpolated angle (`freq_scale` times
/// the plain one) with the plain one by `ramp(i) * ext_factor`, and the magnitude takes the
/// factor `1 + 0.1 ln(1 / freq_scale)` on top, as llama.cpp computes it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeScaling {
    pub attn_factor: f32,
    pub ext_factor: f32,
    /// First and last pair of the blend's ramp (`ggml_rope_yarn_corr_dims`).
    pub corr_dims: [f32; 2],
}

impl RopeScaling {
    /// Plain RoPE: magnitude 1, no blend.
    pub const NONE: RopeScaling = RopeScaling { attn_factor: 1.0, ext_factor: 0.0, corr_dims: [0.0, 0.0] };

    /// Magnitude only (LongRoPE's `rope.scaling.attn_factor`).
    pub fn magnitude(attn_factor: f32) -> RopeScaling {
        RopeScaling { attn_factor, ..RopeScaling::NONE }
    }

    /// YaRN for `n_rot` rotated dimensions trained on `n_ctx_orig` positions and stretched by
    /// `factor` (= 1 / freq_scale), as llama.cpp sets it up: correction dimensions from
    /// `beta_fast` / `beta_slow`, the magnitude `0.1 ln(factor) + 1` (divided by the factor
    /// the kernel multiplies back) times the file's `attn_factor`.
    pub fn yarn(
        n_rot: usize,
        n_ctx_orig: usize,
        freq_base: f32,
        factor: f32,
        beta_fast: f32,
        beta_slow: f32,
        attn_factor: f32,
    ) -> RopeScaling {
        let corr_dim = |n: f32| n_rot as f32 * (n_ctx_orig as f32 / (n * 2.0 * std::f32::consts::PI)).ln() / (2.0 * freq_base.ln());
        let start = corr_dim(beta_fast).floor().max(0.0);
        let end = corr_dim(beta_slow).ceil().min(n_rot as f32 - 1.0);
        let mscale = if factor <= 1.0 { 1.0 } else { 0.1 * factor.ln() + 1.0 };
        let mscale = mscale * (1.0 / (1.0 + 0.1 * factor.ln()));
        RopeScaling { attn_factor: mscale * attn_factor, ext_factor: 1.0, corr_dims: [start, end] }
    }

    /// The blend weight of pair `i` (`rope_yarn_ramp(...) * ext_factor`; 0 without YaRN).
    pub fn ramp(&self, i: usize) -> f32 {
        if self.ext_factor == 0.0 {
            return 0.0;
        }
        let [low, high] = self.corr_dims;
        // ggml divides the dimension index i0 = 2i by 2 in integers
        let y = (i as f32 - low) / (high - low).max(0.001);
        (1.0 - y.clamp(0.0, 1.0)) * self.ext_factor
    }

    /// The magnitude cos and sin are multiplied by, for a rotation with `freq_scale`.
    pub fn mscale(&self, freq_scale: f32) -> f32 {
        if self.ext_factor == 0.0 {
            self.attn_factor
        } else {
            self.attn_factor * (1.0 + 0.1 * (1.0 / freq_scale).ln())
        }
    }

    /// The angle of a pair from its plain angle `theta_extrap` (position times its frequency).
    pub fn angle(&self, theta_extrap: f32, freq_scale: f32, i: usize) -> f32 {
        let theta_interp = freq_scale * theta_extrap;
        if self.ext_factor == 0.0 {
            return theta_interp;
        }
        let mix = self.ramp(i);
        theta_interp * (1.0 - mix) + theta_extrap * mix
    }
}
