//! RMSNorm launches (kernels/norm_row.cuh): one block per row, with the residual add held
//! before it (`add_rms_norm`, `add_scaled_rms_norm`), with a held MoE combine before that too
//! (`comb_add_rms_norm`). Every variant computes the row with the same split and order: the
//! same bits.

use crate::error::CudaError;
use crate::fusion::{Device, Held};
use crate::runtime::Arg;

/// One RMSNorm call: `rows` rows of `d` values at `x`, weights `w`, output `out` and its Q8
/// form (`xq`, `xm`; 0 for none).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Row {
    pub x: u64,
    pub w: u64,
    pub out: u64,
    pub d: usize,
    pub rows: u32,
    pub eps: f32,
    pub xq: u64,
    pub xm: u64,
}

/// Queue the RMSNorm of `r`, absorbing a held residual add (and a held MoE combine before it).
pub(crate) fn rms_norm(dev: &Device, r: Row) -> Result<(), CudaError> {
    let d = r.d;
    // a decode step normalizes one row: more threads per row shorten the block
    let threads = (d / 4).div_ceil(32).clamp(4, 32) as u32 * 32;
    let n = r.rows as u64 * d as u64;
    let grid = (r.rows, 1, 1);
    // float4 rows (norm_row_v4): the variant a held combine can join, in blocks of fewer than
    // 1,024 threads (a full block must fit 64 registers, kernels/ops.cu's launch bounds, and
    // then spills: slower than the combine launched separately).
    let v4 = d.is_multiple_of(4) && threads.is_multiple_of(32) && threads < 1024;
    let held = dev.take_held_if(|h| match h {
        Held::Add { x, n: hn, .. } | Held::CombAdd { x, n: hn, .. } => *x == r.x && *hn == n,
        _ => false,
    });
    let held = match held {
        Some(Held::CombAdd { c, x, n, s }) if !v4 => {
            c.launch(dev)?;
            Some(Held::Add { x, y: c.out, n, s })
        }
        h => h,
    };
    let tail = [Arg::P(r.w), Arg::P(r.out), Arg::I(d as i32), Arg::F(r.eps), Arg::P(r.xq), Arg::P(r.xm)];
    let (name, mut args): (&'static str, Vec<Arg>) = match held {
        Some(Held::CombAdd { c, s, .. }) => {
            let mut a = vec![Arg::P(r.x), Arg::P(c.out)];
            a.extend(c.args());
            a.extend(s.map(Arg::F));
            (if s.is_some() { "comb_add_scaled_rms_norm" } else { "comb_add_rms_norm" }, a)
        }
        Some(Held::Add { y, s, .. }) => {
            let name = if s.is_some() { "add_scaled_rms_norm" } else { "add_rms_norm" };
            let mut a = vec![Arg::P(r.x), Arg::P(y)];
            a.extend(s.map(Arg::F));
            (name, a)
        }
        _ => ("rms_norm", vec![Arg::P(r.x)]),
    };
    args.extend(tail);
    // a plain norm took nothing held: what is held goes first
    if name.starts_with("rms_norm") {
        return dev.launch(name, grid, threads, 0, &args);
    }
    dev.launch_now(name, grid, threads, 0, &args)
}
