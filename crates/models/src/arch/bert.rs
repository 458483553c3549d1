//! `bert`: BERT-family encoders for embeddings and reranking (all-MiniLM, bge, e5, gte, BERT
//! cross-encoders). Token, learned position and (first) token-type embeddings summed and
//! LayerNorm-ed; post-norm blocks of bidirectional attention with biases and a GELU
//! feed-forward with biases. The output is the hidden states (pooled by the engine as the
//! file's `pooling_type` says): no logits. A cross-encoder's classification head (`cls`,
//! `cls.output`) turns a pooled first-token state into relevance scores ([`Model::classify`]).
//!
//! [`super::nomic_bert`] is the same encoder with rotary positions and a SwiGLU feed-forward;
//! both load through [`load_variant`].
//!
//! ```text
//!  x = LN(tok[t] + pos[p] + type[0])                   (nomic-bert: no pos; q, k rotated)
//!  per layer: x = LN(x + o(attn(q(x), k(x), v(x))))    (every token sees its whole text)
//!             x = LN(x + down(gelu(up(x))))            (nomic-bert: down(silu(gate(x)) * up(x)))
//!  rank:      score = cls.output(tanh(cls(x[CLS])))
//! ```

use super::common::{n_params, rope_scaling, trace, DimDefaults, Dims, Head, LayerStack, StackParts};
use crate::hparams::Hparams;
use crate::layers::attention::{whole_sequences, SelfAttention};
use crate::layers::{host_f32, opt_weight, weight};
use crate::ModelInfo;
use quarrel_core::{Backend, CoreError, ForwardBatch, Result, RopeParams, RopeScaling, RopeStyle};
use quarrel_gguf::Gguf;
use std::sync::Arc;

/// What distinguishes the encoders that share this file.
#[derive(Clone, Copy, Debug)]
pub struct Variant {
    pub arch: &'static str,
    /// Positions by rotating q and k (NeoX style) instead of a learned `position_embd`.
    pub rotary: bool,
    /// A SwiGLU feed-forward (`ffn_gate`, `ffn_up`, `ffn_down`) instead of GELU(up).
    pub gated: bool,
}

pub const BERT: Variant = Variant { arch: "bert", rotary: false, gated: false };

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

/// A projection and its bias, where the file has one.
pub struct Linear<B: Backend> {
    pub w: B::Weight,
    pub b: Option<B::Buf>,
}

impl<B: Backend> Linear<B> {
    fn load(be: &B, g: &Arc<Gguf>, name: &str, n_in: usize, n_out: usize) -> Result<Self> {
        Ok(Linear { w: weight(be, g, &format!("{name}.weight"), n_in, n_out)?, b: opt_bias(be, g, &format!("{name}.bias"), n_out)? })
    }

    fn opt(be: &B, g: &Arc<Gguf>, name: &str, n_in: usize, n_out: usize) -> Result<Option<Self>> {
        match opt_weight(be, g, &format!("{name}.weight"), n_in, n_out)? {
            Some(w) => Ok(Some(Linear { w, b: opt_bias(be, g, &format!("{name}.bias"), n_out)? })),
            None => Ok(None),
        }
    }

    /// `x (rows, n_in)` -> `(rows, n_out)`.
    fn apply(&self, be: &B, x: &B::Buf, rows: usize, n_out: usize) -> Result<B::Buf> {
        let mut y = be.alloc(rows * n_out)?;
        be.matmul(&self.w, x, rows, &mut y)?;
        if let Some(b) = &self.b {
            be.add_bias(&mut y, b)?;
        }
        Ok(y)
    }
}

fn opt_bias<B: Backend>(be: &B, g: &Arc<Gguf>, name: &str, n: usize) -> Result<Option<B::Buf>> {
    match g.tensor_info(name) {
        Some(_) => Ok(Some(be.upload(&host_f32(g, name, n)?)?)),
        None => Ok(None),
    }
}

