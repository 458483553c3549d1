//! `gemma3` (Google Gemma 3 text models, 270M-27B): embeddings times sqrt(n_embd), per-head
//! RMSNorm of queries and keys before (NeoX) RoPE, queries scaled by 1/sqrt(head_dim) (27B:
//! 1/sqrt(n_embd / n_head)) before attention, sandwich norms (an RMSNorm after attention and
//! after the feed-forward, before each residual add), a GELU-gated feed-forward, output tied
//! to the embeddings unless the file has `output.weight`.
//!
//! Interleaved sliding-window attention: layer `il` attends to the last `sliding_window`
//! positions unless it is a global layer — by default every `sliding_window_pattern`-th
//! (6th) layer, or as the per-layer array `attention.sliding_window_pattern` says (1 / true =
//! sliding). Sliding layers rotate with `rope.freq_base_swa` (default 10,000) and no rope
//! scaling; global ones with `rope.freq_base` and the file's linear scaling. The cache keeps
//! every position for every layer (the window is a mask): memory as a global layer's.
//!
//! ```text
//!  tokens ─embed×√n_embd─► x ─┬─ per layer: x += post_attn_norm(attention(norm x))
//!                             │             x += post_ffw_norm(down(gelu(gate) · up)(norm x))
//!                             └─ norm ─► output (tied) ─► [softcap] ─► logits
//! ```

use super::common::{reject_tensors, rope_freq_scale, swa_layers, trace, DimDefaults, Dims, Head, LayerStack, Stack};
use crate::hparams::Hparams;
use crate::layers::attention::SelfAttention;
use crate::layers::mlp::{GateAct, SwiGluMlp};
use crate::layers::weight;
use crate::Model;
use quarrel_core::{Backend, CoreError, ForwardBatch, Result, RopeParams, RopeScaling, RopeStyle};
use quarrel_gguf::Gguf;
use std::sync::Arc;

/// llama.cpp's default interleave: five sliding layers, then one global.
const DEFAULT_SWA_PATTERN: usize = 6;

#[derive(Clone, Debug)]
pub struct Config {
    pub dims: Dims,
    pub n_head_kv: usize,
    pub n_ff: usize,
    pub rope_freq_scale: f32,
    pub rope_freq_base_swa: f32,
    /// Window of the sliding layers; None: every layer global.
    pub sliding_window: Option<usize>,
    /// Per layer: true where the layer attends through the sliding window.
    pub is_swa: Vec<bool>,
    /// Scale of the queries before attention.
    pub q_scale: f32,
}

impl Config {
    pub fn from_gguf(g: &Gguf) -> Result<Config> {
        let h = Hparams::new(g)?;
        let dims = Dims::from_hparams(&h, DimDefaults { n_ctx_train: 8192, rope_freq_base: 1_000_000.0, rms_eps: 1e-6 })?;
        let n_head_kv = dims.kv_heads(&h)?;
        let (n_embd, n_layer, n_head, head_dim) = (dims.n_embd, dims.n_layer, dims.n_head, dims.head_dim);
        if h.usize_or("attention.value_length", head_dim)? != head_dim {
            return Err(CoreError::Unsupported("gemma3 with value_length != key_length".into()));
        }
        let softcap = h.f32_or("final_logit_softcapping", 0.0)?;
        if softcap != 0.0 {
            return Err(CoreError::Unsupported(format!("gemma3 final_logit_softcapping {softcap}")));
        }
        let rope_freq_scale = rope_freq_scale(&h, "gemma3 ", &[])?;
        let sliding_window = h.opt_usize("attention.sliding_window")?.filter(|&w| w > 0);
        let is_swa = match sliding_window {
            None => vec![false; n_layer],
            Some(_) => swa_layers(&h, n_layer, DEFAULT_SWA_PATTERN)?,
        };
        // gemma_pytorch: query_pre_attn_scalar is head_dim, except 27B's n_embd / n_head
        let pre_attn = if n_layer == 62 { n_embd / n_head } else { head_dim };
        Ok(Config {
            n_head_kv,
            n_ff: h.positive("feed_forward_length")?,
            rope_freq_scale,
            rope_freq_base_swa: h.f32_or("rope.freq_base_swa", 10_000.0)?,
            sliding_window,
            is_swa,
            q_scale: 1.0 / (pre_attn as f32).sqrt(),
            dims,
        })
    }
}

