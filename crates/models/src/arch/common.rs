//! What the architecture files share: the embedding / output head (token embeddings in,
//! output norm of the rows that need logits, output projection — tied to the embeddings when
//! the file has no `output.weight`), the model outputs on top of it ([`LayerStack`]: every
//! arch is a [`Model`] through it), the traced intermediate, and the checks every loader
//! makes. Each arch file keeps its own layer loop: that is "what this arch does".
//!
//! ```text
//!  tokens ─Head::embed─► x ─(arch's layers)─► Head::norm_rows ─┬─► Head::logits ─► logits | argmax | sample
//!                         └────── LayerStack::final_hidden ────┘└─► hidden (embeddings)
//! ```

use crate::hparams::Hparams;
use crate::layers::timing::OpTimes;
use crate::layers::{opt_weight, weight};
use crate::{Model, ModelInfo};
use quarrel_core::{AttnParams, Backend, CoreError, ForwardBatch, Result, RopeScaling};
use quarrel_gguf::Gguf;
use std::sync::Arc;

/// `token_embd`, `output_norm` and `output` (None when tied to `token_embd`); with
/// `output_norm_b` the output norm is a LayerNorm with that bias, else an RMSNorm.
pub struct Head<B: Backend> {
    pub token_embd: B::Weight,
    pub output_norm: B::Weight,
    pub output: Option<B::Weight>,
    pub output_norm_b: Option<B::Weight>,
}

impl<B: Backend> Head<B> {
    pub fn load(be: &B, g: &Arc<Gguf>, n_embd: usize, n_vocab: usize) -> Result<Head<B>> {
        Ok(Head {
            token_embd: weight(be, g, "token_embd.weight", n_embd, n_vocab)?,
            output_norm: weight(be, g, "output_norm.weight", n_embd, 1)?,
            output: opt_weight(be, g, "output.weight", n_embd, n_vocab)?,
            output_norm_b: None,
        })
    }

    /// The output norm as a LayerNorm with `output_norm.bias`.
    pub fn with_norm_bias(mut self, be: &B, g: &Arc<Gguf>, n_embd: usize) -> Result<Head<B>> {
        self.output_norm_b = Some(weight(be, g, "output_norm.bias", n_embd, 1)?);
        Ok(self)
    }

    /// The batch's token embeddings: `(n_tok, n_embd)`.
    pub fn embed(&self, be: &B, batch: &ForwardBatch, n_embd: usize) -> Result<B::Buf> {
        let mut x = be.alloc(batch.n_tokens() * n_embd)?; // (n_tok, n_embd)
        be.embed(&self.token_embd, &batch.tokens, &mut x)?;
        Ok(x)
    }

    /// The `logits_rows` of the last hidden state `x`, normed: `(rows, n_embd)`.
    pub fn norm_rows(&self, be: &B, x: &B::Buf, batch: &ForwardBatch, n_embd: usize, eps: f32) -> Result<B::Buf> {
        let rows = batch.logits_rows.len();
        let mut sel = be.alloc(rows * n_embd)?; // (rows, n_embd)
        be.gather_rows(x, n_embd, &batch.logits_rows, &mut sel)?;
        let mut normed = be.alloc(rows * n_embd)?; // (rows, n_embd)
        match &self.output_norm_b {
            Some(b) => be.layer_norm(&sel, &self.output_norm, b, eps, &mut normed)?,
            None => be.rms_norm(&sel, &self.output_norm, eps, &mut normed)?,
        }
        Ok(normed)
    }

    /// The output projection of `rows` normed rows: `(rows, n_vocab)`.
    pub fn logits(&self, be: &B, normed: &B::Buf, rows: usize, n_vocab: usize) -> Result<B::Buf> {
        let mut logits = be.alloc(rows * n_vocab)?; // (rows, n_vocab)
        be.matmul(self.output.as_ref().unwrap_or(&self.token_embd), normed, rows, &mut logits)?;
        Ok(logits)
    }
}

/// The decoder shape that the attention architectures read under the same keys: widths, the
/// query heads, rotated dimensions, vocabulary, trained context, RoPE base and RMSNorm
/// epsilon. The KV heads are each architecture's (one count, or one per layer).
#[derive(Clone, Debug)]
pub struct Dims {
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub head_dim: usize,
    pub n_rot: usize,
    pub n_vocab: usize,
    pub n_ctx_train: usize,
    pub rope_freq_base: f32,
    pub rms_eps: f32,
}

