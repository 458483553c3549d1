//! Mixture-of-experts on the device (`kernels/moe.cu`).
//!
//! ```text
//!  router logits ──download──► host router (quarrel_core::moe::route_with) ──► routes
//!  x ──quantize_q8 (once)──► grouped_gemm: one grouped MMQ launch (every expert's routes) ──► out
//!  (rows not of whole units: x ──gather_rows (grouped by expert)──► xs ──mmq per expert
//!   ──► ys ──moe_scatter_rows──► out (route order))
//!  (steps of at most GEMV_MAX_TOKENS tokens instead: x ──quantize_q8──► moe_gemv, every route's
//!   row of its expert in one launch, written in route order; exact numerics: chunked_gemv's
//!   chunked GEMV, decode's bits at every size)
//!  y (routes, d) ──moe_combine (per token, route order)──► out[token] += weight · y
//! ```
//!
//! The expert weights are one 3-D tensor `(n_in, n_out, n_expert)` in the repacked device
//! layout, whose rows are contiguous: expert `e` starts `e · n_out` rows in. Every expert
//! matmul runs MMQ (exact integer block sums over Q8 activations, as the dense matmuls).
//! Expert tensors beyond `--expert-budget` live in host memory (`experts::Offload`): each
//! routed expert is taken from its device slot, uploaded first when it is not cached.

pub(crate) mod chunked_gemv;
pub(crate) mod device_route;
mod grouped_gemm;
mod host_route;

use crate::error::CudaError;
use crate::fusion::Device;
use crate::matmul::mmq;
use crate::matmul::QCache;
use crate::runtime::{Arg, PoolMem};
use crate::weights::experts::ExpertBudget;
use crate::weights::{CudaWeight, DevType};
use quarrel_core::Route;
use std::sync::Mutex;

/// The rows `src` of `x (·, n_in)` gathered into a scratch `(src.len(), n_in)`; returned with
/// the uploaded indices, both to be held until the launches reading them are queued.
pub(crate) fn gather_rows(dev: &Device, x: u64, src: &[u32], n_in: usize) -> Result<(PoolMem, PoolMem), CudaError> {
    let rows = src.len();
    let src_d = dev.upload_async(src)?;
    let xs = dev.scratch(4 * rows * n_in)?;
    dev.launch_1d(
        "gather_rows",
        (rows * n_in) as u64,
        &[Arg::P(x), Arg::P(src_d.ptr()), Arg::P(xs.ptr()), Arg::I(n_in as i32), Arg::I(rows as i32)],
    )?;
    Ok((src_d, xs))
}

/// Routes for the plan tests: `n` of them, two per token, each to expert 2 but the eighth
/// (expert 5), and their grouping over 6 experts.
#[cfg(test)]
pub(crate) fn test_routes(n: u32) -> (Vec<Route>, Vec<(usize, Vec<usize>)>) {
    let routes: Vec<Route> = (0..n).map(|i| Route { token: i / 2, expert: if i == 7 { 5 } else { 2 }, weight: 1.0 }).collect();
    let groups = quarrel_core::moe::group_by_expert(&routes, 6).unwrap();
    (routes, groups)
}

/// One expert matmul as `moe_matmul` has checked it: what each of its paths (the routed GEMV,
/// `moe_chunk`, `moe_id`) takes. `groups`: each expert with its routes' indices.
#[derive(Clone, Copy)]
pub(crate) struct ExpertCall<'a> {
    pub dev: &'a Device,
    pub budget: &'a ExpertBudget,
    pub w: &'a CudaWeight,
    /// the weight type's kernel suffix
    pub name: &'a str,
    /// rows of one expert
    pub n_out: usize,
    pub x: u64,
    /// input rows
    pub n_src: usize,
    pub routes: &'a [Route],
    pub x_per_token: bool,
    pub groups: &'a [(usize, Vec<usize>)],
    pub out: u64,
}

