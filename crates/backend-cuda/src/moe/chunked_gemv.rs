//! Expert matmuls of a prompt in exact numerics, as chunked GEMV: the routes of each expert
//! are cut into chunks of 8 rows and one launch multiplies every chunk by its expert with the
//! decode GEMV's arithmetic (`moe_gemv8_<type>`), so a prompt gives decode's bits:
//!
//! ```text
//!  x ──gather_rows (chunk rows, padded to 8)──► xs ──quantize_q8──► (xq, xm)
//!    ──moe_gemv8 (grid: row blocks x chunks)──► ys ──moe_unpad_rows──► out (route order)
//! ```
//!
//! The per-route result equals `moe_gemv`'s (decode) bit for bit: gemv_q accumulates each of
//! its tokens independently in the same order, and the warps per row (`wpr`) depend on the
//! matrix height only.

use crate::error::CudaError;
use crate::matmul::mmq;
use crate::moe::ExpertCall;
use crate::runtime::Arg;
use quarrel_core::Route;

/// Rows per chunk (gemv_q's widest token count).
pub const CHUNK: usize = 8;

/// Warps per row group of the expert GEMVs: the dense GEMV's rule (`matmul::gemv_shape`:
/// rows of 64+ units two warps, four for 128+ units and under 2,400 rows; short rows by the
/// block count), from the matrix shape only, never the number of routes, so decode and
/// prefill share the reduction.
pub fn wpr_for(n_out: usize, units: usize) -> usize {
    if units >= 64 {
        return if units >= 128 && n_out < 2400 { 4 } else { 2 };
    }
    let blocks1 = n_out.div_ceil(8);
    if blocks1 >= 1024 {
        1
    } else if blocks1 >= 512 {
        2
    } else {
        4
    }
}

/// The chunk layout of `groups` (expert, route indices): per chunk its expert; per padded row
/// its source row of x; per real row (padded row, route index).
#[derive(Debug, PartialEq)]
pub struct Plan {
    pub experts: Vec<usize>,
    pub src: Vec<u32>,
    pub real: Vec<(u32, u32)>,
}

pub fn plan(groups: &[(usize, Vec<usize>)], routes: &[Route], x_per_token: bool, n_src: usize) -> Result<Plan, CudaError> {
    let mut p = Plan { experts: vec![], src: vec![], real: vec![] };
    for (e, idx) in groups {
        for ch in idx.chunks(CHUNK) {
            p.experts.push(*e);
            let base = p.src.len();
            for (k, &i) in ch.iter().enumerate() {
                let s = if x_per_token { routes[i].token as usize } else { i };
                if s >= n_src {
                    return Err(CudaError::Shape(format!("moe_matmul: input row {s} of {n_src}")));
                }
                p.src.push(s as u32);
                p.real.push(((base + k) as u32, i as u32));
            }
            // padding repeats the chunk's first row (results dropped)
            let first = p.src[base];
            p.src.resize(base + CHUNK, first);
        }
    }
    Ok(p)
}