/// An architecture's values for the [`Dims`] keys a file may leave out.
#[derive(Clone, Copy, Debug)]
pub struct DimDefaults {
    /// `context_length`.
    pub n_ctx_train: usize,
    /// `rope.freq_base`.
    pub rope_freq_base: f32,
    /// `attention.layer_norm_rms_epsilon`.
    pub rms_eps: f32,
}

impl Dims {
    pub fn from_hparams(h: &Hparams, d: DimDefaults) -> Result<Dims> {
        let n_embd = h.positive("embedding_length")?;
        let n_layer = h.block_count()?;
        let n_head = h.positive("attention.head_count")?;
        let head_dim = head_dim(h, n_embd, n_head)?;
        Ok(Dims {
            n_embd,
            n_layer,
            n_head,
            head_dim,
            n_rot: h.rope_dims(head_dim)?,
            n_vocab: h.n_vocab()?,
            n_ctx_train: h.usize_or("context_length", d.n_ctx_train)?,
            rope_freq_base: h.f32_or("rope.freq_base", d.rope_freq_base)?,
            rms_eps: h.f32_or("attention.layer_norm_rms_epsilon", d.rms_eps)?,
        })
    }

    /// `attention.head_count_kv` as one count for every layer (default: all heads), checked
    /// for grouped-query attention.
    pub fn kv_heads(&self, h: &Hparams) -> Result<usize> {
        let (n_head, n_head_kv) = (self.n_head, h.usize_or("attention.head_count_kv", self.n_head)?);
        if n_head_kv == 0 || n_head % n_head_kv != 0 {
            return Err(CoreError::Model(format!("head_count {n_head} is not a multiple of head_count_kv {n_head_kv}")));
        }
        Ok(n_head_kv)
    }

    /// Attention over these heads and `n_kv_head` KV heads, scores multiplied by `scale`, no
    /// soft cap.
    pub fn attn_params(&self, n_kv_head: usize, scale: f32, sliding_window: Option<usize>) -> AttnParams {
        AttnParams { n_head: self.n_head, n_kv_head, head_dim: self.head_dim, scale, sliding_window, softcap: None }
    }

    /// The [`ModelInfo`] of a model of this shape whose cache holds `n_kv_head` heads a layer.
    pub fn model_info(&self, g: &Gguf, arch: &str, n_kv_head: usize) -> ModelInfo {
        model_info(g, arch, self.n_vocab, self.n_embd, self.n_layer, self.n_ctx_train, (n_kv_head, self.head_dim))
    }
}

/// An architecture's loaded model: its config `C`, description, head and layers `L`.
pub struct Stack<B: Backend, C, L> {
    pub cfg: C,
    pub info: ModelInfo,
    pub head: Head<B>,
    pub layers: Vec<L>,
}

/// The model's description and its head: what [`LayerStack`]'s provided methods read, the
/// same fields of every [`Stack`].
pub trait StackParts<B: Backend> {
    /// The description and the output head (None: an encoder, which has no logits).
    fn parts(&self) -> (&ModelInfo, Option<&Head<B>>);
}

impl<B: Backend, C, L> StackParts<B> for Stack<B, C, L> {
    fn parts(&self) -> (&ModelInfo, Option<&Head<B>>) {
        (&self.info, Some(&self.head))
    }
}

