//! Mamba2 mixer: `ssm_in` projection -> (z, xBC, dt); causal depthwise conv1d over xBC with
//! carried state + bias + SiLU; selective scan (per-head A, dt bias + softplus, D skip,
//! grouped B/C) over the carried ssm state; gated grouped RMSNorm (`ssm_norm`) with z;
//! `ssm_out` projection. The state lives in the engine's cache (`Backend::alloc_state`).

use super::{host_f32, weight};
use quarrel_core::trace::trace;
use quarrel_core::{Backend, ForwardBatch, Result, SsmParams};
use quarrel_gguf::Gguf;
use std::sync::Arc;

pub struct Mamba2<B: Backend> {
    pub p: SsmParams,
    pub ssm_in: B::Weight,
    /// `(conv_dim, d_conv)`.
    pub ssm_conv1d: B::Buf,
    pub ssm_conv1d_b: Option<B::Buf>,
    pub ssm_a: B::Buf,
    pub ssm_d: B::Buf,
    pub ssm_dt_b: B::Buf,
    /// `(n_group, d_inner / n_group)`.
    pub ssm_norm: B::Buf,
    pub ssm_out: B::Weight,
    /// Conv and scan time (metrics).
    pub conv_timer: super::timing::OpTimer,
    pub scan_timer: super::timing::OpTimer,
}

impl<B: Backend> Mamba2<B> {
    pub fn load(be: &B, g: &Arc<Gguf>, il: usize, n_embd: usize, p: SsmParams) -> Result<Self> {
        p.validate().map_err(quarrel_core::CoreError::Model)?;
        let name = |s: &str| format!("blk.{il}.{s}");
        let conv_b = name("ssm_conv1d.bias");
        Ok(Mamba2 {
            p,
            ssm_in: weight(be, g, &name("ssm_in.weight"), n_embd, p.d_in_proj())?,
            ssm_conv1d: be.upload(&host_f32(g, &name("ssm_conv1d.weight"), p.conv_dim() * p.d_conv)?)?,
            ssm_conv1d_b: match g.tensor_info(&conv_b) {
                Some(_) => Some(be.upload(&host_f32(g, &conv_b, p.conv_dim())?)?),
                None => None,
            },
            ssm_a: be.upload(&host_f32(g, &name("ssm_a"), p.n_head)?)?,
            ssm_d: be.upload(&host_f32(g, &name("ssm_d"), p.n_head)?)?,
            ssm_dt_b: be.upload(&host_f32(g, &name("ssm_dt.bias"), p.n_head)?)?,
            ssm_norm: be.upload(&host_f32(g, &name("ssm_norm.weight"), p.d_inner)?)?,
            ssm_out: weight(be, g, &name("ssm_out.weight"), p.d_inner, n_embd)?,
            conv_timer: Default::default(),
            scan_timer: Default::default(),
        })
    }

    /// Conv and scan time since load.
    pub fn op_times(&self) -> super::timing::OpTimes {
        super::timing::OpTimes { ssm_conv: self.conv_timer.get(), ssm_scan: self.scan_timer.get(), ..Default::default() }
    }

    /// `x (n_tok, n_embd)` normalized input -> mixer output `(n_tok, n_embd)`; advances the
    /// state of every sequence in `batch`. Returns the output and the count of non-finite
    /// state values met.
    pub fn forward(&self, be: &B, layer: usize, x: &B::Buf, batch: &ForwardBatch, kv: &mut B::Kv, n_embd: usize) -> Result<(B::Buf, u64)> {
        let p = &self.p;
        let n = batch.n_tokens();
        let mut zxbcdt = be.alloc(n * p.d_in_proj())?; // (n_tok, d_in_proj)
        be.matmul(&self.ssm_in, x, n, &mut zxbcdt)?;
        let mut xbc = be.alloc(n * p.conv_dim())?; // (n_tok, conv_dim)
        self.conv_timer.time(|| be.ssm_conv(kv, layer, p, &zxbcdt, &self.ssm_conv1d, self.ssm_conv1d_b.as_ref(), batch, &mut xbc))?;
        let mut y = be.alloc(n * p.d_inner)?; // (n_tok, n_head, head_dim)
        let bad =
            self.scan_timer.time(|| be.ssm_scan(kv, layer, p, &xbc, &zxbcdt, &self.ssm_a, &self.ssm_d, &self.ssm_dt_b, batch, &mut y))?;
        if quarrel_core::trace::enabled() {
            trace("mamba2_y_add_d", layer, &be.download(&y)?);
        }
        let mut normed = be.alloc(n * p.d_inner)?; // (n_tok, d_inner)
        be.ssm_gated_norm(p, &y, &zxbcdt, &self.ssm_norm, &mut normed)?;
        let mut out = be.alloc(n * n_embd)?; // (n_tok, n_embd)
        be.matmul(&self.ssm_out, &normed, n, &mut out)?;
        Ok((out, bad))
    }
}

/// `{arch}.ssm.*` metadata.
pub fn ssm_params(h: &crate::hparams::Hparams<'_>, eps: f32) -> Result<SsmParams> {
    Ok(SsmParams {
        d_conv: h.positive("ssm.conv_kernel")?,
        d_inner: h.positive("ssm.inner_size")?,
        d_state: h.positive("ssm.state_size")?,
        n_group: h.usize_or("ssm.group_count", 1)?.max(1),
        n_head: h.positive("ssm.time_step_rank")?,
        eps,
    })
}
