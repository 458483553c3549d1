//! `nemotron_h`, `nemotron_h_moe` (NVIDIA Nemotron-H / Nemotron-3-Nano) and `mamba2`: a
//! stack of single-mixer blocks `x += mixer(rmsnorm(x))`, the mixer per layer as the file
//! says: Mamba2 (`head_count_kv` 0 and `feed_forward_length` 0), attention without RoPE
//! (`feed_forward_length` 0), or a feed-forward — squared-ReLU MLP, or sigmoid-gated top-k
//! experts with a selection bias (`exp_probs_b`) plus a squared-ReLU shared expert.
//! `mamba2` files are the all-recurrent case (no attention or feed-forward keys).
//!
//! ```text
//!  tokens ─embed─► x ─ per layer: x += (mamba2 | attention | ffn | moe+shexp)(rmsnorm x) ─► norm ─► output
//! ```

use super::common::{full_attention, model_info, reject_tensors, trace, Head, LayerStack, Stack};
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

/// What one layer is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerKind {
    Mamba2,
    Attention {
        n_head: usize,
        n_head_kv: usize,
    },
    /// Feed-forward of this width (experts: the per-expert width).
    Ffn {
        n_ff: usize,
    },
}

#[derive(Clone, Debug)]
pub struct Config {
    pub arch: String,
    pub n_embd: usize,
    pub n_layer: usize,
    pub kinds: Vec<LayerKind>,
    pub head_dim: usize,
    pub n_vocab: usize,
    pub n_ctx_train: usize,
    pub rms_eps: f32,
    pub attention_scale: f32,
    pub ssm: SsmParams,
    pub moe: Option<MoeRouting>,
    pub n_ff_shexp: usize,
}

impl Config {
    pub fn from_gguf(g: &Gguf) -> Result<Config> {
        let h = Hparams::new(g)?;
        let arch = h.arch.clone();
        let n_embd = h.positive("embedding_length")?;
        let n_layer = h.block_count()?;
        let rms_eps = match h.g.get_f64(&format!("{arch}.attention.layer_norm_rms_epsilon"))? {
            Some(_) => h.f32_or("attention.layer_norm_rms_epsilon", 1e-5)?,
            None => h.f32_or("attention.layer_norm_epsilon", 1e-5)?,
        };
        let ssm = ssm_params(&h, rms_eps)?;
        let mamba_only = arch == "mamba2";
        let n_head_v = h.per_layer("attention.head_count", n_layer, Some(0))?;
        let n_kv_v = h.per_layer("attention.head_count_kv", n_layer, Some(0))?;
        let n_ff_v = h.per_layer("feed_forward_length", n_layer, Some(0))?;
        let moe = if mamba_only {
            None
        } else {
            // llama.cpp's nemotron_h graph: sigmoid gating; norm and scale from the file
            routing_from_gguf(&h, Gating::Sigmoid, false)?.map(|r| MoeRouting { gating: Gating::Sigmoid, ..r })
        };
        let n_ff_exp_v = h.per_layer("expert_feed_forward_length", n_layer, Some(0))?;
        let mut kinds = Vec::with_capacity(n_layer);
        let mut head_dim = 0;
        for il in 0..n_layer {
            let kind = if mamba_only || (n_kv_v[il] == 0 && n_ff_v[il] == 0) {
                LayerKind::Mamba2
            } else if n_ff_v[il] == 0 {
                let (nh, nkv) = (n_head_v[il], n_kv_v[il]);
                if nh == 0 || nh % nkv != 0 {
                    return Err(CoreError::Model(format!("layer {il}: head_count {nh} with head_count_kv {nkv}")));
                }
                head_dim = super::common::head_dim(&h, n_embd, nh)?;
                LayerKind::Attention { n_head: nh, n_head_kv: nkv }
            } else {
                let n_ff = match &moe {
                    Some(r) if n_ff_exp_v[il] == 0 => n_ff_v[il] / r.n_used,
                    Some(_) => n_ff_exp_v[il],
                    None => n_ff_v[il],
                };
                LayerKind::Ffn { n_ff }
            };
            kinds.push(kind);
        }
        Ok(Config {
            n_embd,
            n_layer,
            kinds,
            head_dim: head_dim.max(1),
            n_vocab: h.n_vocab()?,
            n_ctx_train: h.usize_or("context_length", 4096)?,
            rms_eps,
            attention_scale: h.f32_or("attention.scale", 0.0)?,
            ssm,
            moe,
            n_ff_shexp: h.usize_or("expert_shared_feed_forward_length", 0)?,
            arch,
        })
    }
}