/// Grouped expert matmul (the trait's `moe_matmul`); `x`, `out` device pointers of
/// `x_len` and `routes.len() * n_out / n_expert` values.
#[allow(clippy::too_many_arguments)]
pub(crate) fn moe_matmul(
    dev: &Device,
    qc: &Mutex<Option<QCache>>,
    budget: &ExpertBudget,
    w: &CudaWeight,
    n_expert: usize,
    x: u64,
    x_len: usize,
    routes: &[Route],
    x_per_token: bool,
    out: u64,
    exact: bool,
) -> Result<(), CudaError> {
    let DevType::Quant(name) = w.dev_ty else {
        return Err(CudaError::Unsupported(format!("expert weights of type {} (quantized types only)", w.ty)));
    };
    let n_in = w.n_in;
    if n_expert == 0 || !w.n_out.is_multiple_of(n_expert) {
        return Err(CudaError::Shape(format!("moe_matmul: {} rows are not {n_expert} experts", w.n_out)));
    }
    let n_out = w.n_out / n_expert;
    let n_src = x_len / n_in.max(1);
    if !x_len.is_multiple_of(n_in) || (!x_per_token && n_src != routes.len()) {
        return Err(CudaError::Shape(format!("moe_matmul input: {x_len} values for {} routes of {n_in}", routes.len())));
    }
    if routes.is_empty() {
        return Ok(());
    }
    let groups = quarrel_core::moe::group_by_expert(routes, n_expert).map_err(|e| CudaError::Shape(e.to_string()))?;
    let call = ExpertCall { dev, budget, w, name, n_out, x, n_src, routes, x_per_token, groups: &groups, out };
    // decode-sized steps: one routed-expert GEMV launch (no gather / scatter, no per-expert MMQ)
    let n_tok = routes.iter().map(|r| r.token as usize + 1).max().unwrap_or(0);
    if n_tok <= crate::matmul::GEMV_MAX_TOKENS && n_in.is_multiple_of(32) {
        return moe_gemv(&call);
    }
    // exact numerics: decode's arithmetic at every size (`chunked_gemv`)
    if exact && n_in.is_multiple_of(32) {
        return crate::moe::chunked_gemv::matmul(&call);
    }
    // one grouped MMQ launch over every expert's routes (`grouped_gemm`)
    if n_in.is_multiple_of(32) {
        return crate::moe::grouped_gemm::matmul(qc, &call);
    }
    let (mut src, mut dst) = (Vec::with_capacity(routes.len()), Vec::with_capacity(routes.len()));
    for (_, idx) in &groups {
        for &i in idx {
            let s = if x_per_token { routes[i].token as usize } else { i };
            if s >= n_src {
                return Err(CudaError::Shape(format!("moe_matmul: input row {s} of {n_src}")));
            }
            src.push(s as u32);
            dst.push(i as u32);
        }
    }
    let n = routes.len();
    let (_src_d, xs) = gather_rows(dev, x, &src, n_in)?;
    let dst_d = dev.upload_async(&dst)?;
    let ys = dev.scratch(4 * n * n_out)?;
    // cached Q8 activations never outlive this call (xs is scratch)
    clear(qc);
    let units = n_in / 32;
    let (pb, m_b) = mmq::unit_bytes(name)?;
    let mut o = 0usize;
    for (e, idx) in &groups {
        let xo = xs.ptr() + (4 * o * n_in) as u64;
        let yo = ys.ptr() + (4 * o * n_out) as u64;
        if let Some(off) = &w.offload {
            // kept in host memory: the expert's cached slot (uploaded when missing)
            let ex = off.expert(dev, budget, *e, idx.len())?;
            mmq::mmq_raw(dev, qc, name, ex.p, ex.m, n_in, n_out, xo, idx.len(), yo, true)?;
        } else {
            let row0 = (e * n_out * units) as u64;
            let p = w.p.ptr + row0 * pb.0 / pb.1;
            let m = if m_b == 0 { 0 } else { w.m_ptr() + row0 * m_b };
            mmq::mmq_raw(dev, qc, name, p, m, n_in, n_out, xo, idx.len(), yo, true)?;
        }
        o += idx.len();
    }
    clear(qc);
    dev.launch_1d(
        "moe_scatter_rows",
        (n * n_out) as u64,
        &[Arg::P(ys.ptr()), Arg::P(dst_d.ptr()), Arg::P(out), Arg::I(n_out as i32), Arg::I(n as i32)],
    )
}

