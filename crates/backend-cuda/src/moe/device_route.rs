//! MoE routing on the device: no download, no host round trip per layer, so a decode step
//! stays one submission (and a replayable graph) and a prefill's host recording overlaps the
//! GPU instead of waiting for it at every MoE layer.
//!
//! ```text
//!  logits (n_tok, n_expert) ──moe_route──► eids, wts (n_tok · n_used, token-major) + counts[layer]
//!  decode, f32 router, 1/2/4/8 tokens (`Backend::moe_router`): x ──moe_router_f32_<n>──► the
//!    same eids, wts in one launch (router GEMV, x's Q8 form, the last block routes)
//!  decode (<= GEMV_MAX_TOKENS tokens): moe_gemv_dev, every route's row of its expert, one launch;
//!    each launch is held (`Held::Moe`): the gate projection after the up projection joins it
//!    (moe_gemv2_dev, one launch for both; in invariant numerics moe_gemvm_dev takes one or both
//!    matrices in MMQ's order)
//!  the combine (moe_combine_dev) is held (`Held::Comb`): the residual add of its output and
//!    the RMSNorm after it run with it as one comb_add_rms_norm launch (norm.rs)
//!  prefill: eids ──moe_plan (grouped by expert, work items per token tile)──► mmq_id per tile
//!  moe_route returns placeholder routes (token, DEVICE_EXPERT, NaN): the trait's routes in
//!  number and token order, whose experts and weights live on the device until
//!  moe_matmul (moe_gemv_dev_<type>) and moe_combine (moe_combine_dev) read them.
//! ```
//!
//! The kernel computes what `quarrel_core::moe::route_reference` computes (the host path of
//! prefill steps): exp correctly rounded as glibc's expf (nearly always), the softmax sum in f64
//! (another order: the same f32 result but in the rarest cases), the same tie and NaN order.
//! Used for at most 8 experts per token and 1024 experts; with expert tensors in host memory
//! (`--expert-budget`) the routes are downloaded (the host stages the routed experts) and the
//! host paths run with them.

use crate::error::CudaError;
use crate::fusion::{Device, Held};
use crate::matmul::mmq;
use crate::matmul::QCache;
use crate::runtime::{Arg, DevMem, PoolMem};
use crate::weights::{CudaWeight, DevType};
use quarrel_core::{Gating, MoeRouting, Route};
use std::sync::Mutex;

/// The expert of a placeholder route (its real expert is on the device).
pub const DEVICE_EXPERT: u32 = u32::MAX;

/// The last device routing (the layer being computed) and the per-layer selection counts.
pub struct DevRouter {
    last: Mutex<Option<DevRoutes>>,
    counts: Mutex<Vec<Option<(usize, DevMem)>>>,
    /// Whether a combine is held for the add + RMSNorm after it (`comb_add_rms_norm`); on
    /// unless the crate's tests compare it with three launches (`set_comb_norm_fusion`).
    pub(crate) comb_norm: std::sync::atomic::AtomicBool,
    /// `moe_router_f32`'s finished-block counter (one u32: router launches never overlap, each
    /// waits for the kernel before it), zeroed once, reset by the block that routes.
    router_cnt: Mutex<Option<DevMem>>,
}

impl Default for DevRouter {
    fn default() -> Self {
        DevRouter { last: Default::default(), counts: Default::default(), comb_norm: true.into(), router_cnt: Default::default() }
    }
}

/// A decode or prefill step's weighted combine (`moe_combine_dev`'s arguments), held so that
/// the residual add of its output and the RMSNorm after it run in the same launch
/// (`comb_add_rms_norm`, kernels/ops.cu: the same sum, route by route, the same bits).
#[derive(Clone, Copy, Debug)]
pub(crate) struct CombHeld {
    pub y: u64,
    pub wts: u64,
    pub out: u64,
    pub d: usize,
    pub n_tok: usize,
    pub n_used: usize,
    pub fresh: bool,
}