/// The chunked expert matmul (see the module doc); `out (routes, n_out)`.
pub(crate) fn matmul(c: &ExpertCall) -> Result<(), CudaError> {
    let ExpertCall { dev, budget, w, name, n_out, x, n_src, routes, x_per_token, groups, out } = *c;
    let n_in = w.n_in;
    let units = n_in / 32;
    let plan = plan(groups, routes, x_per_token, n_src)?;
    let rows = plan.src.len();
    let n_chunks = plan.experts.len();
    let (_src_d, xs) = super::gather_rows(dev, x, &plan.src, n_in)?;
    let nb = rows * units;
    let (xq, xm) = (dev.scratch(rows * n_in)?, dev.scratch(nb * 8)?);
    dev.launch(
        "quantize_q8",
        ((nb as u32).div_ceil(8), 1, 1),
        256,
        0,
        &[Arg::P(xs.ptr()), Arg::P(xq.ptr()), Arg::P(xm.ptr()), Arg::I(nb as i32)],
    )?;
    let ys = dev.scratch(4 * rows * n_out)?;
    let (pb, m_b) = mmq::unit_bytes(name)?;
    let (slice_p, slice_m) = ((n_out * units) as u64 * pb.0 / pb.1, (n_out * units) as u64 * m_b);
    let wpr = wpr_for(n_out, units);
    let kernel = format!("moe_gemv8_{name}");
    // chunks c0.. with their weight planes, one launch
    let launch = |c0: usize, planes: &[(u64, u64)]| -> Result<(), CudaError> {
        let wp: Vec<u64> = planes.iter().map(|p| p.0).collect();
        let wm: Vec<u64> = planes.iter().map(|p| p.1).collect();
        let (wp_d, wm_d) = (dev.upload_async(&wp)?, dev.upload_async(&wm)?);
        dev.launch(
            &kernel,
            (n_out.div_ceil(8 / wpr) as u32, planes.len() as u32, 1),
            128,
            0,
            &[
                Arg::P(wp_d.ptr()),
                Arg::P(wm_d.ptr()),
                Arg::P(xq.ptr() + (c0 * CHUNK * n_in) as u64),
                Arg::P(xm.ptr() + (c0 * CHUNK * units * 8) as u64),
                Arg::P(ys.ptr() + (4 * c0 * CHUNK * n_out) as u64),
                Arg::I(units as i32),
                Arg::I(n_out as i32),
                Arg::I(wpr as i32),
            ],
        )
    };
    match &w.offload {
        None => {
            let planes: Vec<(u64, u64)> = plan
                .experts
                .iter()
                .map(|&e| (w.p.ptr + e as u64 * slice_p, if m_b == 0 { 0 } else { w.m_ptr() + e as u64 * slice_m }))
                .collect();
            launch(0, &planes)?;
        }
        Some(off) if off.slots >= groups.len() => {
            let mut planes = Vec::with_capacity(n_chunks);
            let mut c = 0;
            for (e, idx) in groups {
                let ex = off.expert(dev, budget, *e, idx.len())?;
                let n = idx.len().div_ceil(CHUNK);
                planes.extend(std::iter::repeat_n((ex.p, ex.m), n));
                c += n;
            }
            debug_assert_eq!(c, n_chunks);
            launch(0, &planes)?;
        }
        Some(off) => {
            // one expert at a time, each launched right after its upload
            let mut c = 0;
            for (e, idx) in groups {
                let ex = off.expert(dev, budget, *e, idx.len())?;
                let n = idx.len().div_ceil(CHUNK);
                launch(c, &vec![(ex.p, ex.m); n])?;
                c += n;
            }
        }
    }
    let (rs, rd): (Vec<u32>, Vec<u32>) = plan.real.iter().copied().unzip();
    let (rs_d, rd_d) = (dev.upload_async(&rs)?, dev.upload_async(&rd)?);
    let n = rs.len();
    dev.launch_1d(
        "moe_unpad_rows",
        (n * n_out) as u64,
        &[Arg::P(ys.ptr()), Arg::P(rs_d.ptr()), Arg::P(rd_d.ptr()), Arg::P(out), Arg::I(n_out as i32), Arg::I(n as i32)],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_pads_chunks_and_maps_every_route_once() {
        // 11 routes of expert 2 (two chunks), 1 of expert 5
        let (routes, groups) = crate::moe::test_routes(12);
        let p = plan(&groups, &routes, true, 6).unwrap();
        assert_eq!(p.experts, vec![2, 2, 5]);
        assert_eq!(p.src.len(), 3 * CHUNK);
        let mut seen: Vec<u32> = p.real.iter().map(|&(_, i)| i).collect();
        seen.sort();
        assert_eq!(seen, (0..12).collect::<Vec<u32>>());
        for &(row, i) in &p.real {
            assert_eq!(p.src[row as usize], routes[i as usize].token, "row {row} reads route {i}'s token");
            let chunk = row as usize / CHUNK;
            assert_eq!(p.experts[chunk] as u32, routes[i as usize].expert);
        }
        // padding repeats a real row of its chunk
        assert_eq!(p.src[2 * CHUNK + 1], p.src[2 * CHUNK]);
        // per route input (down projection): source row = route index
        let p2 = plan(&groups, &routes, false, 12).unwrap();
        assert!(p2.real.iter().all(|&(row, i)| p2.src[row as usize] == i));
        assert!(plan(&groups, &routes, true, 3).is_err(), "token past the input");
    }

    #[test]
    fn warps_per_row_from_the_matrix_shape() {
        assert_eq!(wpr_for(14336, 128), 2); // Mixtral gate/up
        assert_eq!(wpr_for(1856, 84), 2); // Nemotron up (2688 inputs)
        assert_eq!(wpr_for(2048, 448), 4); // down of a wide expert
        assert_eq!(wpr_for(16384, 8), 1); // short rows: by the block count
        assert_eq!(wpr_for(256, 8), 4);
    }
}
