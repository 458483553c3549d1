//! `bert`: BERT-family encoders for embeddings (all-MiniLM, bge, e5, gte). Token, learned
//! position and (first) token-type embeddings summed and LayerNorm-ed; post-norm blocks of
//! bidirectional attention with biases and a GELU feed-forward with biases. The output is the
//! hidden states (pooled by the engine as the file's `pooling_type` says): no logits.
//!
//! ```text
//!  x = LN(tok[t] + pos[p] + type[0])
//!  per layer: x = LN(x + o(attn(q(x), k(x), v(x))))      (every token sees its whole text)
//!             x = LN(x + down(gelu(up(x))))
//! ```

use super::common::{n_params, trace, DimDefaults, Dims, Head, LayerStack, StackParts};
use crate::hparams::Hparams;
use crate::layers::attention::SelfAttention;
use crate::layers::{host_f32, weight};
use crate::{Model, ModelInfo};
use quarrel_core::{Backend, CoreError, ForwardBatch, Result, RopeParams, RopeScaling, RopeStyle};
use quarrel_gguf::Gguf;
use std::sync::Arc;

/// A LayerNorm's weight and bias.
pub struct Norm<B: Backend> {
    pub w: B::Weight,
    pub b: B::Weight,
}

impl<B: Backend> Norm<B> {
    fn load(be: &B, g: &Arc<Gguf>, name: &str, n: usize) -> Result<Self> {
        Ok(Norm { w: weight(be, g, &format!("{name}.weight"), n, 1)?, b: weight(be, g, &format!("{name}.bias"), n, 1)? })
    }

    fn apply(&self, be: &B, x: &B::Buf, eps: f32, n: usize) -> Result<B::Buf> {
        let mut out = be.alloc(n)?;
        be.layer_norm(x, &self.w, &self.b, eps, &mut out)?;
        Ok(out)
    }
}

pub struct Layer<B: Backend> {
    pub attn: SelfAttention<B>,
    pub attn_out_norm: Norm<B>,
    pub ffn_up: B::Weight,
    pub ffn_up_b: Option<B::Buf>,
    pub ffn_down: B::Weight,
    pub ffn_down_b: Option<B::Buf>,
    pub layer_out_norm: Norm<B>,
}

pub struct Bert<B: Backend> {
    pub info: ModelInfo,
    pub dims: Dims,
    pub eps: f32,
    pub n_ff: usize,
    pub token_embd: B::Weight,
    pub position_embd: B::Weight,
    /// The first token type's embedding (llama.cpp embeds every token as type 0).
    pub type_row0: Option<B::Buf>,
    pub embd_norm: Norm<B>,
    pub layers: Vec<Layer<B>>,
}

pub fn load<B: Backend>(be: &B, g: &Arc<Gguf>) -> Result<Box<dyn Model<B>>> {
    let h = Hparams::new(g)?;
    let d = Dims::from_hparams(&h, DimDefaults { n_ctx_train: 512, rope_freq_base: 10_000.0, rms_eps: 1e-12 })?;
    let eps = h.f32_or("attention.layer_norm_epsilon", 1e-12)?;
    let n_ff = h.positive("feed_forward_length")?;
    let n_head_kv = d.kv_heads(&h)?;
    if h.opt_bool("attention.causal")? == Some(true) {
        return Err(CoreError::Unsupported("a causal bert model".into()));
    }
    let opt_bias = |name: String, n: usize| -> Result<Option<B::Buf>> {
        match g.tensor_info(&name) {
            Some(_) => Ok(Some(be.upload(&host_f32(g, &name, n)?)?)),
            None => Ok(None),
        }
    };
    let type_row0 = match g.tensor_info("token_types.weight") {
        Some(t) => {
            let all = host_f32(g, "token_types.weight", t.n_elements() as usize)?;
            Some(be.upload(all.get(..d.n_embd).ok_or_else(|| CoreError::Model("token_types.weight has no row".into()))?)?)
        }
        None => None,
    };
    // no rotation: positions enter through position_embd
    let rope =
        RopeParams { style: RopeStyle::Normal, n_rot: 0, freq_base: 0.0, freq_scale: 1.0, freq_factors: None, scaling: RopeScaling::NONE };
    let attn = d.attn_params(n_head_kv, 1.0 / (d.head_dim as f32).sqrt(), None);
    let mut layers = Vec::with_capacity(d.n_layer);
    for il in 0..d.n_layer {
        let mut sa = SelfAttention::load(be, g, il, d.n_embd, attn.clone(), rope.clone())?.with_biases(be, g, il, d.n_embd)?;
        sa.bidirectional = true;
        layers.push(Layer {
            attn: sa,
            attn_out_norm: Norm::load(be, g, &format!("blk.{il}.attn_output_norm"), d.n_embd)?,
            ffn_up: weight(be, g, &format!("blk.{il}.ffn_up.weight"), d.n_embd, n_ff)?,
            ffn_up_b: opt_bias(format!("blk.{il}.ffn_up.bias"), n_ff)?,
            ffn_down: weight(be, g, &format!("blk.{il}.ffn_down.weight"), n_ff, d.n_embd)?,
            ffn_down_b: opt_bias(format!("blk.{il}.ffn_down.bias"), d.n_embd)?,
            layer_out_norm: Norm::load(be, g, &format!("blk.{il}.layer_output_norm"), d.n_embd)?,
        });
    }
    let info = ModelInfo {
        arch: "bert".into(),
        n_vocab: d.n_vocab,
        n_embd: d.n_embd,
        n_layer: d.n_layer,
        n_ctx_train: d.n_ctx_train,
        n_kv_head: n_head_kv,
        head_dim: d.head_dim,
        n_params: n_params(g),
        recurrent: vec![],
        causal: false,
    };
    Ok(Box::new(Bert {
        token_embd: weight(be, g, "token_embd.weight", d.n_embd, d.n_vocab)?,
        position_embd: weight(be, g, "position_embd.weight", d.n_embd, d.n_ctx_train)?,
        type_row0,
        embd_norm: Norm::load(be, g, "token_embd_norm", d.n_embd)?,
        info,
        dims: d,
        eps,
        n_ff,
        layers,
    }))
}