impl CombHeld {
    /// Queue it alone (`moe_combine_dev`).
    pub(crate) fn launch(&self, dev: &Device) -> Result<(), CudaError> {
        let args = [
            Arg::P(self.y),
            Arg::P(self.wts),
            Arg::P(self.out),
            Arg::I(self.d as i32),
            Arg::I(self.n_tok as i32),
            Arg::I(self.n_used as i32),
            Arg::I(self.fresh as i32),
        ];
        dev.launch_1d_now("moe_combine_dev", (self.n_tok * self.d) as u64, &args)
    }

    /// `comb_add_rms_norm`'s combine arguments (after x, y = out).
    pub(crate) fn args(&self) -> [Arg; 4] {
        [Arg::P(self.y), Arg::P(self.wts), Arg::I(self.n_used as i32), Arg::I(self.fresh as i32)]
    }
}

struct DevRoutes {
    eids: PoolMem,
    wts: PoolMem,
    n_tok: usize,
    n_used: usize,
    /// Expert matmuls over this routing so far (the second and later may read the routing
    /// before their PDL wait: at least one launch lies between them and `moe_route`).
    calls: usize,
}

/// A decode step's routed expert GEMV (`moe_gemv_dev_<type>`), held back (`Held::Moe`) so
/// that the next expert matmul over the same input and routes (the gate after the up
/// projection) joins it as one `moe_gemv2_dev_<type>` launch.
#[derive(Clone, Debug)]
pub(crate) struct MoeGemv {
    name: &'static str,
    p: u64,
    m: u64,
    out: u64,
    slice: (u64, u64),
    eids: u64,
    n_used: usize,
    per_token: bool,
    x: (u64, u64),
    units: usize,
    n_out: usize,
    n_routes: usize,
    wpr: usize,
    early: bool,
    /// in MMQ's order (`moe_gemvm_dev_<type>`, invariant numerics)
    mmq: bool,
    /// a held dense GEMV over the same one-token input joined to the launch (planes, output,
    /// rows: the shared expert's up projection; MMQ order only)
    dense: Option<(u64, u64, u64, usize)>,
}

impl MoeGemv {
    fn grid(&self, z: u32) -> (u32, u32, u32) {
        (self.n_out.div_ceil(8 / self.wpr) as u32, self.n_routes as u32, z)
    }

    /// Queue it alone (`moe_gemv_dev_<type>`).
    pub(crate) fn launch(&self, dev: &Device) -> Result<(), CudaError> {
        if self.mmq {
            return self.launch_mmq(dev, None);
        }
        dev.launch_now(
            &format!("moe_gemv_dev_{}", self.name),
            self.grid(1),
            128,
            0,
            &[&[Arg::P(self.p), Arg::P(self.m)], self.routing().as_slice(), &[Arg::P(self.out)], &self.shape_args()].concat(),
        )
    }

    /// Whether `o` can share one launch with `self`: another matrix of the same type and
    /// shape over the same Q8 input and routes.
    fn pairs_with(&self, o: &MoeGemv) -> bool {
        self.name == o.name
            && self.slice == o.slice
            && self.eids == o.eids
            && self.n_used == o.n_used
            && self.per_token == o.per_token
            && self.x == o.x
            && self.units == o.units
            && self.n_out == o.n_out
            && self.n_routes == o.n_routes
            && self.wpr == o.wpr
            && self.mmq == o.mmq
            && self.out != o.out
    }

    /// In MMQ's order (`moe_gemvm_dev_<type>`), with `o` in the same launch where given.
    fn launch_mmq(&self, dev: &Device, o: Option<&MoeGemv>) -> Result<(), CudaError> {
        let second = o.map(|o| (o.p, o.m, o.out));
        let (n_used, per_token, x, units, n_out, n_routes) = (self.n_used, self.per_token, self.x, self.units, self.n_out, self.n_routes);
        let dense = self.dense.or(o.and_then(|o| o.dense));
        crate::matmul::mmq_order::moe_dev(
            dev,
            self.name,
            (self.p, self.m, self.out),
            second,
            self.slice,
            self.eids,
            n_used,
            per_token,
            x,
            units,
            n_out,
            n_routes,
            self.early,
            dense,
        )
    }

