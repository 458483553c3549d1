//! Mixture-of-experts feed-forward: router (`ffn_gate_inp`, optional logit bias
//! `ffn_gate_inp.bias`, optional selection bias `exp_probs_b`), experts from 3-D tensors
//! (`ffn_{gate,up,down}_exps`, optional per-expert biases) computed grouped by expert,
//! optional shared expert (`*_shexp`) added; and the `FeedForward` choice per layer.

use super::mlp::{ReluSqrMlp, SwiGluMlp};
use super::{expert_weight, host_f32, weight};
use quarrel_core::{Backend, CoreError, MoeRouting, Result};
use quarrel_gguf::Gguf;
use std::sync::Arc;

/// The experts' activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpertAct {
    /// `down(silu(gate x) * up x)` (Mixtral, Granite).
    SwiGlu,
    /// `down(relu(up x)²)`, no gate tensor (Nemotron-H).
    ReluSqr,
    /// GPT-OSS's clamped SwiGLU ([`quarrel_core::act::swiglu_oai_ref`] with
    /// [`OAI_ALPHA`] and [`OAI_LIMIT`]).
    SwiGluOai,
}

/// GPT-OSS's SwiGLU constants (fixed by the model, not in its files).
pub const OAI_ALPHA: f32 = 1.702;
pub const OAI_LIMIT: f32 = 7.0;

pub struct MoeFfn<B: Backend> {
    pub ffn_gate_inp: B::Weight,
    /// Added to the router logits before the gating (`ffn_gate_inp.bias`).
    pub gate_inp_b: Option<B::Buf>,
    pub exp_probs_b: Option<B::Buf>,
    pub ffn_gate_exps: Option<B::Weight>,
    pub ffn_up_exps: B::Weight,
    pub ffn_down_exps: B::Weight,
    /// Per-expert biases of the gate, up and down matmuls (`ffn_*_exps.bias`), where the file
    /// has them.
    pub exps_b: [Option<B::Buf>; 3],
    pub act: ExpertAct,
    pub routing: MoeRouting,
    pub n_ff_exp: usize,
    /// Model layer (for the backend's per-layer selection counts).
    pub layer: usize,
    /// Routing time (metrics).
    pub route_timer: super::timing::OpTimer,
}

impl<B: Backend> MoeFfn<B> {
    pub fn load(be: &B, g: &Arc<Gguf>, il: usize, n_embd: usize, n_ff_exp: usize, routing: MoeRouting, act: ExpertAct) -> Result<Self> {
        let ne = routing.n_expert;
        let name = |s: &str| format!("blk.{il}.{s}.weight");
        let bias_name = format!("blk.{il}.exp_probs_b.bias");
        let opt_bias = |name: &str, n: usize| -> Result<Option<B::Buf>> {
            match g.tensor_info(name) {
                Some(_) => Ok(Some(be.upload(&host_f32(g, name, n)?)?)),
                None => Ok(None),
            }
        };
        let exp_bias = |part: &str, width: usize| opt_bias(&format!("blk.{il}.ffn_{part}_exps.bias"), width * ne);
        Ok(MoeFfn {
            ffn_gate_inp: weight(be, g, &name("ffn_gate_inp"), n_embd, ne)?,
            gate_inp_b: opt_bias(&format!("blk.{il}.ffn_gate_inp.bias"), ne)?,
            exp_probs_b: opt_bias(&bias_name, ne)?,
            ffn_gate_exps: match act {
                ExpertAct::SwiGlu | ExpertAct::SwiGluOai => Some(expert_weight(be, g, &name("ffn_gate_exps"), n_embd, n_ff_exp, ne)?),
                ExpertAct::ReluSqr => None,
            },
            ffn_up_exps: expert_weight(be, g, &name("ffn_up_exps"), n_embd, n_ff_exp, ne)?,
            ffn_down_exps: expert_weight(be, g, &name("ffn_down_exps"), n_ff_exp, n_embd, ne)?,
            exps_b: [exp_bias("gate", n_ff_exp)?, exp_bias("up", n_ff_exp)?, exp_bias("down", n_embd)?],
            act,
            routing,
            n_ff_exp,
            layer: il,
            route_timer: Default::default(),
        })
    }

    /// `x (n_tok, n_embd)` -> `(n_tok, n_embd)`.
    pub fn forward(&self, be: &B, x: &B::Buf, n_tok: usize, n_embd: usize) -> Result<B::Buf> {
        let mut out = be.alloc(n_tok * n_embd)?; // (n_tok, n_embd)
        self.forward_add(be, x, n_tok, n_embd, &mut out)?;
        Ok(out)
    }

