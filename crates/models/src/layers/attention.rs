//! Self-attention with GQA and RoPE over the engine's paged KV cache; optionally projection
//! biases (Qwen2, GPT-OSS), an RMSNorm of each query and key head before RoPE (Gemma 3, Qwen3),
//! the queries scaled before attention (Gemma 3) and a learned sink logit per head (GPT-OSS).

use super::{host_f32, split_rows, weight};
use crate::arch::common::trace;
use quarrel_core::{AttnParams, Backend, ForwardBatch, Result, RopeParams};
use quarrel_gguf::Gguf;
use std::sync::Arc;

pub struct SelfAttention<B: Backend> {
    pub attn_q: B::Weight,
    pub attn_k: B::Weight,
    pub attn_v: B::Weight,
    pub attn_output: B::Weight,
    pub params: AttnParams,
    pub rope: RopeParams,
    /// Per-head RMSNorm of q and k (`attn_q_norm`, `attn_k_norm`: head_dim weights) and its eps.
    pub qk_norm: Option<(B::Weight, B::Weight, f32)>,
    /// Queries multiplied by this after RoPE (the scores then take `params.scale`).
    pub q_scale: Option<f32>,
    /// Biases of the q, k, v and output projections, each where the file has it.
    pub bias: [Option<B::Buf>; 4],
    /// One logit per query head in each softmax's denominator (`attn_sinks`).
    pub sinks: Option<B::Buf>,
    /// Every token attends to every token of its sequence in the batch (encoders), not only to
    /// the positions before it.
    pub bidirectional: bool,
}

impl<B: Backend> SelfAttention<B> {
    /// Load `blk.{il}.attn_{q,k,v,output}.weight`; q, k and v may come fused as
    /// `attn_qkv.weight` (Phi-3), cut into the three at load.
    pub fn load(be: &B, g: &Arc<Gguf>, il: usize, n_embd: usize, params: AttnParams, rope: RopeParams) -> Result<Self> {
        let (nh, nkv, hd) = (params.n_head, params.n_kv_head, params.head_dim);
        let name = |s: &str| format!("blk.{il}.{s}.weight");
        let qkv = match g.tensor_info(&name("attn_qkv")) {
            Some(_) => {
                split_rows(g, &name("attn_qkv"), &[(name("attn_q"), nh * hd), (name("attn_k"), nkv * hd), (name("attn_v"), nkv * hd)])?
            }
            None => Arc::clone(g),
        };
        Ok(SelfAttention {
            attn_q: weight(be, &qkv, &name("attn_q"), n_embd, nh * hd)?,
            attn_k: weight(be, &qkv, &name("attn_k"), n_embd, nkv * hd)?,
            attn_v: weight(be, &qkv, &name("attn_v"), n_embd, nkv * hd)?,
            attn_output: weight(be, g, &name("attn_output"), nh * hd, n_embd)?,
            params,
            rope,
            qk_norm: None,
            q_scale: None,
            bias: [None, None, None, None],
            sinks: None,
            bidirectional: false,
        })
    }

    /// Add the per-head sink logits `blk.{il}.attn_sinks.weight`.
    pub fn with_sinks(mut self, be: &B, g: &Arc<Gguf>, il: usize) -> Result<Self> {
        self.sinks = Some(be.upload(&host_f32(g, &format!("blk.{il}.attn_sinks.weight"), self.params.n_head)?)?);
        Ok(self)
    }

    /// Add the projection biases `blk.{il}.attn_{q,k,v,output}.bias` the file has (q, k and v
    /// possibly fused as `attn_qkv.bias`).
    pub fn with_biases(mut self, be: &B, g: &Arc<Gguf>, il: usize, n_embd: usize) -> Result<Self> {
        let p = &self.params;
        let widths = [p.n_head * p.head_dim, p.n_kv_head * p.head_dim, p.n_kv_head * p.head_dim, n_embd];
        let fused = format!("blk.{il}.attn_qkv.bias");
        if g.tensor_info(&fused).is_some() {
            let all = host_f32(g, &fused, widths[..3].iter().sum())?;
            let (q, rest) = all.split_at(widths[0]);
            let (k, v) = rest.split_at(widths[1]);
            for (slot, part) in self.bias.iter_mut().zip([q, k, v]) {
                *slot = Some(be.upload(part)?);
            }
        }
        for ((slot, part), width) in self.bias.iter_mut().zip(["attn_q", "attn_k", "attn_v", "attn_output"]).zip(widths) {
            let name = format!("blk.{il}.{part}.bias");
            if g.tensor_info(&name).is_some() {
                *slot = Some(be.upload(&host_f32(g, &name, width)?)?);
            }
        }
        Ok(self)
    }