pub struct Layer<B: Backend> {
    pub attn: SelfAttention<B>,
    pub attn_out_norm: Norm<B>,
    /// SwiGLU's gate (None: GELU feed-forward).
    pub ffn_gate: Option<B::Weight>,
    pub ffn_up: Linear<B>,
    pub ffn_down: Linear<B>,
    pub layer_out_norm: Norm<B>,
}

/// A cross-encoder's classification head: an optional dense layer with tanh (`cls`), then the
/// projection to the classes (`cls.output`), either of which a file may lack.
pub struct ClassHead<B: Backend> {
    pub dense: Option<Linear<B>>,
    pub out: Option<Linear<B>>,
    pub n_out: usize,
}

pub struct Bert<B: Backend> {
    pub info: ModelInfo,
    pub dims: Dims,
    pub eps: f32,
    pub n_ff: usize,
    pub token_embd: B::Weight,
    /// Learned positions (None: rotary).
    pub position_embd: Option<B::Weight>,
    /// The first token type's embedding (llama.cpp embeds every token as type 0).
    pub type_row0: Option<B::Buf>,
    pub embd_norm: Norm<B>,
    pub layers: Vec<Layer<B>>,
    pub class_head: Option<ClassHead<B>>,
}

pub fn load<B: Backend>(be: &B, g: &Arc<Gguf>) -> Result<Box<dyn crate::Model<B>>> {
    load_variant(be, g, BERT)
}

pub fn load_variant<B: Backend>(be: &B, g: &Arc<Gguf>, v: Variant) -> Result<Box<dyn crate::Model<B>>> {
    let h = Hparams::new(g)?;
    let d = Dims::from_hparams(&h, DimDefaults { n_ctx_train: 512, rope_freq_base: 10_000.0, rms_eps: 1e-12 })?;
    let eps = h.f32_or("attention.layer_norm_epsilon", 1e-12)?;
    let n_ff = h.positive("feed_forward_length")?;
    let n_head_kv = d.kv_heads(&h)?;
    if h.opt_bool("attention.causal")? == Some(true) {
        return Err(CoreError::Unsupported(format!("a causal {} model", v.arch)));
    }
    let type_row0 = match g.tensor_info("token_types.weight") {
        Some(t) => {
            let all = host_f32(g, "token_types.weight", t.n_elements() as usize)?;
            Some(be.upload(all.get(..d.n_embd).ok_or_else(|| CoreError::Model("token_types.weight has no row".into()))?)?)
        }
        None => None,
    };
    let rope = if v.rotary {
        let (freq_scale, scaling) = rope_scaling(&h, "", &[], d.n_rot, d.n_ctx_train, d.rope_freq_base)?;
        RopeParams { style: RopeStyle::Neox, n_rot: d.n_rot, freq_base: d.rope_freq_base, freq_scale, freq_factors: None, scaling }
    } else {
        // no rotation: positions enter through position_embd
        RopeParams { style: RopeStyle::Normal, n_rot: 0, freq_base: 0.0, freq_scale: 1.0, freq_factors: None, scaling: RopeScaling::NONE }
    };
    let attn = d.attn_params(n_head_kv, 1.0 / (d.head_dim as f32).sqrt(), None);
    let mut layers = Vec::with_capacity(d.n_layer);
    for il in 0..d.n_layer {
        let mut sa = SelfAttention::load(be, g, il, d.n_embd, attn.clone(), rope.clone())?.with_biases(be, g, il, d.n_embd)?;
        sa.bidirectional = true;
        let name = |t: &str| format!("blk.{il}.{t}");
        layers.push(Layer {
            attn: sa,
            attn_out_norm: Norm::load(be, g, &name("attn_output_norm"), d.n_embd)?,
            ffn_gate: if v.gated { Some(weight(be, g, &name("ffn_gate.weight"), d.n_embd, n_ff)?) } else { None },
            ffn_up: Linear::load(be, g, &name("ffn_up"), d.n_embd, n_ff)?,
            ffn_down: Linear::load(be, g, &name("ffn_down"), n_ff, d.n_embd)?,
            layer_out_norm: Norm::load(be, g, &name("layer_output_norm"), d.n_embd)?,
        });
    }
    let class_head = class_head(be, g, d.n_embd)?;
    let info = ModelInfo {
        arch: v.arch.into(),
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
        position_embd: if v.rotary { None } else { Some(weight(be, g, "position_embd.weight", d.n_embd, d.n_ctx_train)?) },
        type_row0,
        embd_norm: Norm::load(be, g, "token_embd_norm", d.n_embd)?,
        info,
        dims: d,
        eps,
        n_ff,
        layers,
        class_head,
    }))
}