pub struct Layer<B: Backend> {
    pub attn_norm: B::Weight,
    pub attn: SelfAttention<B>,
    pub post_attn_norm: B::Weight,
    pub ffn_norm: B::Weight,
    pub ffn: SwiGluMlp<B>,
    pub post_ffw_norm: B::Weight,
}

pub type Gemma3<B> = Stack<B, Config, Layer<B>>;

pub fn load<B: Backend>(be: &B, g: &Arc<Gguf>) -> Result<Box<dyn Model<B>>> {
    let cfg = Config::from_gguf(g)?;
    let (c, d) = (&cfg, &cfg.dims);
    let head = Head::load(be, g, d.n_embd, d.n_vocab)?;
    let mut layers = Vec::with_capacity(d.n_layer);
    for il in 0..d.n_layer {
        reject_tensors(g, il, &["attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output.bias"])?;
        let swa = c.is_swa[il];
        let rope = RopeParams {
            style: RopeStyle::Neox,
            n_rot: d.n_rot,
            freq_base: if swa { c.rope_freq_base_swa } else { d.rope_freq_base },
            freq_scale: if swa { 1.0 } else { c.rope_freq_scale },
            freq_factors: None,
            scaling: RopeScaling::NONE,
        };
        // the queries carry the scale (llama.cpp scales q, then attends with 1.0)
        let params = d.attn_params(c.n_head_kv, 1.0, if swa { c.sliding_window } else { None });
        let mut attn = SelfAttention::load(be, g, il, d.n_embd, params, rope)?.with_qk_norm(be, g, il, d.rms_eps)?;
        attn.q_scale = Some(c.q_scale);
        let mut ffn = SwiGluMlp::load(be, g, il, d.n_embd, c.n_ff)?;
        ffn.act = GateAct::Gelu;
        let norm = |s: &str| weight(be, g, &format!("blk.{il}.{s}.weight"), d.n_embd, 1);
        layers.push(Layer {
            attn_norm: norm("attn_norm")?,
            attn,
            post_attn_norm: norm("post_attention_norm")?,
            ffn_norm: norm("ffn_norm")?,
            ffn,
            post_ffw_norm: norm("post_ffw_norm")?,
        });
    }
    let info = d.model_info(g, "gemma3", c.n_head_kv);
    Ok(Box::new(Gemma3 { cfg, info, head, layers }))
}

impl<B: Backend> LayerStack<B> for Gemma3<B> {
    fn final_hidden(&self, be: &B, batch: &ForwardBatch, kv: &mut B::Kv) -> Result<B::Buf> {
        let d = &self.cfg.dims;
        let n = batch.n_tokens();
        let mut x = self.head.embed(be, batch, d.n_embd)?; // (n_tok, n_embd)
        be.scale(&mut x, (d.n_embd as f32).sqrt())?;
        let mut h = be.alloc(n * d.n_embd)?; // (n_tok, n_embd)
        let mut post = be.alloc(n * d.n_embd)?; // a branch after its sandwich norm
        for (il, l) in self.layers.iter().enumerate() {
            be.rms_norm(&x, &l.attn_norm, d.rms_eps, &mut h)?;
            trace(be, "attn_norm", il, &h)?;
            let a = l.attn.forward(be, il, &h, batch, kv, d.n_embd)?; // (n_tok, n_embd)
            be.rms_norm(&a, &l.post_attn_norm, d.rms_eps, &mut post)?;
            be.add(&mut x, &post)?;
            trace(be, "attn_post_norm", il, &post)?;
            trace(be, "sa_out", il, &x)?;
            be.rms_norm(&x, &l.ffn_norm, d.rms_eps, &mut h)?;
            trace(be, "ffn_norm", il, &h)?;
            let f = l.ffn.forward(be, &h, n, d.n_embd)?; // (n_tok, n_embd)
            trace(be, "ffn_out", il, &f)?;
            be.rms_norm(&f, &l.post_ffw_norm, d.rms_eps, &mut post)?;
            be.add(&mut x, &post)?;
            trace(be, "l_out", il, &x)?;
        }
        self.head.norm_rows(be, &x, batch, d.n_embd, d.rms_eps)
    }
}