/// What an architecture file implements: its layer stack up to the output norm, and its head.
/// Every `LayerStack` is a [`Model`] (the impl below), so the outputs are computed one way for
/// every arch: logits are the head's projection of [`final_hidden`](LayerStack::final_hidden),
/// the engine picks on them where they lie (`Model::logits`, then `Backend::argmax_rows` /
/// `Backend::sample_rows`: a device backend downloads only the ids), and `hidden` downloads
/// the normed rows.
pub trait LayerStack<B: Backend>: StackParts<B> + Send + Sync {
    fn info(&self) -> &ModelInfo {
        self.parts().0
    }
    fn head(&self) -> Option<&Head<B>> {
        self.parts().1
    }
    /// The layers, then the output norm of the `logits_rows`: `(rows, n_embd)`.
    fn final_hidden(&self, be: &B, batch: &ForwardBatch, kv: &mut B::Kv) -> Result<B::Buf>;
    /// The logits of the `logits_rows`, left on the backend: `(rows, n_vocab)`. Default: the
    /// head's projection of `final_hidden`; an arch that transforms its logits (Granite's
    /// `logit_scale`) overrides this.
    fn logits(&self, be: &B, batch: &ForwardBatch, kv: &mut B::Kv) -> Result<B::Buf> {
        let head = self.head().ok_or_else(|| {
            CoreError::Unsupported(format!("{} is an embedding model: it has no logits to generate text with", self.info().arch))
        })?;
        let normed = self.final_hidden(be, batch, kv)?;
        head.logits(be, &normed, batch.logits_rows.len(), self.info().n_vocab)
    }
    /// MoE routing and Mamba2 conv / scan time since load (zero for stacks without them).
    fn op_times(&self) -> OpTimes {
        OpTimes::default()
    }
    /// See [`Model::set_context_len`].
    fn set_context_len(&mut self, _n_ctx: usize) {}
    /// See [`Model::n_classes`].
    fn n_classes(&self) -> usize {
        0
    }
    /// See [`Model::classify`].
    fn classify(&self, _be: &B, _pooled: &[f32], _rows: usize) -> Result<Vec<f32>> {
        self.no_class_head()
    }
    /// The error of a model asked to classify that cannot.
    fn no_class_head(&self) -> Result<Vec<f32>> {
        Err(CoreError::Unsupported(format!("{} has no classification head: it is not a reranking (cross-encoder) model", self.info().arch)))
    }
}

impl<B: Backend, S: LayerStack<B>> Model<B> for S {
    fn info(&self) -> &ModelInfo {
        LayerStack::info(self)
    }

    fn set_context_len(&mut self, n_ctx: usize) {
        LayerStack::set_context_len(self, n_ctx)
    }

    fn forward(&self, be: &B, batch: &ForwardBatch, kv: &mut B::Kv) -> Result<Vec<f32>> {
        be.download(&LayerStack::logits(self, be, batch, kv)?)
    }

    fn logits(&self, be: &B, batch: &ForwardBatch, kv: &mut B::Kv) -> Result<B::Buf> {
        LayerStack::logits(self, be, batch, kv)
    }

    fn hidden(&self, be: &B, batch: &ForwardBatch, kv: &mut B::Kv) -> Result<Vec<f32>> {
        be.download(&self.final_hidden(be, batch, kv)?)
    }

    fn op_times(&self) -> OpTimes {
        LayerStack::op_times(self)
    }

    fn n_classes(&self) -> usize {
        LayerStack::n_classes(self)
    }

    fn classify(&self, be: &B, pooled: &[f32], rows: usize) -> Result<Vec<f32>> {
        LayerStack::classify(self, be, pooled, rows)
    }
}

/// Record a named intermediate of layer `il` (downloads only when tracing is on).
pub fn trace<B: Backend>(be: &B, name: &str, il: usize, t: &B::Buf) -> Result<()> {
    if quarrel_core::trace::enabled() {
        quarrel_core::trace::trace(name, il, &be.download(t)?);
    }
    Ok(())
}

/// Every weight's element count: `ModelInfo::n_params`.
pub fn n_params(g: &Gguf) -> u64 {
    g.tensors().iter().map(|t| t.n_elements()).sum()
}

/// The `ModelInfo` of a model of `arch` from `g` without recurrent layers (`n_params`
/// counted from the file); `kv`: the attention layers' (`n_kv_head`, `head_dim`).
pub fn model_info(
    g: &Gguf,
    arch: &str,
    n_vocab: usize,
    n_embd: usize,
    n_layer: usize,
    n_ctx_train: usize,
    kv: (usize, usize),
) -> ModelInfo {
    let (n_kv_head, head_dim) = kv;
    ModelInfo {
        arch: arch.into(),
        n_vocab,
        n_embd,
        n_layer,
        n_ctx_train,
        n_kv_head,
        head_dim,
        n_params: n_params(g),
        recurrent: vec![],
        causal: true,
    }
}

/// Attention over every earlier position without softcapping, scaled by `attention.scale`
/// from the file (`file_scale`), 0 meaning the usual `1 / sqrt(head_dim)`.
pub fn full_attention(n_head: usize, n_kv_head: usize, head_dim: usize, file_scale: f32) -> AttnParams {
    let scale = if file_scale == 0.0 { 1.0 / (head_dim as f32).sqrt() } else { file_scale };
    AttnParams { n_head, n_kv_head, head_dim, scale, sliding_window: None, softcap: None }
}