    /// `out (n_tok, n_embd) += experts(x)`: each token's routes added to `out` in route order
    /// (a shared expert's output already in `out` is added to in the same pass: no separate add).
    pub fn forward_add(&self, be: &B, x: &B::Buf, n_tok: usize, n_embd: usize, out: &mut B::Buf) -> Result<()> {
        let ne = self.routing.n_expert;
        let routes = self.route_timer.time(|| self.route(be, x, n_tok))?; // n_tok * n_used
        let r = routes.len();
        let [gate_b, up_b, down_b] = &self.exps_b;
        let mut up = be.alloc(r * self.n_ff_exp)?; // (routes, n_ff_exp)
        be.moe_matmul(&self.ffn_up_exps, ne, x, &routes, true, &mut up)?;
        let h = match &self.ffn_gate_exps {
            Some(gate_w) => {
                let mut gate = be.alloc(r * self.n_ff_exp)?; // (routes, n_ff_exp)
                                                             // both matmuls before the biases: a GPU joins the two (same input and routes)
                be.moe_matmul(gate_w, ne, x, &routes, true, &mut gate)?;
                for (t, b) in [(&mut up, up_b), (&mut gate, gate_b)] {
                    if let Some(b) = b {
                        be.moe_add_bias(t, b, &routes)?;
                    }
                }
                let mut h = be.alloc(r * self.n_ff_exp)?;
                match self.act {
                    ExpertAct::SwiGluOai => be.swiglu_oai(&gate, &up, &mut h, OAI_ALPHA, OAI_LIMIT)?,
                    _ => be.swiglu(&gate, &up, &mut h)?,
                }
                h
            }
            None => {
                if let Some(b) = up_b {
                    be.moe_add_bias(&mut up, b, &routes)?;
                }
                be.relu_sqr(&mut up)?;
                up
            }
        };
        let mut y = be.alloc(r * n_embd)?; // (routes, n_embd)
        be.moe_matmul(&self.ffn_down_exps, ne, &h, &routes, false, &mut y)?;
        if let Some(b) = down_b {
            be.moe_add_bias(&mut y, b, &routes)?;
        }
        be.moe_combine(&y, &routes, out)
    }

    /// The router matmul and the routing (one launch on a GPU where it can: the routing time
    /// includes the matmul); a router with a logit bias adds it between the two.
    fn route(&self, be: &B, x: &B::Buf, n_tok: usize) -> Result<Vec<quarrel_core::Route>> {
        let Some(b) = &self.gate_inp_b else {
            return be.moe_router(self.layer, &self.ffn_gate_inp, x, n_tok, self.exp_probs_b.as_ref(), &self.routing);
        };
        let mut logits = be.alloc(n_tok * self.routing.n_expert)?; // (n_tok, n_expert)
        be.matmul(&self.ffn_gate_inp, x, n_tok, &mut logits)?;
        be.add_bias(&mut logits, b)?;
        be.moe_route(self.layer, &logits, self.exp_probs_b.as_ref(), &self.routing)
    }

    /// ReLU² experts (no gate tensor) plus a ReLU² shared expert, `(n_tok, n_embd)`: the same
    /// ops and sums as the shared expert first then `forward_add`, ordered so that a GPU can
    /// join them (routing, shared up then routed up over the same input: one launch; both
    /// ReLU² back to back: one launch; shared down, routed down, the combine adding to the
    /// shared output).
    pub fn forward_relu_shared(&self, be: &B, x: &B::Buf, n_tok: usize, n_embd: usize, s: &ReluSqrMlp<B>) -> Result<B::Buf> {
        debug_assert!(self.ffn_gate_exps.is_none());
        let ne = self.routing.n_expert;
        let routes = self.route_timer.time(|| self.route(be, x, n_tok))?;
        let mut u = be.alloc(n_tok * s.n_ff)?; // (n_tok, n_ff_shexp)
        be.matmul(&s.ffn_up, x, n_tok, &mut u)?;
        let r = routes.len();
        let mut up = be.alloc(r * self.n_ff_exp)?; // (routes, n_ff_exp)
        be.moe_matmul(&self.ffn_up_exps, ne, x, &routes, true, &mut up)?;
        be.relu_sqr(&mut up)?;
        be.relu_sqr(&mut u)?;
        let mut out = be.alloc(n_tok * n_embd)?; // (n_tok, n_embd)
        be.matmul(&s.ffn_down, &u, n_tok, &mut out)?;
        let mut y = be.alloc(r * n_embd)?; // (routes, n_embd)
        be.moe_matmul(&self.ffn_down_exps, ne, &up, &routes, false, &mut y)?;
        be.moe_combine(&y, &routes, &mut out)?;
        Ok(out)
    }
}

/// The feed-forward part of a layer, as the file has it.
pub enum FeedForward<B: Backend> {
    SwiGlu(SwiGluMlp<B>),
    ReluSqr(ReluSqrMlp<B>),
    /// Experts, plus an optional shared expert whose output is added.
    Moe(MoeFfn<B>, Option<SharedExpert<B>>),
}

impl<B: Backend> FeedForward<B> {
    /// Routing time of an MoE feed-forward (zero for dense ones).
    pub fn op_times(&self) -> super::timing::OpTimes {
        match self {
            FeedForward::Moe(m, _) => super::timing::OpTimes { moe_routing: m.route_timer.get(), ..Default::default() },
            _ => Default::default(),
        }
    }
}