    /// `self` and `o` in one `moe_gemv2_dev_<type>` launch (`self`'s `early`: the earlier call).
    fn launch_pair(&self, o: &MoeGemv, dev: &Device) -> Result<(), CudaError> {
        if self.mmq {
            return self.launch_mmq(dev, Some(o));
        }
        dev.launch_now(
            &format!("moe_gemv2_dev_{}", self.name),
            self.grid(2),
            128,
            0,
            &[[self.p, self.m, self.out, o.p, o.m, o.out].map(Arg::P).as_slice(), &self.routing(), &self.shape_args()].concat(),
        )
    }

    /// The routing arguments of `moe_gemv_dev_*` / `moe_gemv2_dev_*`: the experts' slice, the
    /// routed ids and their count per token, and the Q8 activations with their scales.
    fn routing(&self) -> [Arg; 7] {
        [
            Arg::U64(self.slice.0),
            Arg::U64(self.slice.1),
            Arg::P(self.eids),
            Arg::I(self.n_used as i32),
            Arg::I(self.per_token as i32),
            Arg::P(self.x.0),
            Arg::P(self.x.1),
        ]
    }

    /// The shape arguments those kernels end with: units per row, rows, warps per row, early exit.
    fn shape_args(&self) -> [Arg; 4] {
        [Arg::I(self.units as i32), Arg::I(self.n_out as i32), Arg::I(self.wpr as i32), Arg::I(self.early as i32)]
    }
}

/// Whether placeholder routes stand for a device routing.
pub fn on_device(routes: &[Route]) -> bool {
    routes.first().is_some_and(|r| r.expert == DEVICE_EXPERT)
}

/// Whether a step of `n_tok` tokens routes on the device.
/// route_warp's gating argument (kernels/moe.cu).
fn gating_id(g: Gating) -> i32 {
    match g {
        Gating::Softmax => 0,
        Gating::Sigmoid => 1,
        Gating::SoftmaxWeight => 2,
    }
}

pub fn applies(n_tok: usize, p: &MoeRouting) -> bool {
    n_tok > 0 && (1..=8).contains(&p.n_used) && p.n_used <= p.n_expert && p.n_expert <= 1024
}

/// The float order of the routed expert matmuls (`DevRouter::matmul`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// The fast kernels' (warps per row by the route count for short rows).
    Fast,
    /// Exact numerics: the decode GEMV with the warps per row of the matrix shape.
    Exact,
    /// Invariant numerics: MMQ's order (`gemvm`).
    Invariant,
}

