//! Gated feed-forward: `down(act(gate(x)) * up(x))`, act SiLU (SwiGLU) or GELU (GeGLU, Gemma).

use super::{host_f32, split_rows, weight};
use quarrel_core::{Backend, Result};
use quarrel_gguf::Gguf;
use std::sync::Arc;

pub struct SwiGluMlp<B: Backend> {
    pub ffn_gate: B::Weight,
    pub ffn_up: B::Weight,
    pub ffn_down: B::Weight,
    pub n_ff: usize,
    /// The gate's activation (SiLU unless the arch says otherwise).
    pub act: GateAct,
}

/// Activation of a gated feed-forward's gate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GateAct {
    Silu,
    /// tanh-approximated GELU (llama.cpp's `LLM_FFN_GELU` + `LLM_FFN_PAR`).
    Gelu,
}

impl<B: Backend> SwiGluMlp<B> {
    /// Load `blk.{il}.ffn_{gate,up,down}.weight`.
    pub fn load(be: &B, g: &Arc<Gguf>, il: usize, n_embd: usize, n_ff: usize) -> Result<Self> {
        Self::load_suffixed(be, g, il, "", n_embd, n_ff)
    }

    /// Load `blk.{il}.ffn_{gate,up,down}{suffix}.weight` (suffix `""` or `"_shexp"`); without
    /// `ffn_gate`, an `ffn_up` of `2 n_ff` rows holds the gate (first half) and the up
    /// projection (Phi-3), cut in two at load.
    pub fn load_suffixed(be: &B, g: &Arc<Gguf>, il: usize, suffix: &str, n_embd: usize, n_ff: usize) -> Result<Self> {
        let name = |s: &str| format!("blk.{il}.{s}{suffix}.weight");
        let fused = g.tensor_info(&name("ffn_gate")).is_none()
            && g.tensor_info(&name("ffn_up")).is_some_and(|t| t.dims.len() == 2 && t.dims[1] as usize == 2 * n_ff);
        let gate_up =
            if fused { split_rows(g, &name("ffn_up"), &[(name("ffn_gate"), n_ff), (name("ffn_up"), n_ff)])? } else { Arc::clone(g) };
        Ok(SwiGluMlp {
            ffn_gate: weight(be, &gate_up, &name("ffn_gate"), n_embd, n_ff)?,
            ffn_up: weight(be, &gate_up, &name("ffn_up"), n_embd, n_ff)?,
            ffn_down: weight(be, g, &name("ffn_down"), n_ff, n_embd)?,
            n_ff,
            act: GateAct::Silu,
        })
    }

    /// `x (n_tok, n_embd)` -> `(n_tok, n_embd)`.
    pub fn forward(&self, be: &B, x: &B::Buf, n_tok: usize, n_embd: usize) -> Result<B::Buf> {
        let mut g = be.alloc(n_tok * self.n_ff)?; // (n_tok, n_ff)
        let mut u = be.alloc(n_tok * self.n_ff)?; // (n_tok, n_ff)
        be.matmul_many(&[&self.ffn_gate, &self.ffn_up], x, n_tok, &mut [&mut g, &mut u])?;
        let mut h = be.alloc(n_tok * self.n_ff)?;
        match self.act {
            GateAct::Silu => be.swiglu(&g, &u, &mut h)?,
            GateAct::Gelu => be.geglu(&g, &u, &mut h)?,
        }
        let mut out = be.alloc(n_tok * n_embd)?; // (n_tok, n_embd)
        be.matmul(&self.ffn_down, &h, n_tok, &mut out)?;
        Ok(out)
    }
}

/// Ungated feed-forward with a squared ReLU: `down(relu(up(x))²)` (Nemotron-H, Nemotron),
/// with optional biases after each projection.
pub struct ReluSqrMlp<B: Backend> {
    pub ffn_up: B::Weight,
    pub ffn_down: B::Weight,
    pub n_ff: usize,
    /// `ffn_up.bias`, `ffn_down.bias` where loaded ([`ReluSqrMlp::with_biases`]).
    pub bias: [Option<B::Buf>; 2],
}

impl<B: Backend> ReluSqrMlp<B> {
    /// Load `blk.{il}.ffn_{up,down}{suffix}.weight`.
    pub fn load(be: &B, g: &Arc<Gguf>, il: usize, suffix: &str, n_embd: usize, n_ff: usize) -> Result<Self> {
        let name = |s: &str| format!("blk.{il}.{s}{suffix}.weight");
        Ok(ReluSqrMlp {
            ffn_up: weight(be, g, &name("ffn_up"), n_embd, n_ff)?,
            ffn_down: weight(be, g, &name("ffn_down"), n_ff, n_embd)?,
            n_ff,
            bias: [None, None],
        })
    }

    /// Add `blk.{il}.ffn_{up,down}.bias` where the file has them.
    pub fn with_biases(mut self, be: &B, g: &Arc<Gguf>, il: usize, n_embd: usize) -> Result<Self> {
        for ((slot, part), width) in self.bias.iter_mut().zip(["ffn_up", "ffn_down"]).zip([self.n_ff, n_embd]) {
            let name = format!("blk.{il}.{part}.bias");
            if g.tensor_info(&name).is_some() {
                *slot = Some(be.upload(&host_f32(g, &name, width)?)?);
            }
        }
        Ok(self)
    }

    /// `x (n_tok, n_embd)` -> `(n_tok, n_embd)`.
    pub fn forward(&self, be: &B, x: &B::Buf, n_tok: usize, n_embd: usize) -> Result<B::Buf> {
        let mut u = be.alloc(n_tok * self.n_ff)?; // (n_tok, n_ff)
        be.matmul(&self.ffn_up, x, n_tok, &mut u)?;
        if let Some(b) = &self.bias[0] {
            be.add_bias(&mut u, b)?;
        }
        be.relu_sqr(&mut u)?;
        let mut out = be.alloc(n_tok * n_embd)?; // (n_tok, n_embd)
        be.matmul(&self.ffn_down, &u, n_tok, &mut out)?;
        if let Some(b) = &self.bias[1] {
            be.add_bias(&mut out, b)?;
        }
        Ok(out)
    }
}