pub enum Mixer<B: Backend> {
    Mamba2(Mamba2<B>),
    Attention(SelfAttention<B>),
    Ffn(FeedForward<B>),
}

pub struct Layer<B: Backend> {
    pub attn_norm: B::Weight,
    pub mixer: Mixer<B>,
}

pub type NemotronH<B> = Stack<B, Config, Layer<B>>;

pub fn load<B: Backend>(be: &B, g: &Arc<Gguf>) -> Result<Box<dyn Model<B>>> {
    let cfg = Config::from_gguf(g)?;
    let c = &cfg;
    // n_rot 0: these attention layers use no positional rotation
    let no_rope = RopeParams {
        style: RopeStyle::Normal,
        n_rot: 0,
        freq_base: 10000.0,
        freq_scale: 1.0,
        freq_factors: None,
        scaling: RopeScaling::NONE,
    };
    let mut layers = Vec::with_capacity(c.n_layer);
    let mut max_kv = 1;
    for (il, kind) in c.kinds.iter().enumerate() {
        reject_tensors(g, il, &["ffn_latent_down.weight", "attn_output.bias", "ffn_up.bias", "ffn_down.bias"])?;
        let mixer = match *kind {
            LayerKind::Mamba2 => Mixer::Mamba2(Mamba2::load(be, g, il, c.n_embd, c.ssm)?),
            LayerKind::Attention { n_head, n_head_kv } => {
                max_kv = max_kv.max(n_head_kv);
                let p = full_attention(n_head, n_head_kv, c.head_dim, c.attention_scale);
                Mixer::Attention(SelfAttention::load(be, g, il, c.n_embd, p, no_rope.clone())?)
            }
            LayerKind::Ffn { n_ff } => {
                let spec = FfnSpec { act: ExpertAct::ReluSqr, n_ff, moe: c.moe.as_ref(), n_ff_shexp: c.n_ff_shexp };
                Mixer::Ffn(FeedForward::load(be, g, il, c.n_embd, spec)?)
            }
        };
        layers.push(Layer { attn_norm: weight(be, g, &format!("blk.{il}.attn_norm.weight"), c.n_embd, 1)?, mixer });
    }
    let info = ModelInfo {
        recurrent: c.kinds.iter().map(|k| (*k == LayerKind::Mamba2).then_some(c.ssm)).collect(),
        ..model_info(g, &c.arch, c.n_vocab, c.n_embd, c.n_layer, c.n_ctx_train, (max_kv, c.head_dim))
    };
    Ok(Box::new(NemotronH { head: Head::load(be, g, c.n_embd, c.n_vocab)?, cfg, info, layers }))
}

impl<B: Backend> LayerStack<B> for NemotronH<B> {
    fn op_times(&self) -> OpTimes {
        let mut t = OpTimes::default();
        for l in &self.layers {
            match &l.mixer {
                Mixer::Mamba2(m) => t += m.op_times(),
                Mixer::Ffn(f) => t += f.op_times(),
                Mixer::Attention(_) => {}
            }
        }
        t
    }

    fn final_hidden(&self, be: &B, batch: &ForwardBatch, kv: &mut B::Kv) -> Result<B::Buf> {
        let c = &self.cfg;
        let n = batch.n_tokens();
        let mut x = self.head.embed(be, batch, c.n_embd)?; // (n_tok, n_embd)
        let mut h = be.alloc(n * c.n_embd)?; // (n_tok, n_embd)
        for (il, l) in self.layers.iter().enumerate() {
            be.rms_norm(&x, &l.attn_norm, c.rms_eps, &mut h)?;
            trace(be, "attn_norm", il, &h)?;
            let out = match &l.mixer {
                Mixer::Mamba2(m) => m.forward(be, il, &h, batch, kv, c.n_embd)?.0,
                Mixer::Attention(a) => a.forward(be, il, &h, batch, kv, c.n_embd)?,
                Mixer::Ffn(f) => f.forward(be, &h, n, c.n_embd)?,
            }; // (n_tok, n_embd)
            trace(be, "mixer_out", il, &out)?;
            be.add(&mut x, &out)?;
            trace(be, "l_out", il, &x)?;
        }
        self.head.norm_rows(be, &x, batch, c.n_embd, c.rms_eps)
    }
}
