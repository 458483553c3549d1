//! The `Backend` trait: fused, LLM-level ops over device buffers.
//!
//! Activations are `Buf` (f32, row-major `(n_tok, dim)`), weights are `Weight` (any quant type,
//! ggml layout: `dims[0]` = row length = input features), the KV cache is `Kv` (paged, owned by
//! the engine). A backend that lacks an op returns `CoreError::Unsupported`.

use crate::{CoreError, ForwardBatch, KvSpec, MoeRouting, QuantType, Result, RopeParams, Route, SsmParams, StateSpec};
use quarrel_gguf::Gguf;
use std::sync::Arc;

/// Index of the largest value: the first on ties, NaN never chosen unless at index 0 (the
/// scan `v > best` of llama.cpp's greedy sampler; what `Backend::argmax_rows` must match).
pub fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// Where a weight comes from: a tensor of an opened GGUF file.
#[derive(Clone, Copy)]
pub struct WeightSource<'a> {
    pub gguf: &'a Arc<Gguf>,
    pub name: &'a str,
}

/// Attention shape and options.
#[derive(Clone, Debug)]
pub struct AttnParams {
    pub n_head: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    /// Multiplier of q·k (usually 1/sqrt(head_dim)).
    pub scale: f32,
    /// Attend only to the last `w` positions (`w` includes the token itself).
    pub sliding_window: Option<usize>,
    /// `softcap * tanh(s / softcap)` on the scores (Gemma 2).
    pub softcap: Option<f32>,
}

