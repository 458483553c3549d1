//! Bodies of the `Backend` ops whose launch logic is longest (RoPE with its fusions, the gated
//! activations, GELU with its table, row gathers, ReLU² pairs, MoE routing entry points and
//! per-expert biases); `lib.rs` delegates to them.

use crate::fusion::Held;
use crate::runtime::Arg;
use crate::{check_len, matmul, moe, CudaBackend, CudaBuf};
use quarrel_core::{CoreError, MoeRouting, Result, RopeParams, RopeScaling, RopeStyle, Route};
use std::sync::atomic::Ordering;

impl CudaBackend {
    pub(crate) fn rope_op(&self, x: &mut CudaBuf, positions: &[u32], n_head: usize, head_dim: usize, p: &RopeParams) -> Result<()> {
        self.dev.bind()?;
        check_len("rope input", x.len, positions.len() * n_head * head_dim)?;
        if p.n_rot > head_dim || !p.n_rot.is_multiple_of(2) || p.n_rot == 0 {
            return Err(CoreError::Shape(format!("rope: n_rot {} vs head_dim {head_dim}", p.n_rot)));
        }
        if let Some(f) = &p.freq_factors {
            if f.len() < p.n_rot / 2 {
                return Err(CoreError::Shape(format!("rope: {} freq factors for n_rot {}", f.len(), p.n_rot)));
            }
        }
        let xp = self.rw(x)?;
        let (pos, _keep) = self.positions_ptr(positions)?;
        let ff = self.freq_factors_ptr(&p.freq_factors)?;
        let plain = p.scaling == RopeScaling::NONE;
        // YaRN's blend weight per pair, kept on the device like the frequency factors
        let ramps = (p.scaling.ext_factor != 0.0).then(|| (0..p.n_rot / 2).map(|i| p.scaling.ramp(i)).collect::<Vec<f32>>());
        let yr = self.freq_factors_ptr(&ramps)?;
        let theta_scale = p.freq_base.powf(-2.0 / p.n_rot as f32);
        let n = (positions.len() * n_head * p.n_rot / 2) as u64;
        let args = vec![
            Arg::P(xp),
            Arg::P(pos),
            Arg::P(ff),
            Arg::I(positions.len() as i32),
            Arg::I(n_head as i32),
            Arg::I(head_dim as i32),
            Arg::I(p.n_rot as i32),
            Arg::F(theta_scale),
            Arg::F(p.freq_scale),
            Arg::I((p.style == RopeStyle::Neox) as i32),
            Arg::P(0),
            Arg::I(0),
            Arg::P(yr),
            Arg::F(p.scaling.mscale(p.freq_scale)),
        ];
        if n == 0 {
            return Ok(());
        }
        // the fused paths below (GEMV epilogue, q and k in one launch, rope_kv) rotate plainly
        if !plain {
            self.dev.launch_1d("rope", n, &args)?;
            return Ok(());
        }
        // q, then k, of a held q/k/v GEMV: rotated in its epilogue
        if _keep.is_none() && p.style != RopeStyle::Neox && p.n_rot == head_dim && matmul::rope_fusion() {
            let r = matmul::RopeFuse { pos, ff, theta_scale, freq_scale: p.freq_scale, hd: head_dim, rope_k: false, kv: None };
            let n_vals = positions.len() * n_head * head_dim;
            if let Some(Held::Gemv(mut g)) =
                self.dev.take_held_if(|h| matches!(h, Held::Gemv(g) if g.rope_fits(xp, positions.len(), n_vals, &r)))
            {
                g.add_rope(r);
                return Ok(self.dev.hold(Held::Gemv(g))?);
            }
        }
        // k right after q (same positions and parameters): one launch for both
        let same = |a: &[Arg]| a.len() == args.len() && a[0].bits() != xp && (1..4).chain(5..10).all(|i| a[i].bits() == args[i].bits());
        if let Some(Held::Rope { args: mut first, n: n1 }) = self.dev.take_held_if(|h| matches!(h, Held::Rope { args: a, .. } if same(a))) {
            first[10] = Arg::P(xp);
            first[11] = Arg::I(n_head as i32);
            // held again: the kv_store of k that usually follows joins the launch
            return Ok(self.dev.hold(Held::RopeQk { args: first, n: n1 + n })?);
        }
        if _keep.is_none() {
            return Ok(self.dev.hold(Held::Rope { args, n })?);
        }
        self.dev.launch_1d("rope", n, &args)?;
        Ok(())
    }

