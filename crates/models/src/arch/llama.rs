//! `llama`: Llama 1/2/3, Mistral, TinyLlama, SmolLM2. GQA, RoPE (normal style), RMSNorm,
//! SwiGLU, optional tied embeddings, optional sliding window and rope frequency factors
//! (Llama 3's `rope_freqs.weight`), projection biases where the file has them;
//! Mixtral-style experts (`ffn_gate_inp` + `ffn_{gate,up,down}_exps`, softmax top-k,
//! renormalized) where the file has them.
//!
//! The same pre-norm decoder (`x += attn(norm(x)); x += ffn(norm(x))`) is Qwen2, Qwen3 and
//! Qwen3-MoE: their files choose a [`Variant`] of it (RoPE style, per-head q/k norms, the
//! experts' width key) and load through [`load_variant`].

use super::common::{rope_scaling, trace, DimDefaults, Dims, Head, LayerStack, Stack, StackParts};
use crate::hparams::Hparams;
use crate::layers::attention::SelfAttention;
use crate::layers::moe::{routing_from_gguf, ExpertAct, FeedForward, FfnSpec};
use crate::layers::timing::OpTimes;
use crate::layers::{host_f32, weight};
use crate::{Model, ModelInfo};
use quarrel_core::{Backend, CoreError, ForwardBatch, Gating, MoeRouting, Result, RopeParams, RopeScaling, RopeStyle};
use quarrel_gguf::Gguf;
use std::sync::Arc;

/// What an architecture of this decoder family chooses.
#[derive(Clone, Copy, Debug)]
pub struct Variant {
    /// GGUF `general.architecture`.
    pub arch: &'static str,
    pub rope_style: RopeStyle,
    /// Per-head RMSNorm of queries and keys before RoPE (`attn_{q,k}_norm`).
    pub qk_norm: bool,
    /// Some: every layer is experts (an MoE-only architecture) whose width is under this key
    /// (`expert_feed_forward_length`); None: dense, or experts as wide as
    /// `feed_forward_length` (Mixtral) where the file has them.
    pub expert_width_key: Option<&'static str>,
    /// Whether `attention.sliding_window` applies (Mistral's files carry it).
    pub sliding_window: bool,
    /// Queries multiplied by `1 / sqrt(head_dim)` before attention, which then scales by 1
    /// (Phi-3), instead of the scores scaled.
    pub scale_q: bool,
}

/// Llama's choices.
pub const LLAMA: Variant =
    Variant { arch: "llama", rope_style: RopeStyle::Normal, qk_norm: false, expert_width_key: None, sliding_window: true, scale_q: false };

#[derive(Clone, Debug)]
pub struct Config {
    pub variant: Variant,
    pub dims: Dims,
    pub n_head_kv: usize,
    /// Dense FFN width, or each expert's width in a mixture-of-experts model.
    pub n_ff: usize,
    pub rope_freq_scale: f32,
    /// Magnitude and YaRN settings (`rope.scaling.*`).
    pub rope_scaling: RopeScaling,
    pub sliding_window: Option<usize>,
    /// Experts: routing options; None for a dense model.
    pub moe: Option<MoeRouting>,
    /// LongRoPE: the original training context (`rope.scaling.original_context_length`),
    /// up to which the short frequency factors apply, beyond it the long ones.
    pub n_ctx_orig: usize,
}

impl Config {
    /// A `llama` file's config.
    pub fn from_gguf(g: &Gguf) -> Result<Config> {
        Config::from_gguf_as(g, LLAMA)
    }

    pub fn from_gguf_as(g: &Gguf, variant: Variant) -> Result<Config> {
        let h = Hparams::new(g)?;
        let dims = Dims::from_hparams(&h, DimDefaults { n_ctx_train: 2048, rope_freq_base: 10000.0, rms_eps: 1e-5 })?;
        let n_head_kv = dims.kv_heads(&h)?;
        // llama3 scaling is carried by rope_freqs.weight
        let (rope_freq_scale, rope_scaling) = rope_scaling(&h, "", &["llama3"], dims.n_rot, dims.n_ctx_train, dims.rope_freq_base)?;
        // llama.cpp's graphs of this family: softmax gating, weights renormalized over the top k
        let moe = routing_from_gguf(&h, Gating::Softmax, true)?.map(|r| MoeRouting { gating: Gating::Softmax, norm_weights: true, ..r });
        let n_ff = match variant.expert_width_key {
            None => h.positive("feed_forward_length")?,
            Some(key) => {
                let Some(r) = &moe else {
                    let arch = variant.arch;
                    return Err(CoreError::Model(format!(
                        "{arch} has experts in every layer, but {} is 0 or absent",
                        h.key("expert_count")
                    )));
                };
                // llama.cpp's fallback for files without the key: the dense width split over the used experts
                match h.opt_usize(key)? {
                    Some(w) if w > 0 => w,
                    _ => (h.positive("feed_forward_length")? / r.n_used).max(1),
                }
            }
        };
        Ok(Config {
            variant,
            n_head_kv,
            n_ff,
            rope_freq_scale,
            rope_scaling,
            sliding_window: if variant.sliding_window { h.opt_usize("attention.sliding_window")?.filter(|&w| w > 0) } else { None },
            moe,
            n_ctx_orig: h.usize_or("rope.scaling.original_context_length", dims.n_ctx_train)?,
            dims,
        })
    }
}

