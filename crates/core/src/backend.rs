//! The `Backend` trait: fused, LLM-level ops over device buffers.
//!
//! Activations are `Buf` (f32, row-major `(n_tok, dim)`), weights are `Weight` (any quant type,
//! ggml layout: `dims[0]` = row length = input features), the KV cache is `Kv` (paged, owned by
//! the engine). A backend that lacks an op returns `CoreError::Unsupported`.

use crate::{ForwardBatch, KvSpec, QuantType, Result, RopeParams};
use quarrel_gguf::Gguf;
use std::sync::Arc;

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

    /// Load (or map) a tensor as a weight.
    fn load_weight(&self, src: WeightSource<'_>) -> Result<Self::Weight>;
    /// `(n_in, n_out)`: row length and number of rows (n_out = product of the other dims).
    fn weight_dims(&self, w: &Self::Weight) -> (usize, usize);
    fn weight_type(&self, w: &Self::Weight) -> QuantType;

    /// A zeroed buffer of `n` f32.
    fn alloc(&self, n: usize) -> Result<Self::Buf>;
    fn upload(&self, src: &[f32]) -> Result<Self::Buf>;
    fn download(&self, src: &Self::Buf) -> Result<Vec<f32>>;
    fn buf_len(&self, b: &Self::Buf) -> usize;
    fn alloc_kv(&self, spec: &KvSpec) -> Result<Self::Kv>;

    /// Rows of an embedding table (`(n_embd, n_vocab)` weight) for `tokens` -> `(n_tok, n_embd)`.
    fn embed(&self, table: &Self::Weight, tokens: &[u32], out: &mut Self::Buf) -> Result<()>;
    /// `out (n_tok, n_out) = x (n_tok, n_in) · Wᵀ`.
    fn matmul(&self, w: &Self::Weight, x: &Self::Buf, n_tok: usize, out: &mut Self::Buf) -> Result<()>;
    /// RMSNorm over rows of `w`'s length, times `w`.
    fn rms_norm(&self, x: &Self::Buf, w: &Self::Weight, eps: f32, out: &mut Self::Buf) -> Result<()>;
    /// Rotate `x (n_tok, n_head, head_dim)` in place by each token's position.
    fn rope(&self, x: &mut Self::Buf, positions: &[u32], n_head: usize, head_dim: usize, p: &RopeParams) -> Result<()>;
    /// `out = silu(gate) * up`.
    fn swiglu(&self, gate: &Self::Buf, up: &Self::Buf, out: &mut Self::Buf) -> Result<()>;
    /// `x += y`.
    fn add(&self, x: &mut Self::Buf, y: &Self::Buf) -> Result<()>;
    /// `x *= s`.
    fn scale(&self, x: &mut Self::Buf, s: f32) -> Result<()>;
    /// Copy rows `rows` of `x (_, dim)` into `out (rows.len(), dim)`.
    fn gather_rows(&self, x: &Self::Buf, dim: usize, rows: &[usize], out: &mut Self::Buf) -> Result<()>;
    /// Write `k`, `v` `(n_tok, n_kv_head * head_dim)` of layer `layer` into the slots given by
    /// each token's position and its sequence's block table.
    fn kv_store(&self, kv: &mut Self::Kv, layer: usize, k: &Self::Buf, v: &Self::Buf, batch: &ForwardBatch) -> Result<()>;
    /// Causal paged attention: every token attends to its sequence's cached positions
    /// `0..=pos` (or the sliding window). `q (n_tok, n_head, head_dim)` -> `out` same shape.
    fn attention(
        &self,
        q: &Self::Buf,
        kv: &Self::Kv,
        layer: usize,
        batch: &ForwardBatch,
        p: &AttnParams,
        out: &mut Self::Buf,
    ) -> Result<()>;
}
