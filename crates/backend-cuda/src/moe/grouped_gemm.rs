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

use crate::error::CudaError;
use crate::matmul::mmq;
use crate::matmul::QCache;
use crate::moe::ExpertCall;
use crate::runtime::Arg;
use quarrel_core::Route;
use std::sync::Mutex;

/// Largest grid height (work items per launch).
const MAX_ITEMS: usize = 65535;

/// Token tiles of the grouped kernels (`mmq::id_tile`): routes per work item.
pub const TILES: [usize; 4] = [16, 32, 64, 128];

/// Cost of a work item in routes' worth of work beyond its token slots (reading and decoding
/// its expert's weight rows, filling the pipeline): larger tiles amortize it, smaller ones
/// waste fewer slots.
const ITEM_COST: usize = 32;

/// How `cnt` routes of one expert are cut into items: tile indices into `TILES`, the
/// cheapest by `ITEM_COST` (full 128-route items while more than 128 are left, then the best
/// mix for the rest: 130 routes = 128 + 16, 40 = 64, 20 = 32, 10 = 16).
pub fn split(cnt: usize) -> Vec<usize> {
    // best[r]: (cost, first tile) for r <= 128 routes
    let big = TILES[TILES.len() - 1];
    let mut best = vec![(0usize, 0usize); big + 1];
    for r in 1..=big {
        best[r] = (0..TILES.len()).map(|t| (TILES[t] + ITEM_COST + best[r.saturating_sub(TILES[t])].0, t)).min().unwrap_or((usize::MAX, 0));
    }
    let mut out = Vec::new();
    let mut r = cnt;
    while r > big {
        out.push(TILES.len() - 1);
        r -= big;
    }
    while r > 0 {
        let t = best[r].1;
        out.push(t);
        r = r.saturating_sub(TILES[t]);
    }
    out
}

/// `split`'s first tile for 0..=128 routes (the device planner's table, `moe_plan`): the
/// split of r routes is t = table[r] (r > 128: the 128 tile), then the split of r - TILES[t].
pub fn split_table() -> &'static [u8] {
    // computed once: every grouped matmul of a prefill uploads it (the 129 dynamic programs
    // would cost ~150 us of host time per matmul)
    static TABLE: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| (0..=TILES[TILES.len() - 1]).map(|r| split(r).first().map_or(0, |&t| t as u8)).collect())
}

/// Whether a device-planned grouped matmul puts every work item into the 128-route class and
/// one launch (`moe_plan`'s `one`): when the experts average 64 routes or more, so that the
/// smaller classes would hold a few items each and run as launches of less than one wave
/// after the big one (in a Mixtral-8x7B prompt those small launches take over a third of the
/// grouped MMQ time). The 128-route kernel skips the token
/// tiles an item leaves empty, and the full items run first.
pub fn one_launch(n_routes: usize, n_expert: usize) -> bool {
    n_routes >= 64 * n_expert.max(1)
}

/// Work items per tile class that a device plan of `n_routes` routes over `n_expert` experts
/// can need: one item of each smaller tile per expert at most (two of a tile never cost less
/// than one of the next), full 128-route items besides.
pub fn max_items(n_routes: usize, n_expert: usize) -> [usize; 4] {
    let e = n_expert.min(n_routes);
    [e, e, e, n_routes / TILES[3] + e]
}

/// One work item: `cnt` routes of `expert` at `off` in src / dst, in tile `tile` of `TILES`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Item {
    pub expert: usize,
    pub off: u32,
    pub cnt: u32,
    pub tile: usize,
}

/// The grouped layout of `groups` (expert, route indices): per grouped route its activation
/// row (`src`) and output row (`dst`, the route index); the work items (`split` per expert).
#[derive(Debug, PartialEq)]
pub struct Plan {
    pub src: Vec<u32>,
    pub dst: Vec<u32>,
    pub items: Vec<Item>,
}