    /// A gated activation kernel `name(gate, up, out, n, extra..., xq, xm)` (`swiglu`,
    /// `swiglu_oai`), the output also as Q8 for the matmul that follows.
    pub(crate) fn glu_op(&self, name: &str, gate: &CudaBuf, up: &CudaBuf, out: &mut CudaBuf, extra: &[Arg]) -> Result<()> {
        self.dev.bind()?;
        check_len(name, up.len, gate.len)?;
        check_len(name, out.len, gate.len)?;
        let n = gate.len as u64;
        let (g, u, o) = (self.rd(gate)?, self.rd(up)?, self.wr(out));
        let (xq, xm) = self.q8_out(o, gate.len)?;
        let mut args = vec![Arg::P(g), Arg::P(u), Arg::P(o), Arg::U64(n)];
        args.extend_from_slice(extra);
        args.extend([Arg::P(xq), Arg::P(xm)]);
        self.dev.launch_1d(name, n, &args)?;
        Ok(())
    }

    /// `y (routes, d) += bias[expert]` per route (`moe_add_bias`), the experts from the host
    /// routes or, for routes kept on the device, from the device router's last routing.
    pub(crate) fn moe_add_bias_op(&self, y: &mut CudaBuf, bias: &CudaBuf, routes: &[Route]) -> Result<()> {
        self.dev.bind()?;
        if routes.is_empty() {
            return Ok(());
        }
        if !y.len.is_multiple_of(routes.len()) || y.len == 0 {
            return Err(CoreError::Shape(format!("moe_add_bias: {} values for {} routes", y.len, routes.len())));
        }
        let d = y.len / routes.len();
        if !bias.len.is_multiple_of(d) {
            return Err(CoreError::Shape(format!("moe_add_bias: a bias of {} values is not rows of {d}", bias.len)));
        }
        let (yp, bp) = (self.rw(y)?, self.rd(bias)?);
        let host_ids;
        let eids = if moe::device_route::on_device(routes) {
            self.router.last_eids(routes.len())?
        } else {
            let n_expert = bias.len / d;
            if let Some(r) = routes.iter().find(|r| r.expert as usize >= n_expert) {
                return Err(CoreError::Shape(format!("moe_add_bias: route to expert {} of {n_expert}", r.expert)));
            }
            host_ids = self.dev.upload_async(&routes.iter().map(|r| r.expert).collect::<Vec<u32>>())?;
            host_ids.ptr()
        };
        let n = y.len as u64;
        self.dev.launch_1d("moe_add_bias", n, &[Arg::P(yp), Arg::P(bp), Arg::P(eids), Arg::I(d as i32), Arg::U64(n)])?;
        Ok(())
    }

    pub(crate) fn gather_rows_op(&self, x: &CudaBuf, dim: usize, rows: &[usize], out: &mut CudaBuf) -> Result<()> {
        self.dev.bind()?;
        check_len("gather output", out.len, rows.len() * dim)?;
        if let Some(&r) = rows.iter().find(|&&r| (r + 1) * dim > x.len) {
            return Err(CoreError::Shape(format!("gather row {r} out of range")));
        }
        let idx: Vec<u32> = rows.iter().map(|&r| r as u32).collect();
        let idx = self.dev.upload_async(&idx)?;
        let n = (rows.len() * dim) as u64;
        let (xp, op) = (self.rd(x)?, self.wr(out));
        self.dev.launch_1d(
            "gather_rows",
            n,
            &[Arg::P(xp), Arg::P(idx.ptr()), Arg::P(op), Arg::I(dim as i32), Arg::I(rows.len() as i32)],
        )?;
        Ok(())
    }

    /// The GELU table on the device (uploaded on first use).
    fn gelu_table_ptr(&self) -> Result<u64> {
        let mut t = self.gelu_table.lock().map_err(|_| CoreError::Backend("lock poisoned".into()))?;
        if t.is_none() {
            *t = Some(self.dev.upload_async(quarrel_core::act::gelu_table())?);
        }
        Ok(t.as_ref().map_or(0, |m| m.ptr()))
    }

    pub(crate) fn gelu_op(&self, x: &mut CudaBuf) -> Result<()> {
        self.dev.bind()?;
        let table = self.gelu_table_ptr()?;
        let n = x.len as u64;
        let xp = self.rw(x)?;
        let (xq, xm) = self.q8_out(xp, x.len)?;
        self.dev.launch_1d("gelu", n, &[Arg::P(xp), Arg::P(table), Arg::U64(n), Arg::P(xq), Arg::P(xm)])?;
        Ok(())
    }