/// Routed expert GEMV (`moe_gemv_<type>`): x quantized to Q8 once, then every route's row of
/// its expert in one launch. Offloaded experts: their slots when all of this step's experts
/// fit in them at once, else one launch per expert right after its upload.
fn moe_gemv(c: &ExpertCall) -> Result<(), CudaError> {
    let ExpertCall { dev, budget, w, name, n_out, x, n_src, routes, x_per_token, groups, out } = *c;
    let n_in = w.n_in;
    let units = n_in / 32;
    let nb = n_src * units;
    let xq = dev.scratch(n_src * n_in)?;
    let xm = dev.scratch(nb * 8)?;
    dev.launch(
        "quantize_q8",
        ((nb as u32).div_ceil(8), 1, 1),
        256,
        0,
        &[Arg::P(x), Arg::P(xq.ptr()), Arg::P(xm.ptr()), Arg::I(nb as i32)],
    )?;
    let (pb, m_b) = mmq::unit_bytes(name)?;
    let (slice_p, slice_m) = ((n_out * units) as u64 * pb.0 / pb.1, (n_out * units) as u64 * m_b);
    let kernel = format!("moe_gemv_{name}");
    // one launch over `rows`: (weight planes, source row, output row)
    let launch = |rows: &[(u64, u64, u32, u32)]| -> Result<(), CudaError> {
        let wp: Vec<u64> = rows.iter().map(|r| r.0).collect();
        let wm: Vec<u64> = rows.iter().map(|r| r.1).collect();
        let src: Vec<u32> = rows.iter().map(|r| r.2).collect();
        let dst: Vec<u32> = rows.iter().map(|r| r.3).collect();
        let (wp_d, wm_d, src_d, dst_d) = (dev.upload_async(&wp)?, dev.upload_async(&wm)?, dev.upload_async(&src)?, dev.upload_async(&dst)?);
        // warps per row group by the matrix shape alone (moe_chunk::wpr_for: the same sums as
        // a prefill's chunked GEMV)
        let wpr = crate::moe::chunked_gemv::wpr_for(n_out, units);
        let grid = (n_out.div_ceil(8 / wpr) as u32, rows.len() as u32, 1);
        dev.launch(
            &kernel,
            grid,
            128,
            0,
            &[
                Arg::P(wp_d.ptr()),
                Arg::P(wm_d.ptr()),
                Arg::P(src_d.ptr()),
                Arg::P(dst_d.ptr()),
                Arg::P(xq.ptr()),
                Arg::P(xm.ptr()),
                Arg::P(out),
                Arg::I(units as i32),
                Arg::I(n_out as i32),
                Arg::I(wpr as i32),
            ],
        )
    };
    let row = |i: usize, p: u64, m: u64| -> Result<(u64, u64, u32, u32), CudaError> {
        let s = if x_per_token { routes[i].token as usize } else { i };
        if s >= n_src {
            return Err(CudaError::Shape(format!("moe_matmul: input row {s} of {n_src}")));
        }
        Ok((p, m, s as u32, i as u32))
    };
    match &w.offload {
        None => {
            let mut rows = Vec::with_capacity(routes.len());
            for (e, idx) in groups {
                let p = w.p.ptr + *e as u64 * slice_p;
                let m = if m_b == 0 { 0 } else { w.m_ptr() + *e as u64 * slice_m };
                for &i in idx {
                    rows.push(row(i, p, m)?);
                }
            }
            launch(&rows)
        }
        Some(off) if off.slots >= groups.len() => {
            // every expert of the step in a slot at once (the newest ticks: none evicts another)
            let mut rows = Vec::with_capacity(routes.len());
            for (e, idx) in groups {
                let ex = off.expert(dev, budget, *e, idx.len())?;
                for &i in idx {
                    rows.push(row(i, ex.p, ex.m)?);
                }
            }
            launch(&rows)
        }
        Some(off) => {
            for (e, idx) in groups {
                let ex = off.expert(dev, budget, *e, idx.len())?;
                let rows = idx.iter().map(|&i| row(i, ex.p, ex.m)).collect::<Result<Vec<_>, _>>()?;
                launch(&rows)?;
            }
            Ok(())
        }
    }
}

