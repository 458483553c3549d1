//! `gpt-oss`: OpenAI's GPT-OSS (20B: 24 layers, 32 experts; 120B: 36 layers, 128 experts).
//! The [`super::llama`] pre-norm decoder with:
//! - attention: biases on the q, k, v and output projections, NeoX RoPE with YaRN scaling,
//!   a learned sink logit per head in every softmax, and layers alternating between a
//!   sliding window (even layers by default, or as `attention.sliding_window_pattern` says)
//!   and full attention;
//! - feed-forward: experts in every layer (MXFP4 in the published files), the router with a
//!   logit bias, experts chosen by their raw logits and weighted by a softmax over the chosen
//!   ones, per-expert biases on every matmul, and a clamped SwiGLU
//!   ([`crate::layers::moe::ExpertAct::SwiGluOai`]);
//! - the norm before the feed-forward is named `post_attention_norm`.
//!
//! ```text
//!  x += o(attn(rope(q), rope(k), v; sinks)) + o_b   (attn_norm(x); window on sliding layers)
//!  x += Σ_top-k softmax(router) · down(swiglu_oai(gate + b, up + b)) + down_b   (post_attention_norm(x))
//! ```

use super::common::{rope_scaling, swa_layers, DimDefaults, Dims, Head, Stack};
use super::llama::{Config, Decoder, Layer, Variant};
use crate::hparams::Hparams;
use crate::layers::attention::SelfAttention;
use crate::layers::moe::{routing_from_gguf, ExpertAct, FeedForward, FfnSpec};
use crate::layers::weight;
use crate::Model;
use quarrel_core::{Backend, CoreError, Gating, MoeRouting, Result, RopeParams, RopeStyle};
use quarrel_gguf::Gguf;
use std::sync::Arc;

pub const GPT_OSS: Variant = Variant {
    arch: "gpt-oss",
    rope_style: RopeStyle::Neox,
    qk_norm: false,
    expert_width_key: Some("expert_feed_forward_length"),
    sliding_window: true,
    scale_q: false,
};

/// llama.cpp's interleave for this architecture: one sliding layer, then one full.
const DEFAULT_SWA_PATTERN: usize = 2;

pub fn load<B: Backend>(be: &B, g: &Arc<Gguf>) -> Result<Box<dyn Model<B>>> {
    let h = Hparams::new(g)?;
    let d = Dims::from_hparams(&h, DimDefaults { n_ctx_train: 131_072, rope_freq_base: 150_000.0, rms_eps: 1e-5 })?;
    let n_head_kv = d.kv_heads(&h)?;
    let (rope_freq_scale, rope_scaling) = rope_scaling(&h, "", &[], d.n_rot, d.n_ctx_train, d.rope_freq_base)?;
    // llama.cpp's graph for this architecture fixes the gating and leaves the weights unnormalized
    let routing = routing_from_gguf(&h, Gating::SoftmaxWeight, false)?
        .map(|r| MoeRouting { gating: Gating::SoftmaxWeight, norm_weights: false, ..r })
        .ok_or_else(|| CoreError::Model(format!("gpt-oss has experts in every layer, but {} is 0 or absent", h.key("expert_count"))))?;
    let n_ff = h.positive("expert_feed_forward_length")?;
    let window = h.opt_usize("attention.sliding_window")?.filter(|&w| w > 0);
    let is_swa = match window {
        Some(_) => swa_layers(&h, d.n_layer, DEFAULT_SWA_PATTERN)?,
        None => vec![false; d.n_layer],
    };
    let freq_base_swa = h.f32_or("rope.freq_base_swa", d.rope_freq_base)?;
    let head = Head::load(be, g, d.n_embd, d.n_vocab)?;
    let scale = 1.0 / (d.head_dim as f32).sqrt();
    let mut layers = Vec::with_capacity(d.n_layer);
    for (il, &swa) in is_swa.iter().enumerate() {
        let rope = RopeParams {
            style: RopeStyle::Neox,
            n_rot: d.n_rot,
            freq_base: if swa { freq_base_swa } else { d.rope_freq_base },
            freq_scale: rope_freq_scale,
            freq_factors: None,
            scaling: rope_scaling,
        };
        let attn = d.attn_params(n_head_kv, scale, if swa { window } else { None });
        let sa = SelfAttention::load(be, g, il, d.n_embd, attn, rope)?.with_biases(be, g, il, d.n_embd)?.with_sinks(be, g, il)?;
        let spec = FfnSpec { act: ExpertAct::SwiGluOai, n_ff, moe: Some(&routing), n_ff_shexp: 0 };
        layers.push(Layer {
            attn_norm: weight(be, g, &format!("blk.{il}.attn_norm.weight"), d.n_embd, 1)?,
            attn: sa,
            ffn_norm: weight(be, g, &format!("blk.{il}.post_attention_norm.weight"), d.n_embd, 1)?,
            ffn: FeedForward::load(be, g, il, d.n_embd, spec)?,
        });
    }
    let info = d.model_info(g, GPT_OSS.arch, n_head_kv);
    let cfg = Config {
        variant: GPT_OSS,
        n_head_kv,
        n_ff,
        rope_freq_scale,
        rope_scaling,
        sliding_window: window,
        moe: Some(routing),
        n_ctx_orig: h.usize_or("rope.scaling.original_context_length", d.n_ctx_train)?,
        dims: d,
    };
    Ok(Box::new(Decoder { stack: Stack { cfg, info, head, layers }, long_factors: None }))
}