    /// Add the per-head query / key RMSNorms `blk.{il}.attn_{q,k}_norm.weight`.
    pub fn with_qk_norm(mut self, be: &B, g: &Arc<Gguf>, il: usize, eps: f32) -> Result<Self> {
        let hd = self.params.head_dim;
        let name = |s: &str| format!("blk.{il}.{s}.weight");
        self.qk_norm = Some((weight(be, g, &name("attn_q_norm"), hd, 1)?, weight(be, g, &name("attn_k_norm"), hd, 1)?, eps));
        Ok(self)
    }

    /// `x (n_tok, n_embd)` normalized input -> attention output `(n_tok, n_embd)`.
    pub fn forward(&self, be: &B, layer: usize, x: &B::Buf, batch: &ForwardBatch, kv: &mut B::Kv, n_embd: usize) -> Result<B::Buf> {
        if self.bidirectional {
            return self.forward_over(be, layer, x, batch, &whole_sequences(batch), kv, n_embd);
        }
        self.forward_over(be, layer, x, batch, batch, kv, n_embd)
    }

    /// [`forward`](Self::forward) with the attention kernels run over `attn_batch`: `batch`
    /// itself, or for a bidirectional layer [`whole_sequences`] of it (which an encoder builds
    /// once for all its layers).
    #[allow(clippy::too_many_arguments)]
    pub fn forward_over(
        &self,
        be: &B,
        layer: usize,
        x: &B::Buf,
        batch: &ForwardBatch,
        attn_batch: &ForwardBatch,
        kv: &mut B::Kv,
        n_embd: usize,
    ) -> Result<B::Buf> {
        let n = batch.n_tokens();
        let p = &self.params;
        let mut q = be.alloc(n * p.n_head * p.head_dim)?; // (n_tok, n_head, head_dim)
        let mut k = be.alloc(n * p.n_kv_head * p.head_dim)?; // (n_tok, n_kv_head, head_dim)
        let mut v = be.alloc(n * p.n_kv_head * p.head_dim)?; // (n_tok, n_kv_head, head_dim)
        be.matmul_many(&[&self.attn_q, &self.attn_k, &self.attn_v], x, n, &mut [&mut q, &mut k, &mut v])?;
        for (t, b) in [&mut q, &mut k, &mut v].into_iter().zip(&self.bias) {
            if let Some(b) = b {
                be.add_bias(t, b)?;
            }
        }
        if let Some((qn, kn, eps)) = &self.qk_norm {
            trace(be, "Qcur_mm", layer, &q)?;
            // rows of head_dim: each head normalized on its own
            let mut qq = be.alloc(n * p.n_head * p.head_dim)?;
            be.rms_norm(&q, qn, *eps, &mut qq)?;
            q = qq;
            let mut kk = be.alloc(n * p.n_kv_head * p.head_dim)?;
            be.rms_norm(&k, kn, *eps, &mut kk)?;
            k = kk;
            trace(be, "Qcur_normed", layer, &q)?;
            trace(be, "Kcur_normed", layer, &k)?;
        }
        if self.rope.n_rot > 0 {
            // n_rot 0: no positional rotation (Nemotron-H attention layers)
            be.rope(&mut q, &batch.positions, p.n_head, p.head_dim, &self.rope)?;
            be.rope(&mut k, &batch.positions, p.n_kv_head, p.head_dim, &self.rope)?;
        }
        trace(be, "Qcur", layer, &q)?;
        trace(be, "Kcur", layer, &k)?;
        be.kv_store(kv, layer, &k, &v, batch)?;
        if let Some(s) = self.q_scale {
            be.scale(&mut q, s)?;
        }
        let mut o = be.alloc(n * p.n_head * p.head_dim)?; // (n_tok, n_head, head_dim)
        be.attention(&q, kv, layer, attn_batch, p, self.sinks.as_ref(), &mut o)?;
        trace(be, "kqv_out", layer, &o)?;
        let mut out = be.alloc(n * n_embd)?; // (n_tok, n_embd)
        be.matmul(&self.attn_output, &o, n, &mut out)?;
        if let Some(b) = &self.bias[3] {
            be.add_bias(&mut out, b)?;
        }
        Ok(out)
    }
}

/// `batch` with every token's position set to the last position of its sequence in the batch:
/// the causal kernels then let each token see its whole sequence (the cache holds each token
/// at its own position), which is bidirectional attention.
pub fn whole_sequences(batch: &ForwardBatch) -> ForwardBatch {
    let mut b = batch.clone();
    for s in &batch.seqs {
        let range = s.start..s.start + s.len;
        let last = batch.positions[range.clone()].iter().copied().max().unwrap_or(0);
        b.positions[range].iter_mut().for_each(|p| *p = last);
    }
    b
}