/// Warps per row group of a decode step's routed expert GEMV. Rows of 64+ units: the dense
/// GEMV's rule from the matrix shape (`moe_chunk::wpr_for`). Shorter rows: by the blocks of all
/// routes, not of one matrix (the dense rule gave Nemotron-3-Nano's down projection, 58 units x
/// 2,688 rows, four warps per row for 6 routes: 2,016 blocks of one warp per row fill the GPU
/// with every lane busy, where four warps left 70 of 128 lanes idle). The host-routed paths
/// (exact numerics, prefill chunks) keep the shape rule, whose reduction they share.
fn wpr_dev(n_out: usize, units: usize, n_routes: usize) -> usize {
    match units {
        64.. => crate::moe::chunked_gemv::wpr_for(n_out, units),
        _ => {
            let blocks = n_out.div_ceil(8) * n_routes;
            if blocks >= 1024 {
                1
            } else if blocks >= 512 {
                2
            } else {
                4
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> Result<std::sync::MutexGuard<'_, T>, CudaError> {
    m.lock().map_err(|_| CudaError::Driver("MoE router lock poisoned".into()))
}

impl DevRouter {
    /// The selection counters of model layer `layer` (0: not counted).
    fn counts_ptr(&self, dev: &Device, layer: Option<usize>, n_expert: usize) -> Result<u64, CudaError> {
        let Some(layer) = layer else { return Ok(0) };
        let mut c = lock(&self.counts)?;
        if c.len() <= layer {
            c.resize_with(layer + 1, || None);
        }
        if c[layer].as_ref().is_none_or(|(ne, _)| *ne != n_expert) {
            let m = DevMem::alloc(dev, 8 * n_expert)?;
            dev.memset0(m.ptr, 8 * n_expert)?;
            c[layer] = Some((n_expert, m));
        }
        Ok(c[layer].as_ref().map(|(_, m)| m.ptr).unwrap_or(0))
    }

    /// Route `n_tok` rows of `logits` (device pointer) for model layer `layer` (`None`: not
    /// counted).
    pub fn route(
        &self,
        dev: &Device,
        layer: Option<usize>,
        logits: u64,
        n_tok: usize,
        bias: u64,
        p: &MoeRouting,
    ) -> Result<Vec<Route>, CudaError> {
        let n = n_tok * p.n_used;
        let counts = self.counts_ptr(dev, layer, p.n_expert)?;
        let (eids, wts) = (dev.scratch(4 * n)?, dev.scratch(4 * n)?);
        dev.launch(
            "moe_route",
            (n_tok as u32, 1, 1),
            32,
            (8 * p.n_expert) as u32,
            &[
                Arg::P(logits),
                Arg::P(bias),
                Arg::P(eids.ptr()),
                Arg::P(wts.ptr()),
                Arg::P(counts),
                Arg::I(p.n_expert as i32),
                Arg::I(p.n_used as i32),
                Arg::I(gating_id(p.gating)),
                Arg::I(p.norm_weights as i32),
                Arg::F(p.scale),
            ],
        )?;
        *lock(&self.last)? = Some(DevRoutes { eids, wts, n_tok, n_used: p.n_used, calls: 0 });
        Ok((0..n).map(|i| Route { token: (i / p.n_used) as u32, expert: DEVICE_EXPERT, weight: f32::NAN }).collect())
    }

    /// The device pointer of the last routing's expert ids (route order), checked to hold
    /// `n_routes` routes.
    pub fn last_eids(&self, n_routes: usize) -> Result<u64, CudaError> {
        let last = lock(&self.last)?;
        match last.as_ref() {
            Some(r) if r.n_tok * r.n_used == n_routes => Ok(r.eids.ptr()),
            _ => Err(CudaError::Shape(format!("no device routing of {n_routes} routes to read the experts of"))),
        }
    }

    /// The router matmul `x (n_tok, n_in) · wᵀ` (f32 router weights) and the routing in one
    /// launch (`moe_router_f32_<n_tok>`: the logits as `gemv_f32_<n_tok>` computes them, the
    /// routes as `moe_route`), for decode steps of 1, 2, 4 or 8 tokens; the launch also writes
    /// x's Q8 form when the cache does not hold it (the expert matmuls read it). `None`: not
    /// applicable (other weight types or token counts): the caller
    /// runs the matmul and `route`.
    #[allow(clippy::too_many_arguments)]
    pub fn route_fused(
        &self,
        dev: &Device,
        qc: &Mutex<Option<QCache>>,
        layer: Option<usize>,
        w: &CudaWeight,
        x: u64,
        n_tok: usize,
        bias: u64,
        p: &MoeRouting,
    ) -> Result<Option<Vec<Route>>, CudaError> {
        let n_in = w.n_in;
        if w.dev_ty != DevType::F32
            || w.n_out != p.n_expert
            || !matches!(n_tok, 1 | 2 | 4 | 8)
            || !n_in.is_multiple_of(8)
            || !applies(n_tok, p)
        {
            return Ok(None);
        }
        let n = n_tok * p.n_used;
        let counts = self.counts_ptr(dev, layer, p.n_expert)?;
        let cnt = {
            let mut c = lock(&self.router_cnt)?;
            if c.is_none() {
                let m = DevMem::alloc(dev, 4)?;
                dev.memset0(m.ptr, 4)?;
                *c = Some(m);
            }
            c.as_ref().map_or(0, |m| m.ptr)
        };
        // x's Q8 form unless cached (a norm that wrote x left it): written by the same launch
        let cached = lock(qc)?.as_ref().is_some_and(|c| c.x == x && c.n == n_tok * n_in);
        let fresh_q = if cached || !n_in.is_multiple_of(32) { None } else { Some(QCache::new(dev, x, n_tok * n_in)?) };
        let (xq, xm) = fresh_q.as_ref().map_or((0, 0), |c| (c.xq.ptr(), c.xm.ptr()));
        let logits = dev.scratch(4 * n_tok * p.n_expert)?;
        let (eids, wts) = (dev.scratch(4 * n)?, dev.scratch(4 * n)?);
        // gemv_f32's warps per row (matmul::gemv_shape for float weights) and grid
        let wpr = crate::moe::chunked_gemv::wpr_for(p.n_expert, 0);
        let grid = p.n_expert.div_ceil(8 / wpr) as u32;
        dev.launch(
            &format!("moe_router_f32_{n_tok}"),
            (grid, 1, 1),
            128,
            (4 * 2 * 4 * p.n_expert) as u32,
            &[
                Arg::P(w.p.ptr),
                Arg::P(x),
                Arg::P(logits.ptr()),
                Arg::I(n_in as i32),
                Arg::I(p.n_expert as i32),
                Arg::I(wpr as i32),
                Arg::P(bias),
                Arg::P(eids.ptr()),
                Arg::P(wts.ptr()),
                Arg::P(counts),
                Arg::I(p.n_used as i32),
                Arg::I(gating_id(p.gating)),
                Arg::I(p.norm_weights as i32),
                Arg::F(p.scale),
                Arg::P(cnt),
                Arg::P(xq),
                Arg::P(xm),
            ],
        )?;
        if let Some(c) = fresh_q {
            *lock(qc)? = Some(c);
        }
        *lock(&self.last)? = Some(DevRoutes { eids, wts, n_tok, n_used: p.n_used, calls: 0 });
        Ok(Some((0..n).map(|i| Route { token: (i / p.n_used) as u32, expert: DEVICE_EXPERT, weight: f32::NAN }).collect()))
    }

    /// The routes' expert matmul: `out (routes, n_out)` from `x` (per token or per route).
    /// `order`: exact numerics take the warps per row from the matrix shape only
    /// (`moe_chunk::wpr_for`, what a prefill's chunked expert GEMV takes), never the route count;
    /// invariant numerics the GEMV in MMQ's order (`invariant::moe_dev`) for decode steps.
    #[allow(clippy::too_many_arguments)]
    pub fn matmul(
        &self,
        dev: &Device,
        qc: &Mutex<Option<QCache>>,
        w: &CudaWeight,
        n_expert: usize,
        x: u64,
        x_len: usize,
        n_routes: usize,
        x_per_token: bool,
        out: u64,
        order: Order,
    ) -> Result<(), CudaError> {
        let mut last = lock(&self.last)?;
        let r = last
            .as_mut()
            .filter(|r| r.n_tok * r.n_used == n_routes)
            .ok_or_else(|| CudaError::Shape(format!("{n_routes} device routes without their routing")))?;
        r.calls += 1;
        let early = r.calls > 1;
        let DevType::Quant(name) = w.dev_ty else {
            return Err(CudaError::Unsupported(format!("expert weights of type {} (quantized types only)", w.ty)));
        };
        if w.offload.is_some() {
            return Err(CudaError::Unsupported("device routes over experts kept in host memory".into()));
        }
        let (n_in, n_out) = (w.n_in, w.n_out / n_expert.max(1));
        let n_src = if x_per_token { r.n_tok } else { n_routes };
        if n_in % 32 != 0 || x_len != n_src * n_in {
            return Err(CudaError::Shape(format!("moe_matmul input: {x_len} values for {n_src} rows of {n_in}")));
        }
        let units = n_in / 32;
        // the cached Q8 form of x: the gate and up matmuls (and a shared expert's) share one
        let (xq, xm) = crate::matmul::q8_activations(dev, qc, x, n_src, n_in, out)?;
        let (pb, m_b) = mmq::unit_bytes(name)?;
        let (slice_p, slice_m) = ((n_out * units) as u64 * pb.0 / pb.1, (n_out * units) as u64 * m_b);
        if r.n_tok > crate::matmul::GEMV_MAX_TOKENS {
            // a prefill: work items planned on the device, one grouped MMQ launch per tile
            return grouped(
                dev,
                w,
                name,
                &r.eids,
                r.n_used,
                n_expert,
                n_routes,
                x_per_token,
                (xq, xm),
                (slice_p, slice_m),
                units,
                n_out,
                out,
            );
        }
        let wpr = match order {
            Order::Exact => crate::moe::chunked_gemv::wpr_for(n_out, units),
            Order::Invariant => 1,
            Order::Fast => wpr_dev(n_out, units, n_routes),
        };
        let mut g = MoeGemv {
            name,
            p: w.p.ptr,
            m: w.m_ptr(),
            out,
            slice: (slice_p, slice_m),
            eids: r.eids.ptr(),
            n_used: r.n_used,
            per_token: x_per_token,
            x: (xq, xm),
            units,
            n_out,
            n_routes,
            wpr,
            early,
            mmq: order == Order::Invariant,
            dense: None,
        };
        let r_tok = r.n_tok;
        drop(last);
        // a held dense GEMV in MMQ's order over the same one-token input (the shared expert's up
        // projection before the routed experts'): its row groups join this launch
        if g.mmq && r_tok == 1 && x_per_token {
            g.dense = dev.take_held_if(|h| matches!(h, Held::Gemv(d) if d.single_mmq(name, xq, units).is_some())).and_then(|h| match h {
                Held::Gemv(d) => d.single_mmq(name, xq, units),
                _ => None,
            });
        }
        // the up projection held by the call before (same input and routes): one launch
        if let Some(Held::Moe(first)) = dev.take_held_if(|h| matches!(h, Held::Moe(f) if f.pairs_with(&g))) {
            return first.launch_pair(&g, dev);
        }
        dev.hold(Held::Moe(g))
    }

    /// `out[token] += weight · y[route]` over the device routes.
    /// `fresh`: `out` holds zeros (not yet written): written, never read.
    #[allow(clippy::too_many_arguments)]
    pub fn combine(
        &self,
        dev: &Device,
        y: u64,
        y_len: usize,
        n_routes: usize,
        out: u64,
        out_len: usize,
        fresh: bool,
    ) -> Result<(), CudaError> {
        let last = lock(&self.last)?;
        let r = last
            .as_ref()
            .filter(|r| r.n_tok * r.n_used == n_routes)
            .ok_or_else(|| CudaError::Shape(format!("{n_routes} device routes without their routing")))?;
        let d = y_len / n_routes.max(1);
        if d == 0 || y_len != d * n_routes || out_len != r.n_tok * d {
            return Err(CudaError::Shape(format!("moe_combine: {y_len} values for {n_routes} routes into {out_len}")));
        }
        let c = CombHeld { y, wts: r.wts.ptr(), out, d, n_tok: r.n_tok, n_used: r.n_used, fresh };
        // held: the residual add of out and the RMSNorm after it may absorb it
        if d.is_multiple_of(4) && self.comb_norm.load(std::sync::atomic::Ordering::Relaxed) {
            return dev.hold(Held::Comb(c));
        }
        dev.settle()?;
        c.launch(dev)
    }

    /// The last routing's experts and weights, downloaded (tests: the kernel vs its host twin).
    pub fn download_last(&self, dev: &Device, placeholders: &[Route]) -> Result<Vec<Route>, CudaError> {
        let last = lock(&self.last)?;
        let r = last
            .as_ref()
            .filter(|r| r.n_tok * r.n_used == placeholders.len())
            .ok_or_else(|| CudaError::Shape("no device routing to download".into()))?;
        let e: Vec<u32> = dev.download(r.eids.ptr(), placeholders.len())?;
        let w: Vec<f32> = dev.download(r.wts.ptr(), placeholders.len())?;
        Ok(placeholders.iter().zip(e.iter().zip(&w)).map(|(p, (&expert, &weight))| Route { token: p.token, expert, weight }).collect())
    }

    /// Selections counted on the device, added into `counts[layer][expert]`.
    pub fn add_counts(&self, dev: &Device, counts: &mut Vec<Vec<u64>>) -> Result<(), CudaError> {
        let c = lock(&self.counts)?;
        for (layer, m) in c.iter().enumerate() {
            let Some((ne, m)) = m else { continue };
            let v: Vec<u64> = dev.download(m.ptr, *ne)?;
            if counts.len() <= layer {
                counts.resize(layer + 1, Vec::new());
            }
            if counts[layer].len() < *ne {
                counts[layer].resize(*ne, 0);
            }
            counts[layer].iter_mut().zip(&v).for_each(|(a, b)| *a += b);
        }
        Ok(())
    }
}

/// The grouped expert MMQ over device routes (`moe_plan` then `mmq_id_<type>_<tile>` per token
/// tile class, the item counts read on the device): `moe_id`'s arithmetic without the host.
#[allow(clippy::too_many_arguments)]
fn grouped(
    dev: &Device,
    w: &CudaWeight,
    name: &str,
    eids: &PoolMem,
    n_used: usize,
    n_expert: usize,
    n_routes: usize,
    x_per_token: bool,
    (xq, xm): (u64, u64),
    (slice_p, slice_m): (u64, u64),
    units: usize,
    n_out: usize,
    out: u64,
) -> Result<(), CudaError> {
    use crate::moe::grouped_gemm::{max_items, split_table, TILES};
    let bound = max_items(n_routes, n_expert);
    let max = *bound.iter().max().unwrap_or(&1);
    let (src, dst) = (dev.scratch(4 * n_routes)?, dev.scratch(4 * n_routes)?);
    let items = dev.scratch(8 * 3 * TILES.len() * max)?;
    let n_items = dev.scratch(4 * TILES.len())?;
    let tab = dev.upload_async(split_table())?;
    if bound.iter().any(|&b| b > 65535) {
        return Err(CudaError::Shape(format!("{n_routes} routes in one step: too many work items for one launch")));
    }
    let m_ptr = w.m_ptr();
    let one = crate::moe::grouped_gemm::one_launch(n_routes, n_expert);
    dev.launch(
        "moe_plan",
        (1, 1, 1),
        1024,
        (8 * n_expert) as u32,
        &[
            Arg::P(eids.ptr()),
            Arg::I(n_routes as i32),
            Arg::I(n_used as i32),
            Arg::I(x_per_token as i32),
            Arg::I(n_expert as i32),
            Arg::P(w.p.ptr),
            Arg::P(m_ptr),
            Arg::U64(slice_p),
            Arg::U64(slice_m),
            Arg::P(tab.ptr()),
            Arg::P(src.ptr()),
            Arg::P(dst.ptr()),
            Arg::P(items.ptr()),
            Arg::I(max as i32),
            Arg::P(n_items.ptr()),
            Arg::I(one as i32),
        ],
    )?;
    for (t, &b) in bound.iter().enumerate() {
        if one && t != TILES.len() - 1 {
            continue;
        }
        let (suffix, rows, _, threads, smem) = mmq::id_tile(TILES[t]);
        dev.launch(
            &format!("mmq_id_{name}_{suffix}"),
            (n_out.div_ceil(rows) as u32, b.clamp(1, 65535) as u32, 1),
            threads,
            smem,
            &[
                Arg::P(items.ptr() + (8 * 3 * t * max) as u64),
                Arg::P(src.ptr()),
                Arg::P(dst.ptr()),
                Arg::P(xq),
                Arg::P(xm),
                Arg::P(out),
                Arg::I(units as i32),
                Arg::I(n_out as i32),
                Arg::P(n_items.ptr() + 4 * t as u64),
            ],
        )?;
    }
    Ok(())
}