pub fn plan(groups: &[(usize, Vec<usize>)], routes: &[Route], x_per_token: bool, n_src: usize) -> Result<Plan, CudaError> {
    let mut p = Plan { src: Vec::with_capacity(routes.len()), dst: Vec::with_capacity(routes.len()), items: vec![] };
    for (e, idx) in groups {
        let mut at = 0usize;
        for t in split(idx.len()) {
            let n = TILES[t].min(idx.len() - at);
            p.items.push(Item { expert: *e, off: p.src.len() as u32, cnt: n as u32, tile: t });
            for &i in &idx[at..at + n] {
                let s = if x_per_token { routes[i].token as usize } else { i };
                if s >= n_src {
                    return Err(CudaError::Shape(format!("moe_matmul: input row {s} of {n_src}")));
                }
                p.src.push(s as u32);
                p.dst.push(i as u32);
            }
            at += n;
        }
    }
    Ok(p)
}

/// The grouped expert matmul (see the module doc); `out (routes, n_out)`.
pub(crate) fn matmul(qc: &Mutex<Option<QCache>>, c: &ExpertCall) -> Result<(), CudaError> {
    let ExpertCall { dev, budget, w, name, n_out, x, n_src, routes, x_per_token, groups, out } = *c;
    if groups.is_empty() {
        return Ok(());
    }
    let n_in = w.n_in;
    let units = n_in / 32;
    let plan = plan(groups, routes, x_per_token, n_src)?;
    let (xq, xm) = crate::matmul::q8_activations(dev, qc, x, n_src, n_in, out)?;
    let (src_d, dst_d) = (dev.upload_async(&plan.src)?, dev.upload_async(&plan.dst)?);
    let (pb, m_b) = mmq::unit_bytes(name)?;
    let (slice_p, slice_m) = ((n_out * units) as u64 * pb.0 / pb.1, (n_out * units) as u64 * m_b);
    // `items` with their experts' planes: one launch per tile (at most MAX_ITEMS items each)
    let launch = |items: &[(Item, u64, u64)]| -> Result<(), CudaError> {
        for (t, &tile) in TILES.iter().enumerate() {
            let mine: Vec<&(Item, u64, u64)> = items.iter().filter(|it| it.0.tile == t).collect();
            let (suffix, rows, _, threads, smem) = mmq::id_tile(tile);
            let kernel = format!("mmq_id_{name}_{suffix}");
            for chunk in mine.chunks(MAX_ITEMS) {
                let v: Vec<u64> = chunk.iter().flat_map(|(it, p, m)| [*p, *m, it.off as u64 | (it.cnt as u64) << 32]).collect();
                let it = dev.upload_async(&v)?;
                dev.launch(
                    &kernel,
                    (n_out.div_ceil(rows) as u32, chunk.len() as u32, 1),
                    threads,
                    smem,
                    &[
                        Arg::P(it.ptr()),
                        Arg::P(src_d.ptr()),
                        Arg::P(dst_d.ptr()),
                        Arg::P(xq),
                        Arg::P(xm),
                        Arg::P(out),
                        Arg::I(units as i32),
                        Arg::I(n_out as i32),
                        Arg::P(0),
                    ],
                )?;
            }
        }
        Ok(())
    };
    let resident = |e: usize| (w.p.ptr + e as u64 * slice_p, if m_b == 0 { 0 } else { w.m_ptr() + e as u64 * slice_m });
    match &w.offload {
        None => launch(
            &plan
                .items
                .iter()
                .map(|it| {
                    let (p, m) = resident(it.expert);
                    (*it, p, m)
                })
                .collect::<Vec<_>>(),
        ),
        Some(off) if off.slots >= groups.len() => {
            // every expert of the step in a slot at once (the newest ticks: none evicts another)
            let mut at = vec![(0u64, 0u64); off.n_expert];
            for (e, idx) in groups {
                let ex = off.expert(dev, budget, *e, idx.len())?;
                at[*e] = (ex.p, ex.m);
            }
            launch(&plan.items.iter().map(|it| (*it, at[it.expert].0, at[it.expert].1)).collect::<Vec<_>>())
        }
        Some(off) => {
            // one expert at a time, each launched right after its upload
            let mut i = 0;
            while i < plan.items.len() {
                let e = plan.items[i].expert;
                let n = plan.items[i..].iter().take_while(|it| it.expert == e).count();
                let rows_e: u32 = plan.items[i..i + n].iter().map(|it| it.cnt).sum();
                let ex = off.expert(dev, budget, e, rows_e as usize)?;
                launch(&plan.items[i..i + n].iter().map(|it| (*it, ex.p, ex.m)).collect::<Vec<_>>())?;
                i += n;
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_takes_the_cheapest_tiles() {
        let routes = |v: &[usize]| v.iter().map(|&t| TILES[t]).collect::<Vec<_>>();
        assert_eq!(routes(&split(10)), vec![16]);
        assert_eq!(routes(&split(20)), vec![32]);
        assert_eq!(routes(&split(40)), vec![64]);
        assert_eq!(routes(&split(128)), vec![128]);
        assert_eq!(routes(&split(130)), vec![128, 16]);
        assert!(split(0).is_empty());
        for cnt in 1..600 {
            let s = split(cnt);
            let cap: usize = s.iter().map(|&t| TILES[t]).sum();
            // every route placed, no item left empty
            assert!(cap >= cnt && cap - TILES[*s.last().unwrap()] < cnt, "{cnt}: {s:?}");
        }
    }

    #[test]
    fn split_table_walk_equals_split_and_bounds_hold() {
        let tab = split_table();
        for cnt in 0..700usize {
            let mut walk = vec![];
            let mut r = cnt;
            while r > 0 {
                let t = if r > 128 { 3 } else { tab[r] as usize };
                walk.push(t);
                r = r.saturating_sub(TILES[t]);
            }
            assert_eq!(walk, split(cnt), "{cnt}");
            let per: Vec<usize> = (0..4).map(|t| walk.iter().filter(|&&w| w == t).count()).collect();
            assert!(per[..3].iter().all(|&n| n <= 1), "{cnt}: {walk:?}");
        }
        // a routing that needs the most items of every class fits the bounds
        let m = max_items(6 * 512, 128);
        assert!(m[3] >= 6 * 512 / 128 + 128 && m[0] == 128);
    }

    #[test]
    fn one_launch_where_experts_average_64_routes() {
        // Mixtral pp512 (1024 routes over 8 experts), Nemotron (3072 over 128), Granite (3072 over 64)
        assert!(one_launch(1024, 8) && one_launch(512, 8));
        assert!(!one_launch(3072, 128) && !one_launch(3072, 64) && !one_launch(511, 8));
        assert!(!one_launch(0, 0) && one_launch(64, 0));
    }

    #[test]
    fn plan_maps_every_route_once_in_items_of_one_expert() {
        // 150 routes of expert 2 (items of 128 + 32), 1 of expert 5
        let (routes, groups) = crate::moe::test_routes(151);
        let p = plan(&groups, &routes, true, 76).unwrap();
        let items: Vec<(usize, u32, u32, usize)> = p.items.iter().map(|it| (it.expert, it.off, it.cnt, TILES[it.tile])).collect();
        assert_eq!(items, vec![(2, 0, 128, 128), (2, 128, 22, 32), (5, 150, 1, 16)]);
        let mut seen = p.dst.clone();
        seen.sort();
        assert_eq!(seen, (0..151).collect::<Vec<u32>>());
        for it in &p.items {
            assert!(it.cnt as usize <= TILES[it.tile]);
            for j in it.off..it.off + it.cnt {
                let i = p.dst[j as usize] as usize;
                assert_eq!(routes[i].expert as usize, it.expert);
                assert_eq!(p.src[j as usize], routes[i].token, "input row of route {i}");
            }
        }
        // per route input (down projection): source row = route index
        let p2 = plan(&groups, &routes, false, 151).unwrap();
        assert_eq!(p2.src, p2.dst);
        assert!(plan(&groups, &routes, true, 3).is_err(), "token past the input");
    }
}