    pub(crate) fn geglu_op(&self, gate: &CudaBuf, up: &CudaBuf, out: &mut CudaBuf) -> Result<()> {
        self.dev.bind()?;
        check_len("geglu up", up.len, gate.len)?;
        check_len("geglu output", out.len, gate.len)?;
        let table = self.gelu_table_ptr()?;
        let n = gate.len as u64;
        let (g, u, o) = (self.rd(gate)?, self.rd(up)?, self.wr(out));
        let (xq, xm) = self.q8_out(o, gate.len)?;
        let args = [Arg::P(g), Arg::P(u), Arg::P(table), Arg::P(o), Arg::U64(n), Arg::P(xq), Arg::P(xm)];
        self.dev.launch_1d("geglu", n, &args)?;
        Ok(())
    }

    pub(crate) fn relu_sqr_op(&self, x: &mut CudaBuf) -> Result<()> {
        self.dev.bind()?;
        let n = x.len as u64;
        let xp = self.rw(x)?;
        // a held ReLU² of another buffer (the routed experts' before the shared expert's): one
        // launch, its Q8 form kept as the previous cache entry
        if let Some(Held::ReluSqr { x: x0, n: n0, xq: q0, xm: m0 }) =
            self.dev.take_held_if(|h| matches!(h, Held::ReluSqr { x, .. } if *x != xp))
        {
            self.keep_q8_as_previous(x0)?;
            let (xq, xm) = self.q8_out(xp, x.len)?;
            let blocks = n0.div_ceil(256) + n.div_ceil(256);
            let args = [Arg::P(x0), Arg::U64(n0), Arg::P(q0), Arg::P(m0), Arg::P(xp), Arg::U64(n), Arg::P(xq), Arg::P(xm)];
            return Ok(self.dev.launch("relu_sqr2", (blocks as u32, 1, 1), 256, 0, &args)?);
        }
        // the down matmul's Q8 input written by the same kernel (no quantize launch)
        let (xq, xm) = self.q8_out(xp, x.len)?;
        if n > 0 {
            return Ok(self.dev.hold(Held::ReluSqr { x: xp, n, xq, xm })?);
        }
        self.dev.launch_1d("relu_sqr", n, &[Arg::P(xp), Arg::U64(n), Arg::P(xq), Arg::P(xm)])?;
        Ok(())
    }

    pub(crate) fn moe_route_op(&self, layer: usize, logits: &CudaBuf, bias: Option<&CudaBuf>, p: &MoeRouting) -> Result<Vec<Route>> {
        self.dev.bind()?;
        let n_tok = logits.len / p.n_expert.max(1);
        // one router kernel (moe_route, a warp per token) at every token count: a token's routes
        // do not depend on the batch. Exact numerics hand a prefill's routes to the host (its
        // expert matmuls are decode's chunked GEMV, planned there).
        let exact = self.exact_mm();
        if p.n_expert > 0 && logits.len == n_tok * p.n_expert && crate::moe::device_route::applies(n_tok, p) {
            let bias = match bias {
                Some(b) if b.len == p.n_expert => self.rd(b)?,
                Some(b) => return Err(CoreError::Shape(format!("expert bias has {} values, expected {}", b.len, p.n_expert))),
                None => 0,
            };
            let routes = self.router.route(&self.dev, Some(layer), self.rd(logits)?, n_tok, bias, p)?;
            // the host needs the routes for experts in host memory (to stage them) and for an
            // exact prefill (to plan its chunked GEMV): the same router's numbers either way
            let on_host = self.experts.any_offloaded() || (exact && n_tok > matmul::GEMV_MAX_TOKENS);
            if !on_host {
                return Ok(routes);
            }
            return Ok(self.router.download_last(&self.dev, &routes)?);
        }
        let l: Vec<f32> = if logits.zero_pending.load(Ordering::Acquire) {
            vec![0.0; logits.len]
        } else {
            self.dev.download(logits.ptr(), logits.len)?
        };
        let b: Option<Vec<f32>> = match bias {
            Some(b) => Some(self.dev.download(self.rd(b)?, b.len)?),
            None => None,
        };
        moe::route(&self.moe_counts, layer, &l, b.as_deref(), p)
    }
}