impl<B: Backend> Bert<B> {
    /// Every token's final hidden state `(n_tok, n_embd)`.
    fn encode(&self, be: &B, batch: &ForwardBatch, kv: &mut B::Kv) -> Result<B::Buf> {
        let (n, e) = (batch.n_tokens(), self.dims.n_embd);
        if let Some(&p) = batch.positions.iter().find(|&&p| p as usize >= self.dims.n_ctx_train) {
            return Err(CoreError::Shape(format!("position {p}: this encoder takes at most {} tokens", self.dims.n_ctx_train)));
        }
        let mut x = be.alloc(n * e)?;
        be.embed(&self.token_embd, &batch.tokens, &mut x)?;
        let mut pos = be.alloc(n * e)?;
        be.embed(&self.position_embd, &batch.positions, &mut pos)?;
        be.add(&mut x, &pos)?;
        if let Some(t) = &self.type_row0 {
            be.add_bias(&mut x, t)?;
        }
        let mut h = self.embd_norm.apply(be, &x, self.eps, n * e)?;
        for (il, l) in self.layers.iter().enumerate() {
            let mut a = l.attn.forward(be, il, &h, batch, kv, e)?;
            be.add(&mut a, &h)?;
            let h2 = l.attn_out_norm.apply(be, &a, self.eps, n * e)?;
            let mut u = be.alloc(n * self.n_ff)?;
            be.matmul(&l.ffn_up, &h2, n, &mut u)?;
            if let Some(b) = &l.ffn_up_b {
                be.add_bias(&mut u, b)?;
            }
            be.gelu(&mut u)?;
            let mut f = be.alloc(n * e)?;
            be.matmul(&l.ffn_down, &u, n, &mut f)?;
            if let Some(b) = &l.ffn_down_b {
                be.add_bias(&mut f, b)?;
            }
            be.add(&mut f, &h2)?;
            h = l.layer_out_norm.apply(be, &f, self.eps, n * e)?;
            trace(be, "l_out", il, &h)?;
        }
        Ok(h)
    }
}

impl<B: Backend> StackParts<B> for Bert<B> {
    fn parts(&self) -> (&ModelInfo, Option<&Head<B>>) {
        (&self.info, None)
    }
}

impl<B: Backend> LayerStack<B> for Bert<B> {
    /// The `logits_rows`' final hidden states (each layer ends in its LayerNorm).
    fn final_hidden(&self, be: &B, batch: &ForwardBatch, kv: &mut B::Kv) -> Result<B::Buf> {
        let h = self.encode(be, batch, kv)?;
        let e = self.dims.n_embd;
        let mut rows = be.alloc(batch.logits_rows.len() * e)?;
        be.gather_rows(&h, e, &batch.logits_rows, &mut rows)?;
        Ok(rows)
    }
}
