//! `granite`, `granitemoe`, `granitehybrid` (IBM Granite 3 / Granite 4): a Llama-shaped
//! stack with Granite's multipliers — embeddings times `embedding_scale`, each residual
//! branch times `residual_scale`, attention scores times `attention.scale`, logits divided
//! by `logit_scale` — and, per file: dense SwiGLU or softmax top-k experts (+ shared expert
//! `*_shexp`), and (granitehybrid) Mamba2 mixers in the layers whose `head_count_kv` is 0.
//!
//! ```text
//!  tokens ─embed×emb_scale─► x ─┬─ per layer: x += res_scale · (attention | mamba2)(norm x)
//!                               │             x += res_scale · ffn(norm x)   (dense | MoE + shexp)
//!                               └─ norm ─► output ─► ÷ logit_scale ─► logits
//! ```

use super::common::{full_attention, reject_tensors, trace, DimDefaults, Dims, Head, LayerStack, Stack};
use crate::hparams::Hparams;
use crate::layers::attention::SelfAttention;
use crate::layers::mamba2::{ssm_params, Mamba2};
use crate::layers::moe::{routing_from_gguf, ExpertAct, FeedForward, FfnSpec};
use crate::layers::timing::OpTimes;
use crate::layers::weight;
use crate::{Model, ModelInfo};
use quarrel_core::{Backend, CoreError, ForwardBatch, Gating, MoeRouting, Result, RopeParams, RopeScaling, RopeStyle, SsmParams};
use quarrel_gguf::Gguf;
use std::sync::Arc;

#[derive(Clone, Debug)]
pub struct Config {
    pub arch: String,
    pub dims: Dims,
    pub n_ff: usize,
    /// Per layer; 0 marks a recurrent (Mamba2) layer in granitehybrid.
    pub n_head_kv: Vec<usize>,
    pub embedding_scale: f32,
    pub residual_scale: f32,
    pub attention_scale: f32,
    pub logit_scale: f32,
    pub moe: Option<MoeRouting>,
    pub n_ff_shexp: usize,
    pub ssm: Option<SsmParams>,
}

impl Config {
    pub fn from_gguf(g: &Gguf) -> Result<Config> {
        let h = Hparams::new(g)?;
        let arch = h.arch.clone();
        let dims = Dims::from_hparams(&h, DimDefaults { n_ctx_train: 4096, rope_freq_base: 10000.0, rms_eps: 1e-5 })?;
        let (n_embd, n_head, rms_eps) = (dims.n_embd, dims.n_head, dims.rms_eps);
        let n_head_kv = h.per_layer("attention.head_count_kv", dims.n_layer, Some(n_head))?;
        for &kv in &n_head_kv {
            if kv != 0 && n_head % kv != 0 {
                return Err(CoreError::Model(format!("head_count {n_head} is not a multiple of head_count_kv {kv}")));
            }
        }
        let hybrid = arch == "granitehybrid";
        if !hybrid && n_head_kv.contains(&0) {
            return Err(CoreError::Model(format!("{arch}: head_count_kv 0 (recurrent layers) only exists in granitehybrid")));
        }
        if let Some(t) = h.opt_str("rope.scaling.type")? {
            if t != "none" {
                return Err(CoreError::Unsupported(format!("{arch}: rope scaling type {t:?}")));
            }
        }
        let ssm = if hybrid { Some(ssm_params(&h, rms_eps)?) } else { None };
        if let Some(p) = &ssm {
            if p.d_inner != 2 * n_embd {
                return Err(CoreError::Model(format!("granitehybrid: ssm.inner_size {} must be 2 x embedding_length {n_embd}", p.d_inner)));
            }
        }
        // llama.cpp's granite graphs: softmax gating, renormalized top-k weights
        let moe = routing_from_gguf(&h, Gating::Softmax, true)?.map(|r| MoeRouting { gating: Gating::Softmax, norm_weights: true, ..r });
        Ok(Config {
            dims,
            n_ff: h.positive("feed_forward_length")?,
            n_head_kv,
            embedding_scale: h.f32_or("embedding_scale", 0.0)?,
            residual_scale: h.f32_or("residual_scale", 0.0)?,
            attention_scale: h.f32_or("attention.scale", 0.0)?,
            logit_scale: h.f32_or("logit_scale", 0.0)?,
            moe,
            n_ff_shexp: h.usize_or("expert_shared_feed_forward_length", 0)?,
            ssm,
            arch,
        })
    }
}

pub enum Mixer<B: Backend> {
    Attention(SelfAttention<B>),
    Mamba2(Mamba2<B>),
}

pub struct Layer<B: Backend> {
    pub attn_norm: B::Weight,
    pub mixer: Mixer<B>,
    pub ffn_norm: B::Weight,
    pub ffn: FeedForward<B>,
}

pub type Granite<B> = Stack<B, Config, Layer<B>>;

/// Biases this implementation does not apply.
const UNSUPPORTED: [&str; 5] = ["attn_output.bias", "attn_q.bias", "ffn_up.bias", "ffn_gate.bias", "ffn_down.bias"];