/// What a layer's feed-forward is: dense (`n_ff` wide) or, with `moe`, experts of `n_ff`
/// each plus a shared expert of `n_ff_shexp` (0: none); `act` is every part's activation.
#[derive(Clone, Copy, Debug)]
pub struct FfnSpec<'a> {
    pub act: ExpertAct,
    pub n_ff: usize,
    pub moe: Option<&'a MoeRouting>,
    pub n_ff_shexp: usize,
}

impl<B: Backend> FeedForward<B> {
    /// Load layer `il`'s feed-forward as `spec` says (`ffn_*`, `ffn_*_exps`, `ffn_*_shexp`).
    pub fn load(be: &B, g: &Arc<Gguf>, il: usize, n_embd: usize, spec: FfnSpec<'_>) -> Result<Self> {
        let Some(r) = spec.moe else {
            return Ok(match spec.act {
                ExpertAct::SwiGlu => FeedForward::SwiGlu(SwiGluMlp::load(be, g, il, n_embd, spec.n_ff)?),
                ExpertAct::ReluSqr => FeedForward::ReluSqr(ReluSqrMlp::load(be, g, il, "", n_embd, spec.n_ff)?),
                ExpertAct::SwiGluOai => return Err(CoreError::Unsupported("a dense feed-forward with the clamped SwiGLU".into())),
            });
        };
        let shared = match (spec.n_ff_shexp, spec.act) {
            // shared-expert tensors without their width would be silently left out
            (0, _) if g.tensor_info(&format!("blk.{il}.ffn_down_shexp.weight")).is_some() => {
                return Err(CoreError::Model(format!(
                    "expert_shared_feed_forward_length is 0 or absent, but the file has blk.{il}.ffn_down_shexp.weight"
                )));
            }
            (0, _) => None,
            (n, ExpertAct::SwiGlu) => Some(SharedExpert::SwiGlu(SwiGluMlp::load_suffixed(be, g, il, "_shexp", n_embd, n)?)),
            (n, ExpertAct::ReluSqr) => Some(SharedExpert::ReluSqr(ReluSqrMlp::load(be, g, il, "_shexp", n_embd, n)?)),
            (_, ExpertAct::SwiGluOai) => return Err(CoreError::Unsupported("a shared expert with the clamped SwiGLU".into())),
        };
        Ok(FeedForward::Moe(MoeFfn::load(be, g, il, n_embd, spec.n_ff, r.clone(), spec.act)?, shared))
    }
}

pub enum SharedExpert<B: Backend> {
    SwiGlu(SwiGluMlp<B>),
    ReluSqr(ReluSqrMlp<B>),
}

impl<B: Backend> FeedForward<B> {
    pub fn forward(&self, be: &B, x: &B::Buf, n_tok: usize, n_embd: usize) -> Result<B::Buf> {
        match self {
            FeedForward::SwiGlu(m) => m.forward(be, x, n_tok, n_embd),
            FeedForward::ReluSqr(m) => m.forward(be, x, n_tok, n_embd),
            FeedForward::Moe(moe, None) => moe.forward(be, x, n_tok, n_embd),
            FeedForward::Moe(moe, Some(SharedExpert::ReluSqr(m))) if moe.ffn_gate_exps.is_none() => {
                moe.forward_relu_shared(be, x, n_tok, n_embd, m)
            }
            FeedForward::Moe(moe, Some(s)) => {
                // the shared expert first: the routed experts' combine adds to its output
                let mut out = match s {
                    SharedExpert::SwiGlu(m) => m.forward(be, x, n_tok, n_embd)?,
                    SharedExpert::ReluSqr(m) => m.forward(be, x, n_tok, n_embd)?,
                }; // (n_tok, n_embd)
                moe.forward_add(be, x, n_tok, n_embd, &mut out)?;
                Ok(out)
            }
        }
    }
}

/// MoE metadata common to the architectures (`{arch}.expert_*`).
pub fn routing_from_gguf(
    h: &crate::hparams::Hparams<'_>,
    default_gating: quarrel_core::Gating,
    default_norm: bool,
) -> Result<Option<MoeRouting>> {
    let n_expert = h.usize_or("expert_count", 0)?;
    if n_expert == 0 {
        return Ok(None);
    }
    let n_used = h.usize("expert_used_count")?;
    if n_used == 0 || n_used > n_expert {
        return Err(quarrel_core::CoreError::Model(format!("expert_used_count {n_used} with {n_expert} experts")));
    }
    let gating = match h.opt_usize("expert_gating_func")? {
        Some(id) => quarrel_core::Gating::from_gguf(id as u64)?,
        None => default_gating,
    };
    Ok(Some(MoeRouting {
        n_expert,
        n_used,
        gating,
        norm_weights: h.opt_bool("expert_weights_norm")?.unwrap_or(default_norm),
        scale: h.f32_or("expert_weights_scale", 0.0)?,
    }))
}