/// The classification head, if the file has one (`cls.output` gives the class count).
fn class_head<B: Backend>(be: &B, g: &Arc<Gguf>, n_embd: usize) -> Result<Option<ClassHead<B>>> {
    let dense = Linear::opt(be, g, "cls", n_embd, n_embd)?;
    let n_out = match g.tensor_info("cls.output.weight") {
        Some(t) if t.dims.len() == 2 => t.dims[1] as usize,
        Some(t) => return Err(CoreError::Model(format!("cls.output.weight has dims {:?}", t.dims))),
        None => n_embd,
    };
    let out = Linear::opt(be, g, "cls.output", n_embd, n_out)?;
    Ok((dense.is_some() || out.is_some()).then_some(ClassHead { dense, out, n_out }))
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
        if let Some(t) = &self.type_row0 {
            be.add_bias(&mut x, t)?;
        }
        if let Some(pe) = &self.position_embd {
            let mut pos = be.alloc(n * e)?;
            be.embed(pe, &batch.positions, &mut pos)?;
            be.add(&mut x, &pos)?;
        }
        let mut h = self.embd_norm.apply(be, &x, self.eps, n * e)?;
        // every token attends to its whole text: built once for all layers
        let whole = whole_sequences(batch);
        for (il, l) in self.layers.iter().enumerate() {
            let mut a = l.attn.forward_over(be, il, &h, batch, &whole, kv, e)?;
            be.add(&mut a, &h)?;
            let h2 = l.attn_out_norm.apply(be, &a, self.eps, n * e)?;
            let u = match &l.ffn_gate {
                Some(gate) => {
                    let (mut gt, mut up) = (be.alloc(n * self.n_ff)?, be.alloc(n * self.n_ff)?);
                    be.matmul_many(&[gate, &l.ffn_up.w], &h2, n, &mut [&mut gt, &mut up])?;
                    let mut u = be.alloc(n * self.n_ff)?;
                    be.swiglu(&gt, &up, &mut u)?;
                    u
                }
                None => {
                    let mut u = l.ffn_up.apply(be, &h2, n, self.n_ff)?;
                    be.gelu(&mut u)?;
                    u
                }
            };
            let mut f = l.ffn_down.apply(be, &u, n, e)?;
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

    fn n_classes(&self) -> usize {
        self.class_head.as_ref().map_or(0, |c| c.n_out)
    }

    fn classify(&self, be: &B, pooled: &[f32], rows: usize) -> Result<Vec<f32>> {
        let Some(c) = &self.class_head else { return LayerStack::<B>::no_class_head(self) };
        let e = self.dims.n_embd;
        if pooled.len() != rows * e {
            return Err(CoreError::Shape(format!("{} pooled values for {rows} rows of {e}", pooled.len())));
        }
        let mut x = pooled.to_vec();
        if let Some(d) = &c.dense {
            x = be.download(&d.apply(be, &be.upload(&x)?, rows, e)?)?;
            // tanh on the host: a handful of rows per forward
            x.iter_mut().for_each(|v| *v = v.tanh());
        }
        match &c.out {
            Some(o) => be.download(&o.apply(be, &be.upload(&x)?, rows, c.n_out)?),
            None => Ok(x),
        }
    }
}