pub fn load<B: Backend>(be: &B, g: &Arc<Gguf>) -> Result<Box<dyn Model<B>>> {
    let cfg = Config::from_gguf(g)?;
    let (c, d) = (&cfg, &cfg.dims);
    let rope = RopeParams {
        style: RopeStyle::Normal,
        n_rot: d.n_rot,
        freq_base: d.rope_freq_base,
        freq_scale: 1.0,
        freq_factors: None,
        scaling: RopeScaling::NONE,
    };
    let mut layers = Vec::with_capacity(d.n_layer);
    for il in 0..d.n_layer {
        reject_tensors(g, il, &UNSUPPORTED)?;
        let mixer = match (c.n_head_kv[il], &c.ssm) {
            (0, Some(p)) => Mixer::Mamba2(Mamba2::load(be, g, il, d.n_embd, *p)?),
            (kv, _) => {
                let attn = full_attention(d.n_head, kv, d.head_dim, c.attention_scale);
                Mixer::Attention(SelfAttention::load(be, g, il, d.n_embd, attn, rope.clone())?)
            }
        };
        let spec = FfnSpec { act: ExpertAct::SwiGlu, n_ff: c.n_ff, moe: c.moe.as_ref(), n_ff_shexp: c.n_ff_shexp };
        let ffn = FeedForward::load(be, g, il, d.n_embd, spec)?;
        layers.push(Layer {
            attn_norm: weight(be, g, &format!("blk.{il}.attn_norm.weight"), d.n_embd, 1)?,
            mixer,
            ffn_norm: weight(be, g, &format!("blk.{il}.ffn_norm.weight"), d.n_embd, 1)?,
            ffn,
        });
    }
    let max_kv = c.n_head_kv.iter().copied().max().unwrap_or(0).max(1);
    let info = ModelInfo {
        recurrent: match &c.ssm {
            Some(p) => c.n_head_kv.iter().map(|&kv| (kv == 0).then_some(*p)).collect(),
            None => vec![],
        },
        ..d.model_info(g, &c.arch, max_kv)
    };
    Ok(Box::new(Granite { head: Head::load(be, g, d.n_embd, d.n_vocab)?, cfg, info, layers }))
}

impl<B: Backend> LayerStack<B> for Granite<B> {
    fn op_times(&self) -> OpTimes {
        let mut t = OpTimes::default();
        for l in &self.layers {
            t += l.ffn.op_times();
            if let Mixer::Mamba2(m) = &l.mixer {
                t += m.op_times();
            }
        }
        t
    }

    /// The head's logits divided by `logit_scale`.
    fn logits(&self, be: &B, batch: &ForwardBatch, kv: &mut B::Kv) -> Result<B::Buf> {
        let (c, d) = (&self.cfg, &self.cfg.dims);
        let normed = self.final_hidden(be, batch, kv)?;
        let mut logits = self.head.logits(be, &normed, batch.logits_rows.len(), d.n_vocab)?; // (rows, n_vocab)
        if c.logit_scale != 0.0 {
            be.scale(&mut logits, 1.0 / c.logit_scale)?;
        }
        Ok(logits)
    }

    fn final_hidden(&self, be: &B, batch: &ForwardBatch, kv: &mut B::Kv) -> Result<B::Buf> {
        let (c, d) = (&self.cfg, &self.cfg.dims);
        let n = batch.n_tokens();
        let mut x = self.head.embed(be, batch, d.n_embd)?; // (n_tok, n_embd)
        if c.embedding_scale != 0.0 {
            be.scale(&mut x, c.embedding_scale)?;
        }
        let mut h = be.alloc(n * d.n_embd)?; // (n_tok, n_embd)
        for (il, l) in self.layers.iter().enumerate() {
            be.rms_norm(&x, &l.attn_norm, d.rms_eps, &mut h)?;
            let mut a = match &l.mixer {
                Mixer::Attention(at) => at.forward(be, il, &h, batch, kv, d.n_embd)?,
                Mixer::Mamba2(m) => m.forward(be, il, &h, batch, kv, d.n_embd)?.0,
            }; // (n_tok, n_embd)
            trace(be, "mixer_out", il, &a)?;
            if c.residual_scale != 0.0 {
                be.add_scaled(&mut x, &mut a, c.residual_scale)?;
            } else {
                be.add(&mut x, &a)?;
            }
            be.rms_norm(&x, &l.ffn_norm, d.rms_eps, &mut h)?;
            let mut f = l.ffn.forward(be, &h, n, d.n_embd)?; // (n_tok, n_embd)
            trace(be, "ffn_out", il, &f)?;
            if c.residual_scale != 0.0 {
                be.add_scaled(&mut x, &mut f, c.residual_scale)?;
            } else {
                be.add(&mut x, &f)?;
            }
            trace(be, "l_out", il, &x)?;
        }
        self.head.norm_rows(be, &x, batch, d.n_embd, d.rms_eps)
    }
}