pub struct Layer<B: Backend> {
    pub attn_norm: B::Weight,
    pub attn: SelfAttention<B>,
    pub ffn_norm: B::Weight,
    pub ffn: FeedForward<B>,
}

/// A loaded model of this family: its config, LongRoPE's long frequency factors where the
/// file has them, and the layers.
pub struct Decoder<B: Backend> {
    pub stack: Stack<B, Config, Layer<B>>,
    pub long_factors: Option<Vec<f32>>,
}

pub type Llama<B> = Decoder<B>;

pub fn load<B: Backend>(be: &B, g: &Arc<Gguf>) -> Result<Box<dyn Model<B>>> {
    load_variant(be, g, LLAMA)
}

/// Load a model of this decoder family as `variant` says.
pub fn load_variant<B: Backend>(be: &B, g: &Arc<Gguf>, variant: Variant) -> Result<Box<dyn Model<B>>> {
    let cfg = Config::from_gguf_as(g, variant)?;
    let (c, d) = (&cfg, &cfg.dims);
    let head = Head::load(be, g, d.n_embd, d.n_vocab)?;
    let factors = |name: &str| g.tensor_info(name).map(|_| host_f32(g, name, d.n_rot / 2)).transpose();
    // Llama 3's rope_freqs, or LongRoPE's short factors (the long ones once a context beyond
    // the original one is set)
    let freq_factors = match factors("rope_freqs.weight")? {
        Some(f) => Some(f),
        None => factors("rope_factors_short.weight")?,
    };
    let long_factors = factors("rope_factors_long.weight")?;
    let rope = RopeParams {
        style: variant.rope_style,
        n_rot: d.n_rot,
        freq_base: d.rope_freq_base,
        freq_scale: c.rope_freq_scale,
        freq_factors,
        scaling: c.rope_scaling,
    };
    // with scale_q the queries carry the scale
    let attn = d.attn_params(c.n_head_kv, if variant.scale_q { 1.0 } else { 1.0 / (d.head_dim as f32).sqrt() }, c.sliding_window);
    let mut layers = Vec::with_capacity(d.n_layer);
    for il in 0..d.n_layer {
        let mut sa = SelfAttention::load(be, g, il, d.n_embd, attn.clone(), rope.clone())?.with_biases(be, g, il, d.n_embd)?;
        if variant.qk_norm {
            sa = sa.with_qk_norm(be, g, il, d.rms_eps)?;
        }
        if variant.scale_q {
            sa.q_scale = Some(1.0 / (d.head_dim as f32).sqrt());
        }
        let ffn = FfnSpec { act: ExpertAct::SwiGlu, n_ff: c.n_ff, moe: c.moe.as_ref(), n_ff_shexp: 0 };
        layers.push(Layer {
            attn_norm: weight(be, g, &format!("blk.{il}.attn_norm.weight"), d.n_embd, 1)?,
            attn: sa,
            ffn_norm: weight(be, g, &format!("blk.{il}.ffn_norm.weight"), d.n_embd, 1)?,
            ffn: FeedForward::load(be, g, il, d.n_embd, ffn)?,
        });
    }
    let info = d.model_info(g, variant.arch, c.n_head_kv);
    Ok(Box::new(Decoder { stack: Stack { cfg, info, head, layers }, long_factors }))
}

impl<B: Backend> StackParts<B> for Decoder<B> {
    fn parts(&self) -> (&ModelInfo, Option<&Head<B>>) {
        self.stack.parts()
    }
}

impl<B: Backend> LayerStack<B> for Decoder<B> {
    fn op_times(&self) -> OpTimes {
        let mut t = OpTimes::default();
        self.stack.layers.iter().for_each(|l| t += l.ffn.op_times());
        t
    }

    fn set_context_len(&mut self, n_ctx: usize) {
        if let Some(long) = &self.long_factors {
            if n_ctx > self.stack.cfg.n_ctx_orig {
                self.stack.layers.iter_mut().for_each(|l| l.attn.rope.freq_factors = Some(long.clone()));
            }
        }
    }

    fn final_hidden(&self, be: &B, batch: &ForwardBatch, kv: &mut B::Kv) -> Result<B::Buf> {
        let Stack { cfg, head, layers, .. } = &self.stack;
        let d = &cfg.dims;
        let n = batch.n_tokens();
        let mut x = head.embed(be, batch, d.n_embd)?; // (n_tok, n_embd)
        let mut h = be.alloc(n * d.n_embd)?; // (n_tok, n_embd)
        for (il, l) in layers.iter().enumerate() {
            be.rms_norm(&x, &l.attn_norm, d.rms_eps, &mut h)?;
            let a = l.attn.forward(be, il, &h, batch, kv, d.n_embd)?; // (n_tok, n_embd)
            be.add(&mut x, &a)?;
            be.rms_norm(&x, &l.ffn_norm, d.rms_eps, &mut h)?;
            let f = l.ffn.forward(be, &h, n, d.n_embd)?; // (n_tok, n_embd)
            trace(be, "ffn_out", il, &f)?;
            be.add(&mut x, &f)?;
            trace(be, "l_out", il, &x)?;
        }
        head.norm_rows(be, &x, batch, d.n_embd, d.rms_eps)
    }
}