pub trait Backend: Send + Sync + 'static {
    /// f32 activations on the device.
    type Buf: Send + Sync;
    /// A weight matrix or vector, in its stored quant type.
    type Weight: Send + Sync;
    /// The paged KV cache of all attention layers.
    type Kv: Send + Sync;

    /// Human-readable name ("cpu (avx512vnni, 2 threads)").
    fn name(&self) -> String;

    /// Whether a forward pass keeps the host's cores busy (a CPU backend), or leaves them free
    /// for host work that overlaps it (a device backend).
    fn computes_on_host(&self) -> bool {
        true
    }

    /// Load (or map) a tensor as a weight.
    fn load_weight(&self, src: WeightSource<'_>) -> Result<Self::Weight>;
    /// `(n_in, n_out)`: row length and number of rows (n_out = product of the other dims).
    fn weight_dims(&self, w: &Self::Weight) -> (usize, usize);
    fn weight_type(&self, w: &Self::Weight) -> QuantType;

    /// A zeroed buffer of `n` f32.
    fn alloc(&self, n: usize) -> Result<Self::Buf>;
    fn upload(&self, src: &[f32]) -> Result<Self::Buf>;
    fn download(&self, src: &Self::Buf) -> Result<Vec<f32>>;
    /// Greedy picks: per row of `dim` values of `x`, the index of the largest (see `argmax`).
    /// A device backend overrides this to return only the indices (no logits download).
    fn argmax_rows(&self, x: &Self::Buf, dim: usize) -> Result<Vec<u32>> {
        let v = self.download(x)?;
        if dim == 0 || v.len() % dim != 0 {
            return Err(CoreError::Shape(format!("argmax_rows: {} values are not rows of {dim}", v.len())));
        }
        Ok(v.chunks(dim).map(argmax).collect())
    }
    /// Sampled picks: per row of `dim` values of `x`, the token its `SampleRow` chain picks
    /// among the tokens its mask allows (`sample::sample_masked_ref`, which a device backend
    /// must match; only the ids need to leave the device). `masks` may still be computed on
    /// other threads: a device backend starts the work queued before it waits for them.
    /// Default: download, then the reference.
    fn sample_rows(&self, x: &Self::Buf, dim: usize, rows: &[crate::SampleRow], masks: crate::RowMasks) -> Result<Vec<u32>> {
        let v = self.download(x)?;
        if dim == 0 || v.len() != dim * rows.len() || masks.len() != rows.len() {
            return Err(CoreError::Shape(format!(
                "sample_rows: {} values are not {} rows of {dim} ({} masks)",
                v.len(),
                rows.len(),
                masks.len()
            )));
        }
        let masks = masks.wait()?;
        Ok(v.chunks(dim).zip(rows).zip(&masks).map(|((l, r), m)| crate::sample_masked_ref(l, r, m.as_ref())).collect())
    }
    fn buf_len(&self, b: &Self::Buf) -> usize;
    fn alloc_kv(&self, spec: &KvSpec) -> Result<Self::Kv>;

    /// Rows of an embedding table (`(n_embd, n_vocab)` weight) for `tokens` -> `(n_tok, n_embd)`.
    fn embed(&self, table: &Self::Weight, tokens: &[u32], out: &mut Self::Buf) -> Result<()>;
    /// `out (n_tok, n_out) = x (n_tok, n_in) · Wᵀ`.
    fn matmul(&self, w: &Self::Weight, x: &Self::Buf, n_tok: usize, out: &mut Self::Buf) -> Result<()>;
    /// `outs[i] = x · W_iᵀ` for weights that share their input (Q/K/V, gate/up): each output
    /// exactly as `matmul` gives it, but a backend may quantize `x` once and run all of them
    /// as one parallel job. Default: one `matmul` per weight.
    fn matmul_many(&self, ws: &[&Self::Weight], x: &Self::Buf, n_tok: usize, outs: &mut [&mut Self::Buf]) -> Result<()> {
        if ws.len() != outs.len() {
            return Err(CoreError::Shape(format!("matmul_many: {} weights, {} outputs", ws.len(), outs.len())));
        }
        ws.iter().zip(outs.iter_mut()).try_for_each(|(w, o)| self.matmul(w, x, n_tok, o))
    }
    /// RMSNorm over rows of `w`'s length, times `w`.
    fn rms_norm(&self, x: &Self::Buf, w: &Self::Weight, eps: f32, out: &mut Self::Buf) -> Result<()>;
    /// LayerNorm over rows of `w`'s length (mean removed, divided by the deviation), times
    /// `w`, plus `b` (ggml's `norm`, `mul`, `add`).
    fn layer_norm(&self, x: &Self::Buf, w: &Self::Weight, b: &Self::Weight, eps: f32, out: &mut Self::Buf) -> Result<()>;
    /// Rotate `x (n_tok, n_head, head_dim)` in place by each token's position.
    fn rope(&self, x: &mut Self::Buf, positions: &[u32], n_head: usize, head_dim: usize, p: &RopeParams) -> Result<()>;
    /// `out = silu(gate) * up`.
    fn swiglu(&self, gate: &Self::Buf, up: &Self::Buf, out: &mut Self::Buf) -> Result<()>;
    /// `out = gelu(gate) * up` with llama.cpp's f16-table GELU ([`crate::act`]).
    fn geglu(&self, gate: &Self::Buf, up: &Self::Buf, out: &mut Self::Buf) -> Result<()>;
    /// `x += y`.
    fn add(&self, x: &mut Self::Buf, y: &Self::Buf) -> Result<()>;
    /// `x (rows, b.len()) += b` on every row (projection biases).
    fn add_bias(&self, x: &mut Self::Buf, b: &Self::Buf) -> Result<()>;
    /// `x *= s`.
    fn scale(&self, x: &mut Self::Buf, s: f32) -> Result<()>;
    /// `x += s·y`, the product rounded before the add (no FMA: scale-then-add's bits); `y` may
    /// be left scaled (the default scales it in place) or as it was.
    fn add_scaled(&self, x: &mut Self::Buf, y: &mut Self::Buf, s: f32) -> Result<()> {
        self.scale(y, s)?;
        self.add(x, y)
    }
    /// Copy rows `rows` of `x (_, dim)` into `out (rows.len(), dim)`.
    fn gather_rows(&self, x: &Self::Buf, dim: usize, rows: &[usize], out: &mut Self::Buf) -> Result<()>;
    /// Write `k`, `v` `(n_tok, n_kv_head * head_dim)` of layer `layer` into the slots given by
    /// each token's position and its sequence's block table.
    fn kv_store(&self, kv: &mut Self::Kv, layer: usize, k: &Self::Buf, v: &Self::Buf, batch: &ForwardBatch) -> Result<()>;
    /// Causal paged attention: every token attends to its sequence's cached positions
    /// `0..=pos` (or the sliding window). `q (n_tok, n_head, head_dim)` -> `out` same shape.
    /// `sinks` (one logit per query head, GPT-OSS): an extra score in each head's softmax
    /// denominator that attends to nothing.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        q: &Self::Buf,
        kv: &Self::Kv,
        layer: usize,
        batch: &ForwardBatch,
        p: &AttnParams,
        sinks: Option<&Self::Buf>,
        out: &mut Self::Buf,
    ) -> Result<()>;

    // ---- mixture of experts -------------------------------------------------------------

    /// Route `logits (n_tok, n_expert)` of model layer `layer` (plus the optional selection
    /// `bias (n_expert)`): `n_tok * n_used` routes, token-major (see
    /// `quarrel_core::moe::route_reference`). Backends count selections per (layer, expert).
    /// A device backend may keep the experts and weights on the device and return routes whose
    /// `expert` / `weight` are placeholders (token order intact) that only its own `moe_matmul`
    /// and `moe_combine` resolve: pass the routes back unchanged, do not read them.
    fn moe_route(&self, _layer: usize, _logits: &Self::Buf, _bias: Option<&Self::Buf>, _p: &MoeRouting) -> Result<Vec<Route>> {
        Err(CoreError::Unsupported(format!("{}: moe_route", self.name())))
    }
    /// The router matmul and the routing in one call: `logits = x (n_tok, n_in) · wᵀ`
    /// (`w`: `(n_in, n_expert)`), then `moe_route(layer, logits, bias, p)`. A device backend
    /// may compute both in one launch (the same logits and routes); the default runs them in turn.
    fn moe_router(
        &self,
        layer: usize,
        w: &Self::Weight,
        x: &Self::Buf,
        n_tok: usize,
        bias: Option<&Self::Buf>,
        p: &MoeRouting,
    ) -> Result<Vec<Route>> {
        let mut logits = self.alloc(n_tok * p.n_expert)?; // (n_tok, n_expert)
        self.matmul(w, x, n_tok, &mut logits)?;
        self.moe_route(layer, &logits, bias, p)
    }
    /// Expert selections counted so far: `counts[layer][expert]` (empty rows for layers
    /// without experts).
    fn moe_selections(&self) -> Result<Vec<Vec<u64>>> {
        Err(CoreError::Unsupported(format!("{}: moe_selections", self.name())))
    }
    /// Grouped expert matmul over a 3-D weight `(n_in, n_out, n_expert)` used in place:
    /// `out (routes.len(), n_out)`, row `i` = `x[src] · W[routes[i].expert]ᵀ` where `src` is
    /// `routes[i].token` when `x_per_token` (x is `(n_tok, n_in)`), else `i` (x is
    /// `(routes.len(), n_in)`). Each expert's weights are read once for all its rows.
    fn moe_matmul(
        &self,
        _w: &Self::Weight,
        _n_expert: usize,
        _x: &Self::Buf,
        _routes: &[Route],
        _x_per_token: bool,
        _out: &mut Self::Buf,
    ) -> Result<()> {
        Err(CoreError::Unsupported(format!("{}: moe_matmul", self.name())))
    }
    /// `out[token] += weight * y[i]` for every route `i`; `y (routes.len(), dim)`.
    fn moe_combine(&self, _y: &Self::Buf, _routes: &[Route], _out: &mut Self::Buf) -> Result<()> {
        Err(CoreError::Unsupported(format!("{}: moe_combine", self.name())))
    }
    /// `y (routes.len(), width) += bias[routes[i].expert]` for every route `i`, with `bias`
    /// `(n_expert, width)`: per-expert biases of an expert matmul (GPT-OSS).
    fn moe_add_bias(&self, _y: &mut Self::Buf, _bias: &Self::Buf, _routes: &[Route]) -> Result<()> {
        Err(CoreError::Unsupported(format!("{}: moe_add_bias", self.name())))
    }
    /// `x = gelu(x)` in place with llama.cpp's f16-table GELU ([`crate::act::gelu_ref`]; BERT's
    /// feed-forward).
    fn gelu(&self, _x: &mut Self::Buf) -> Result<()> {
        Err(CoreError::Unsupported(format!("{}: gelu", self.name())))
    }
    /// GPT-OSS's clamped SwiGLU ([`crate::act::swiglu_oai_ref`]).
    fn swiglu_oai(&self, _gate: &Self::Buf, _up: &Self::Buf, _out: &mut Self::Buf, _alpha: f32, _limit: f32) -> Result<()> {
        Err(CoreError::Unsupported(format!("{}: swiglu_oai", self.name())))
    }
    /// `x = relu(x)²` in place (Nemotron-H feed-forward).
    fn relu_sqr(&self, _x: &mut Self::Buf) -> Result<()> {
        Err(CoreError::Unsupported(format!("{}: relu_sqr", self.name())))
    }

    // ---- recurrent (Mamba2) layers ------------------------------------------------------

    /// Give `kv` recurrent state storage for `spec` (zeroed).
    fn alloc_state(&self, _kv: &mut Self::Kv, _spec: &StateSpec) -> Result<()> {
        Err(CoreError::Unsupported(format!("{}: recurrent state", self.name())))
    }
    /// Recurrent state held by `kv`: (bytes allocated, non-finite values met in SSM state so far).
    fn state_stats(&self, _kv: &Self::Kv) -> Result<(u64, u64)> {
        Err(CoreError::Unsupported(format!("{}: recurrent state", self.name())))
    }
    /// Copy every recurrent layer's state of slot `src` to slot `dst` (prefix checkpoints).
    fn state_copy(&self, _kv: &mut Self::Kv, _src: usize, _dst: usize) -> Result<()> {
        Err(CoreError::Unsupported(format!("{}: recurrent state", self.name())))
    }
    /// Causal depthwise conv1d of layer `layer` over the `xBC` columns of `zxbcdt
    /// (n_tok, d_in_proj)`, continuing each sequence's carried conv state (slot
    /// `batch.state_slots[s]`, reset when the sequence starts at position 0), plus bias, then
    /// SiLU -> `out (n_tok, conv_dim)`. `w (conv_dim * d_conv)`, `bias (conv_dim)`.
    #[allow(clippy::too_many_arguments)]
    fn ssm_conv(
        &self,
        _kv: &mut Self::Kv,
        _layer: usize,
        _p: &SsmParams,
        _zxbcdt: &Self::Buf,
        _w: &Self::Buf,
        _bias: Option<&Self::Buf>,
        _batch: &ForwardBatch,
        _out: &mut Self::Buf,
    ) -> Result<()> {
        Err(CoreError::Unsupported(format!("{}: ssm_conv", self.name())))
    }
    /// Selective scan of layer `layer`: `xbc (n_tok, conv_dim)` from `ssm_conv`, raw dt from
    /// the last `n_head` columns of `zxbcdt`, per-head `a`, `d`, `dt_bias` (`n_head` each);
    /// continues each sequence's ssm state -> `y (n_tok, d_inner)` including the D skip.
    /// Returns the number of non-finite values met in the state (0 when healthy).
    #[allow(clippy::too_many_arguments)]
    fn ssm_scan(
        &self,
        _kv: &mut Self::Kv,
        _layer: usize,
        _p: &SsmParams,
        _xbc: &Self::Buf,
        _zxbcdt: &Self::Buf,
        _a: &Self::Buf,
        _d: &Self::Buf,
        _dt_bias: &Self::Buf,
        _batch: &ForwardBatch,
        _y: &mut Self::Buf,
    ) -> Result<u64> {
        Err(CoreError::Unsupported(format!("{}: ssm_scan", self.name())))
    }
    /// `out = rmsnorm over groups of d_inner/n_group (silu(z) * y) * w`, z the first
    /// `d_inner` columns of `zxbcdt`; `w (d_inner)`.
    fn ssm_gated_norm(&self, _p: &SsmParams, _y: &Self::Buf, _zxbcdt: &Self::Buf, _w: &Self::Buf, _out: &mut Self::Buf) -> Result<()> {
        Err(CoreError::Unsupported(format!("{}: ssm_gated_norm", self.name())))
    }
}
