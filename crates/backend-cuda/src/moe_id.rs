//! Prefill expert matmuls as one grouped MMQ launch per matrix (ggml's `mul_mat_id` idea, our
//! own kernels: `mmq_id_<type>_<NT>_<WM>` in `kernels/mmq.cu`):
//!
//! ```text
//!  x (tokens or routes, n_in) ──quantize_q8 (once; gate and up share it)──► (xq, xm)
//!  routes grouped by expert ──► src / dst (activation row, output row per grouped route)
//!                               items: (expert planes, offset, count <= 16·NT) per work item
//!  mmq_id (grid: row blocks x items) ──► out (routes, n_out), written in route order
//! ```
//!
//! Each block reads its expert's weight rows once for up to 16·NT routes (no gather of the
//! activations, no scatter of the results, no split K). Per route the sums are the dense
//! MMQ's: exact integer block sums over the Q8 activations decode uses, f32 scale products.

use crate::device::{Arg, Device};
use crate::error::CudaError;
use crate::experts::ExpertBudget;
use crate::matmul::QCache;
use crate::mmq;
use crate::weight::CudaWeight;
use quarrel_core::Route;
use std::sync::Mutex;

/// Largest grid height (work items per launch).
const MAX_ITEMS: usize = 65535;

/// The grouped layout of `groups` (expert, route indices): per grouped route its activation
/// row (`src`) and output row (`dst`, the route index); per work item (expert, offset, count)
/// with counts of at most `per_item`.
#[derive(Debug, PartialEq)]
pub struct Plan {
    pub src: Vec<u32>,
    pub dst: Vec<u32>,
    pub items: Vec<(usize, u32, u32)>,
}

pub fn plan(groups: &[(usize, Vec<usize>)], routes: &[Route], x_per_token: bool, n_src: usize, per_item: usize) -> Result<Plan, CudaError> {
    let mut p = Plan { src: Vec::with_capacity(routes.len()), dst: Vec::with_capacity(routes.len()), items: vec![] };
    let per_item = per_item.max(1);
    for (e, idx) in groups {
        for ch in idx.chunks(per_item) {
            p.items.push((*e, p.src.len() as u32, ch.len() as u32));
            for &i in ch {
                let s = if x_per_token { routes[i].token as usize } else { i };
                if s >= n_src {
                    return Err(CudaError::Shape(format!("moe_matmul: input row {s} of {n_src}")));
                }
                p.src.push(s as u32);
                p.dst.push(i as u32);
            }
        }
    }
    Ok(p)
}

/// The grouped expert matmul (see the module doc); `out (routes, n_out)`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul(
    dev: &Device,
    qc: &Mutex<Option<QCache>>,
    budget: &ExpertBudget,
    w: &CudaWeight,
    name: &str,
    n_out: usize,
    x: u64,
    n_src: usize,
    routes: &[Route],
    x_per_token: bool,
    groups: &[(usize, Vec<usize>)],
    out: u64,
) -> Result<(), CudaError> {
    if groups.is_empty() {
        return Ok(());
    }
    let n_in = w.n_in;
    let units = n_in / 32;
    let (suffix, rows, per_item, threads, smem) = mmq::id_tile(routes.len().div_ceil(groups.len()));
    let plan = plan(groups, routes, x_per_token, n_src, per_item)?;
    let (xq, xm) = crate::matmul::q8_activations(dev, qc, x, n_src, n_in, out)?;
    let (src_d, dst_d) = (dev.upload_async(&plan.src)?, dev.upload_async(&plan.dst)?);
    let (pb, m_b) = mmq::unit_bytes(name)?;
    let (slice_p, slice_m) = ((n_out * units) as u64 * pb.0 / pb.1, (n_out * units) as u64 * m_b);
    let kernel = format!("mmq_id_{name}_{suffix}");
    // items i0.. with their experts' planes, in launches of at most MAX_ITEMS
    let launch = |i0: usize, planes: &[(u64, u64)]| -> Result<(), CudaError> {
        for (c, pl) in planes.chunks(MAX_ITEMS).enumerate() {
            let mut v = Vec::with_capacity(3 * pl.len());
            for (k, &(p, m)) in pl.iter().enumerate() {
                let (_, off, cnt) = plan.items[i0 + c * MAX_ITEMS + k];
                v.extend([p, m, off as u64 | (cnt as u64) << 32]);
            }
            let it = dev.upload_async(&v)?;
            dev.launch(
                &kernel,
                (n_out.div_ceil(rows) as u32, pl.len() as u32, 1),
                threads,
                smem,
                &[Arg::P(it.ptr()), Arg::P(src_d.ptr()), Arg::P(dst_d.ptr()), Arg::P(xq), Arg::P(xm), Arg::P(out), Arg::I(units as i32), Arg::I(n_out as i32)],
            )?;
        }
        Ok(())
    };
    match &w.offload {
        None => {
            let planes: Vec<(u64, u64)> =
                plan.items.iter().map(|&(e, _, _)| (w.p.ptr + e as u64 * slice_p, if m_b == 0 { 0 } else { w.m_ptr() + e as u64 * slice_m })).collect();
            launch(0, &planes)
        }
        Some(off) if off.slots >= groups.len() => {
            // every expert of the step in a slot at once (the newest ticks: none evicts another)
            let mut at = vec![(0u64, 0u64); off.n_expert];
            for (e, idx) in groups {
                let ex = off.expert(dev, budget, *e, idx.len())?;
                at[*e] = (ex.p, ex.m);
            }
            let planes: Vec<(u64, u64)> = plan.items.iter().map(|&(e, _, _)| at[e]).collect();
            launch(0, &planes)
        }
        Some(off) => {
            // one expert at a time, each launched right after its upload
            let mut i = 0;
            while i < plan.items.len() {
                let e = plan.items[i].0;
                let n = plan.items[i..].iter().take_while(|it| it.0 == e).count();
                let rows_e: u32 = plan.items[i..i + n].iter().map(|it| it.2).sum();
                let ex = off.expert(dev, budget, e, rows_e as usize)?;
                launch(i, &vec![(ex.p, ex.m); n])?;
                i += n;
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(token: u32, expert: u32) -> Route {
        Route { token, expert, weight: 1.0 }
    }

    #[test]
    fn plan_maps_every_route_once_in_items_of_one_expert() {
        // 11 routes of expert 2 (items of 4: 4 + 4 + 3), 1 of expert 5
        let routes: Vec<Route> = (0..12).map(|i| r(i / 2, if i == 7 { 5 } else { 2 })).collect();
        let groups = crate::moe::group_by_expert(&routes, 6).unwrap();
        let p = plan(&groups, &routes, true, 6, 4).unwrap();
        assert_eq!(p.items, vec![(2, 0, 4), (2, 4, 4), (2, 8, 3), (5, 11, 1)]);
        let mut seen = p.dst.clone();
        seen.sort();
        assert_eq!(seen, (0..12).collect::<Vec<u32>>());
        for &(e, off, cnt) in &p.items {
            for j in off..off + cnt {
                let i = p.dst[j as usize] as usize;
                assert_eq!(routes[i].expert as usize, e);
                assert_eq!(p.src[j as usize], routes[i].token, "input row of route {i}");
            }
        }
        // per route input (down projection): source row = route index
        let p2 = plan(&groups, &routes, false, 12, 16).unwrap();
        assert_eq!(p2.src, p2.dst);
        assert_eq!(p2.items.len(), 2);
        assert!(plan(&groups, &routes, true, 3, 4).is_err(), "token past the input");
    }
}