/// `attention.key_length`, by default `n_embd / n_head`; a head count above the embedding
/// width would leave heads of no values.
pub fn head_dim(h: &Hparams, n_embd: usize, n_head: usize) -> Result<usize> {
    let head_dim = h.usize_or("attention.key_length", n_embd / n_head)?;
    if head_dim == 0 {
        let (kh, ke) = (h.key("attention.head_count"), h.key("embedding_length"));
        return Err(CoreError::Model(format!("{kh} = {n_head} leaves heads of no values ({ke} = {n_embd}, no key_length)")));
    }
    Ok(head_dim)
}

/// The RoPE frequency scale of `rope.scaling.type`: 1 for none, `1 / rope.scaling.factor`
/// for linear (a factor of 0 means none, as in llama.cpp), 1 for the `carried` types
/// (applied elsewhere); others are unsupported (`who` prefixes the error).
pub fn rope_freq_scale(h: &Hparams, who: &str, carried: &[&str]) -> Result<f32> {
    Ok(rope_scaling(h, who, carried, 0, 0, 1.0)?.0)
}

/// `rope.scaling.*` as llama.cpp applies it: the frequency scale (`1 / factor` for `linear`
/// and `yarn`, also when a factor comes without a type; 1 for none and for the `carried`
/// types, whose scaling is applied elsewhere) and the magnitude / YaRN settings for `n_rot`
/// rotated dimensions (`original_context_length`, default the trained context; YaRN's betas
/// 32 and 1; `attn_factor` multiplied in for every type).
pub fn rope_scaling(
    h: &Hparams,
    who: &str,
    carried: &[&str],
    n_rot: usize,
    n_ctx_train: usize,
    freq_base: f32,
) -> Result<(f32, RopeScaling)> {
    let factor = h.f32_or("rope.scaling.factor", 0.0)?;
    let scale = if factor == 0.0 { 1.0 } else { 1.0 / factor };
    let attn_factor = h.f32_or("rope.scaling.attn_factor", 1.0)?;
    let (freq_scale, mut scaling) = match h.opt_str("rope.scaling.type")? {
        None | Some("linear") => (scale, RopeScaling::NONE),
        Some("none") => (1.0, RopeScaling::NONE),
        Some("yarn") => {
            let n_ctx_orig = h.usize_or("rope.scaling.original_context_length", n_ctx_train)?;
            (scale, RopeScaling::yarn(n_rot, n_ctx_orig, freq_base, 1.0 / scale, 32.0, 1.0, 1.0))
        }
        Some(t) if carried.contains(&t) => (1.0, RopeScaling::NONE),
        Some(other) => return Err(CoreError::Unsupported(format!("{who}rope scaling type {other:?}"))),
    };
    scaling.attn_factor *= attn_factor;
    Ok((freq_scale, scaling))
}

/// Which layers slide: `attention.sliding_window_pattern` as a per-layer array (nonzero /
/// true: sliding) or a period `n` (layer `il` slides unless `il % n == n - 1`; 0: all slide),
/// by default `default_period` (the architecture's, as llama.cpp sets it).
pub fn swa_layers(h: &Hparams, n_layer: usize, default_period: usize) -> Result<Vec<bool>> {
    let key = format!("{}.attention.sliding_window_pattern", h.arch);
    if let Some(items) = h.g.get_array(&key).ok().flatten() {
        if items.len() != n_layer {
            return Err(CoreError::Model(format!("{key} has {} values for {n_layer} layers", items.len())));
        }
        return items
            .iter()
            .map(|v| v.as_u64().map(|x| x != 0).or_else(|| v.as_bool()).ok_or_else(|| CoreError::Model(format!("{key}: not a flag"))))
            .collect();
    }
    let n = h.usize_or("attention.sliding_window_pattern", default_period)?;
    Ok((0..n_layer).map(|il| n == 0 || il % n < n - 1).collect())
}

/// Reject optional tensors of layer `il` that this implementation does not apply (biases,
/// extra projections), instead of silently computing something else.
pub fn reject_tensors(g: &Gguf, il: usize, suffixes: &[&str]) -> Result<()> {
    for t in suffixes {
        let name = format!("blk.{il}.{t}");
        if g.tensor_info(&name).is_some() {
            return Err(CoreError::Unsupported(format!("tensor {name}")));
        }
    }
    Ok(())
}
