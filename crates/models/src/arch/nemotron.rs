//! `nemotron`: NVIDIA Nemotron-3 / Nemotron-Mini. Pre-norm decoder with LayerNorms (weight and
//! bias) before attention, before the MLP and at the output; GQA attention with NeoX RoPE over
//! part of each head (`rope.dimension_count`), an optional output-projection bias; an ungated
//! squared-ReLU MLP with optional biases.

use super::common::{trace, Head, LayerStack, Stack};
use super::llama::{Variant, LLAMA};
use crate::hparams::Hparams;
use crate::layers::attention::SelfAttention;
use crate::layers::mlp::ReluSqrMlp;
use crate::layers::weight;
use crate::Model;
use quarrel_core::{Backend, CoreError, ForwardBatch, Result, RopeParams, RopeStyle};
use quarrel_gguf::Gguf;
use std::sync::Arc;

/// The [`super::llama`] family's hyperparameters (heads, RoPE and its scaling, widths) and the
/// LayerNorms' epsilon.
#[derive(Clone, Debug)]
pub struct Config {
    pub base: super::llama::Config,
    /// `attention.layer_norm_epsilon`.
    pub norm_eps: f32,
}

/// Nemotron's RoPE style and window rule, for the shared hyperparameter reading.
const NEMOTRON: Variant = Variant { arch: "nemotron", rope_style: RopeStyle::Neox, sliding_window: false, ..LLAMA };

impl Config {
    pub fn from_gguf(g: &Gguf) -> Result<Config> {
        let base = super::llama::Config::from_gguf_as(g, NEMOTRON)?;
        if base.moe.is_some() {
            return Err(CoreError::Unsupported("nemotron with experts".into()));
        }
        Ok(Config { base, norm_eps: Hparams::new(g)?.f32_or("attention.layer_norm_epsilon", 1e-5)? })
    }
}

pub struct Layer<B: Backend> {
    pub attn_norm: B::Weight,
    pub attn_norm_b: B::Weight,
    pub attn: SelfAttention<B>,
    pub ffn_norm: B::Weight,
    pub ffn_norm_b: B::Weight,
    pub ffn: ReluSqrMlp<B>,
}

pub type Nemotron<B> = Stack<B, Config, Layer<B>>;

pub fn load<B: Backend>(be: &B, g: &Arc<Gguf>) -> Result<Box<dyn Model<B>>> {
    let cfg = Config::from_gguf(g)?;
    let (c, d) = (&cfg.base, &cfg.base.dims);
    let head = Head::load(be, g, d.n_embd, d.n_vocab)?.with_norm_bias(be, g, d.n_embd)?;
    let rope = RopeParams {
        style: RopeStyle::Neox,
        n_rot: d.n_rot,
        freq_base: d.rope_freq_base,
        freq_scale: c.rope_freq_scale,
        freq_factors: None,
        scaling: c.rope_scaling,
    };
    let params = d.attn_params(c.n_head_kv, 1.0 / (d.head_dim as f32).sqrt(), None);
    let mut layers = Vec::with_capacity(d.n_layer);
    for il in 0..d.n_layer {
        let vec = |s: &str| weight(be, g, &format!("blk.{il}.{s}"), d.n_embd, 1);
        layers.push(Layer {
            attn_norm: vec("attn_norm.weight")?,
            attn_norm_b: vec("attn_norm.bias")?,
            attn: SelfAttention::load(be, g, il, d.n_embd, params.clone(), rope.clone())?.with_biases(be, g, il, d.n_embd)?,
            ffn_norm: vec("ffn_norm.weight")?,
            ffn_norm_b: vec("ffn_norm.bias")?,
            ffn: ReluSqrMlp::load(be, g, il, "", d.n_embd, c.n_ff)?.with_biases(be, g, il, d.n_embd)?,
        });
    }
    let info = d.model_info(g, "nemotron", c.n_head_kv);
    Ok(Box::new(Nemotron { cfg, info, head, layers }))
}

impl<B: Backend> LayerStack<B> for Nemotron<B> {
    fn final_hidden(&self, be: &B, batch: &ForwardBatch, kv: &mut B::Kv) -> Result<B::Buf> {
        let (d, eps) = (&self.cfg.base.dims, self.cfg.norm_eps);
        let n = batch.n_tokens();
        let mut x = self.head.embed(be, batch, d.n_embd)?; // (n_tok, n_embd)
        let mut h = be.alloc(n * d.n_embd)?; // (n_tok, n_embd)
        for (il, l) in self.layers.iter().enumerate() {
            be.layer_norm(&x, &l.attn_norm, &l.attn_norm_b, eps, &mut h)?;
            trace(be, "attn_norm", il, &h)?;
            let a = l.attn.forward(be, il, &h, batch, kv, d.n_embd)?; // (n_tok, n_embd)
            be.add(&mut x, &a)?;
            be.layer_norm(&x, &l.ffn_norm, &l.ffn_norm_b, eps, &mut h)?;
            let f = l.ffn.forward(be, &h, n, d.n_embd)?; // (n_tok, n_embd)
            trace(be, "ffn_out", il, &f)?;
            be.add(&mut x, &f)?;
            trace(be, "l_out", il, &x)?;
        }
        self.head.norm_rows(be, &x, batch, d.n_embd, eps)
    }
}