fn clear(qc: &Mutex<Option<QCache>>) {
    if let Ok(mut g) = qc.lock() {
        *g = None;
    }
}

/// `out[token] += weight · y[i]` for every route `i` (per token in route order, as the CPU).
/// `fresh`: `out` holds zeros (not yet written): written, never read.
pub(crate) fn moe_combine(
    dev: &Device,
    y: u64,
    y_len: usize,
    routes: &[Route],
    out: u64,
    out_len: usize,
    fresh: bool,
) -> Result<(), CudaError> {
    if routes.is_empty() {
        return Ok(());
    }
    if !y_len.is_multiple_of(routes.len()) {
        return Err(CudaError::Shape(format!("moe_combine: {y_len} values for {} routes", routes.len())));
    }
    let d = y_len / routes.len();
    if d == 0 || !out_len.is_multiple_of(d) {
        return Err(CudaError::Shape(format!("moe_combine: output of {out_len} values is not rows of {d}")));
    }
    let n_tok = out_len / d;
    let mut per: Vec<Vec<usize>> = vec![Vec::new(); n_tok];
    for (i, r) in routes.iter().enumerate() {
        let t = r.token as usize;
        per.get_mut(t).ok_or_else(|| CudaError::Shape(format!("moe_combine: token {t} out of range ({n_tok} rows)")))?.push(i);
    }
    let mut off = Vec::with_capacity(n_tok + 1);
    let (mut ridx, mut wts) = (Vec::with_capacity(routes.len()), Vec::with_capacity(routes.len()));
    off.push(0u32);
    for idx in &per {
        for &i in idx {
            ridx.push(i as u32);
            wts.push(routes[i].weight);
        }
        off.push(ridx.len() as u32);
    }
    let (r_d, w_d, o_d) = (dev.upload_async(&ridx)?, dev.upload_async(&wts)?, dev.upload_async(&off)?);
    dev.launch_1d(
        "moe_combine",
        out_len as u64,
        &[
            Arg::P(y),
            Arg::P(r_d.ptr()),
            Arg::P(w_d.ptr()),
            Arg::P(o_d.ptr()),
            Arg::P(out),
            Arg::I(d as i32),
            Arg::I(n_tok as i32),
            Arg::I(fresh as i32),
        ],
    )
}

/// The router on the host (`quarrel_core::moe`), counting each layer's expert selections.
pub(crate) fn route(
    counts: &Mutex<Vec<Vec<u64>>>,
    layer: usize,
    logits: &[f32],
    bias: Option<&[f32]>,
    p: &quarrel_core::MoeRouting,
) -> quarrel_core::Result<Vec<Route>> {
    let routes = crate::moe::host_route::route_fast(logits, bias, p)?;
    let mut c = counts.lock().map_err(|_| quarrel_core::CoreError::Backend("lock poisoned".into()))?;
    if c.len() <= layer {
        c.resize(layer + 1, Vec::new());
    }
    if c[layer].len() < p.n_expert {
        c[layer].resize(p.n_expert, 0);
    }
    for r in &routes {
        c[layer][r.expert as usize] += 1;
    }
    Ok(routes)
}
