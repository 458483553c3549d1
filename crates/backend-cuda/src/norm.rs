//! RMSNorm launches (kernels/norm_row.cuh): one block per row, with the residual add held
//! before it (`add_rms_norm`, `add_scaled_rms_norm`), with a held MoE combine before that too
//! (`comb_add_rms_norm`), and a cluster of blocks per row (`*_cl`, off by default). Every
//! variant computes the row with the same split and order: the same bits.

use crate::runtime::Arg;
use crate::fusion::{Device, Held};
use crate::error::CudaError;
use std::sync::atomic::{AtomicU8, Ordering::Relaxed};

/// `QUARREL_CUDA_NORM_THREADS` (a multiple of 32 up to 1024): threads of the RMSNorm block, for
/// measurements.
fn norm_threads() -> Option<u32> {
    static T: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    *T.get_or_init(|| std::env::var("QUARREL_CUDA_NORM_THREADS").ok().and_then(|v| v.parse().ok()).filter(|t| t % 32 == 0 && (32..=1024).contains(t)))
}

/// Blocks per row of the cluster RMSNorm kernels (NORM_NC in kernels/norm_cluster.cu).
const NORM_NC: u32 = 4;

/// 0 not read yet, 1 cluster RMSNorm kernels (sm_90+, rows of 2,048+ values: `*_cl` in
/// kernels/norm_cluster.cu), 2 one block per row (the default); `QUARREL_CUDA_NORM_CLUSTER=1|0`,
/// or `CudaBackend::set_norm_cluster` (process-wide, for A/B tests). Both give the same bits. Off
/// by default: H100 2026-11-23, 7B Q4_0 tg128 0.6-0.9% slower with it (424.0 / 429.5 vs 429.5
/// / 428.9 t/s; with attn_vec2_f16 455.0 / 458.1 vs 460.4 / 461.4), TinyLlama within noise.
pub(crate) static NORM_CLUSTER: AtomicU8 = AtomicU8::new(0);

fn norm_cluster() -> bool {
    match NORM_CLUSTER.load(Relaxed) {
        0 => {
            let on = std::env::var("QUARREL_CUDA_NORM_CLUSTER").is_ok_and(|v| v == "1");
            NORM_CLUSTER.store(if on { 1 } else { 2 }, Relaxed);
            on
        }
        k => k == 1,
    }
}

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

/// Whether rows of `d` values normalized by blocks of `threads` can run as the cluster kernels
/// (NORM_NC blocks of 4+ warps each, every thread's values in registers).
fn cluster_fits(dev: &Device, d: usize, threads: u32) -> bool {
    dev.cc.0 >= 9 && d % 4 == 0 && threads % (NORM_NC * 128) == 0 && d / 4 <= 4 * threads as usize
}

/// Queue the RMSNorm of `r`, absorbing a held residual add (and a held MoE combine before it).
pub(crate) fn rms_norm(dev: &Device, r: Row) -> Result<(), CudaError> {
    let d = r.d;
    // a decode step normalizes one row: more threads per row shorten the block
    let threads = norm_threads().unwrap_or((d / 4).div_ceil(32).clamp(4, 32) as u32 * 32);
    let n = r.rows as u64 * d as u64;
    // every row by a cluster of NORM_NC blocks (kernels/norm_cluster.cu: the same split of the
    // row, the same bits) where switched on
    let cl = norm_cluster() && cluster_fits(dev, d, threads);
    let (grid, threads) = if cl { ((r.rows * NORM_NC, 1, 1), threads / NORM_NC) } else { ((r.rows, 1, 1), threads) };
    // float4 rows (norm_row_v4): the variant a held combine can join, in blocks of fewer than
    // 1,024 threads. A full block must fit 64 registers (kernels/ops.cu's launch bounds) and
    // then spills; measured H100 2026-11-23: Mixtral-8x7B (rows of 4,096, 1,024 threads) tg128
    // 246.9 / 242.9 t/s fused vs 250.6 / 245.6 separate, Nemotron-3-Nano (2,688, 672 threads)
    // 412.5 fused vs 405.5 separate (same runs).
    let v4 = d % 4 == 0 && threads % 32 == 0 && threads < 1024 && !cl;
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
            let name = match (s.is_some(), cl) {
                (false, false) => "add_rms_norm",
                (false, true) => "add_rms_norm_cl",
                (true, false) => "add_scaled_rms_norm",
                (true, true) => "add_scaled_rms_norm_cl",
            };
            let mut a = vec![Arg::P(r.x), Arg::P(y)];
            a.extend(s.map(Arg::F));
            (name, a)
        }
        _ => (if cl { "rms_norm_cl" } else { "rms_norm" }, vec![Arg::P(r.x)]),
    };
    args.extend(tail);
    // a plain norm took nothing held: what is held goes first
    if name.starts_with("rms_norm") {
        return dev.launch(name, grid, threads, 0, &args);
    }
    dev.launch_now(name, grid, threads, 0, &args)
}
