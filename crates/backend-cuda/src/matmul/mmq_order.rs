//! Invariant numerics (`CudaBackend::set_invariant_numerics`, `--numerics invariant`): every
//! token count multiplies in MMQ's float order, so a prompt's logits do not depend on how its
//! tokens were batched (one prefill, a prefill then decode steps, or a batch of sequences),
//! at prefill speed: prompts take MMQ itself (never split over K, never the f16 GEMM), decode
//! steps the GEMV in MMQ's order (`kernels/gemvm.cu`: per output the same integer unit sums,
//! rounded scale products, fused multiply-adds and tensor-core offset sums, in the same order).
//! Float weights (routers, small F32 / F16 matrices) take the float GEMV at every token count.
//!
//! ```text
//!  quantized W, n_tok <= 8:  x ──q8_activations──► (xq, xm) ──gemvm_<type>_<NT>──► out
//!                            (q/k/v, gate/up over one input: one gemvm3_<type>_<NT> launch)
//!  quantized W, n_tok > 8:   x ──q8_activations──► (xq, xm) ──mmq_<type>_<tile> (unsplit)──► out
//!  float W:                  x ──gemv_<type>_<NT> (chunks of up to 8 tokens)──► out
//!  routed experts:           device routes: n_tok <= 8 moe_gemvm_dev_<type>, else mmq_id (grouped)
//! ```
//!
//! With the routing, attention (`attn_mmi_f16_*` over f16 caches: the tensor cores over absolute
//! 256-position spans at every token count, `attn.rs`; other caches `set_exact_attention`'s one
//! pass) and every other op already independent of the batch, the whole forward pass is.

use crate::error::CudaError;
use crate::fusion::Device;
use crate::matmul::QCache;
use crate::runtime::Arg;
use crate::weights::{CudaWeight, DevType};
use std::sync::Mutex;

/// Rows per block of `gemvm_*` / `moe_gemvm_dev_*` (GEMVM_ROWS in gemvm.cu).
pub(crate) const ROWS_PER_BLOCK: usize = 16;
/// Compute warps per block (GEMVM_W), units per round (GEMVM_RU) and the padded row stride of
/// a slot's products (GEMVM_TPS).
const COMPUTE_WARPS: usize = 8;
const ROUND_UNITS: usize = 8 * COMPUTE_WARPS;
const TPS: usize = 8 * COMPUTE_WARPS + 8;

/// Weight buffers in flight per block (GEMVM_NB in gemvm.cu).
const BUFFERS: usize = 3;

/// Product slots of one- and two-token blocks (GEMVM_NS in gemvm.cu).
const SLOTS: usize = 4;

/// A buffer row's padded bytes per round (gemvm.cu `GemvmPlanes`): (quant plane or K-quant
/// super-blocks, meta plane).
fn row_bytes(name: &str) -> Result<(usize, usize), CudaError> {
    let k = |sb: usize| (COMPUTE_WARPS * sb + 16, 0);
    let plane = |pu: usize, msz: usize| (ROUND_UNITS * pu + 16, ROUND_UNITS * msz + 16);
    Ok(match name {
        "q4_K" => k(144),
        "q5_K" => k(176),
        "q6_K" => k(224),
        "q8_0" => plane(32, 2),
        "q4_0" => plane(16, 2),
        "q4_1" => plane(16, 4),
        "q5_0" | "q5_1" => plane(16, 8),
        other => return Err(CudaError::Unsupported(format!("the MMQ-order GEMV over {other} weights"))),
    })
}

/// Threads and dynamic shared memory of a `gemvm*_<name>_<nt>` block (gemvm.cu
/// `GemvmShape<QT, NT>`): the compute warps, a fold warp per 32 (row, token) chains and the copy
/// warp; a ring of slots (4 for one or two tokens, else 2) of products, offset sums, offset
/// factors and activation scales, the weight buffers (16 rows plus the round's activations and
/// their scales), then an mbarrier pair per slot and per buffer.
pub(crate) fn dims(name: &str, nt: usize) -> Result<(u32, u32), CudaError> {
    debug_assert!(matches!(nt, 1 | 2 | 4 | 8));
    let (slots, fold) = if nt <= 2 { (SLOTS, 1) } else { (2, nt / 2) };
    let w = COMPUTE_WARPS;
    let slot = nt * ROWS_PER_BLOCK * TPS + w * nt * ROWS_PER_BLOCK + w * ROWS_PER_BLOCK + w * nt * 8;
    let (rsp, rsm) = row_bytes(name)?;
    let buf = ROWS_PER_BLOCK * (rsp + rsm) + nt * ROUND_UNITS * (32 + 8);
    // GEMVM_NB buffers, fewer where they would not fit a block's 227 KB (gemvm.cu `fit`)
    let bytes = |nb: usize| slots * slot * 4 + nb * buf + (2 * slots + 2 * nb) * 8;
    let nb = (1..=BUFFERS).rev().find(|&nb| nb == 1 || bytes(nb) <= 227 * 1024).unwrap_or(1);
    Ok(((32 * (w + fold + 1)) as u32, bytes(nb) as u32))
}

/// Blocks of a `gemvm*` launch over `groups` row groups of 16: as many as stay resident (the
/// driver's occupancy for the kernel's registers and shared memory), each walking its share of
/// the groups, or one per group where there are fewer.
pub(crate) fn grid(dev: &Device, kernel: &str, (threads, smem): (u32, u32), groups: usize) -> Result<u32, CudaError> {
    let per_sm = dev.resident_blocks(kernel, threads, smem)?;
    Ok(groups.min(per_sm * dev.n_sm).max(1) as u32)
}

/// `out (n_tok, n_out) = x (n_tok, n_in) · Wᵀ` in MMQ's order at every token count.
pub(crate) fn matmul(dev: &Device, qc: &Mutex<Option<QCache>>, w: &CudaWeight, x: u64, n_tok: usize, out: u64) -> Result<(), CudaError> {
    if n_tok == 0 {
        return Ok(());
    }
    crate::matmul::forget_input_at(qc, out);
    let DevType::Quant(name) = w.dev_ty else {
        return crate::matmul::gemv_float_tiled(dev, w, x, n_tok, out);
    };
    let (n_in, n_out) = (w.n_in, w.n_out);
    if n_in % 32 != 0 {
        return Err(CudaError::Shape(format!("invariant matmul: rows of {n_in} values are not whole units")));
    }
    if n_tok > crate::matmul::GEMV_MAX_TOKENS {
        return crate::matmul::mmq::mmq(dev, qc, w, x, n_tok, out, false);
    }
    let (xq, xm) = crate::matmul::q8_activations(dev, qc, x, n_tok, n_in, out)?;
    if crate::matmul::holds(n_tok) {
        // q/k/v (gate/up) over the same input join one `gemvm3_*` launch
        return crate::matmul::hold(dev, crate::matmul::GemvOrder::Mmq, w, (xq, xm), n_tok, out);
    }
    for (t0, nt, reps) in crate::matmul::chunks(n_tok) {
        let kernel = format!("gemvm_{name}_{nt}");
        let (threads, smem) = dims(name, nt)?;
        dev.launch(
            &kernel,
            (grid(dev, &kernel, (threads, smem), n_out.div_ceil(ROWS_PER_BLOCK))?, reps as u32, 1),
            threads,
            smem,
            &crate::matmul::chunk_args(w, (xq, xm), out, t0),
        )?;
    }
    Ok(())
}

/// One routed expert matmul of a decode step over device routes (`moe_gemvm_dev_<name>`), queued
/// now (the caller settled the held launches, or is one): route j's rows of its expert (planes
/// at `p` / `m` plus the expert's slice) times input row j / n_used (`per_token`) or j, into
/// rows of `out`; `second`: another matrix of the same shape over the same input and routes
/// (the gate with the up projection: planes and output) in the same launch; `early`: the routes
/// were written at least two launches back (`moe_dev::DevRoutes::calls`), so the kernel may read
/// them before its PDL wait; `dense`: a dense matrix over the same one-token input in the same
/// launch (planes, output, rows: a shared expert's up projection).
#[allow(clippy::too_many_arguments)]
pub(crate) fn moe_dev(
    dev: &Device,
    name: &str,
    (p, m, out): (u64, u64, u64),
    second: Option<(u64, u64, u64)>,
    slice: (u64, u64),
    eids: u64,
    n_used: usize,
    per_token: bool,
    (xq, xm): (u64, u64),
    units: usize,
    n_out: usize,
    n_routes: usize,
    early: bool,
    dense: Option<(u64, u64, u64, usize)>,
) -> Result<(), CudaError> {
    let kernel = format!("moe_gemvm_dev_{name}");
    let (threads, smem) = dims(name, 1)?;
    let (p1, m1, out1) = second.unwrap_or((0, 0, 0));
    let (ps, ms, outs, ns) = dense.unwrap_or((0, 0, 0, 0));
    let groups = n_out.div_ceil(ROWS_PER_BLOCK) * n_routes * if second.is_some() { 2 } else { 1 } + ns.div_ceil(ROWS_PER_BLOCK);
    dev.launch_now(
        &kernel,
        (grid(dev, &kernel, (threads, smem), groups)?, 1, 1),
        threads,
        smem,
        &[
            Arg::P(p),
            Arg::P(m),
            Arg::P(out),
            Arg::P(p1),
            Arg::P(m1),
            Arg::P(out1),
            Arg::U64(slice.0),
            Arg::U64(slice.1),
            Arg::P(eids),
            Arg::I(n_used as i32),
            Arg::I(per_token as i32),
            Arg::P(xq),
            Arg::P(xm),
            Arg::I(units as i32),
            Arg::I(n_out as i32),
            Arg::I(n_routes as i32),
            Arg::I(early as i32),
            Arg::P(ps),
            Arg::P(ms),
            Arg::P(outs),
            Arg::I(ns as i32),
        ],
    )
}

#[cfg(test)]
mod tests {
    /// The host's mirror of the kernel's layout (`dims`) takes the kernel's constants: a
    /// mismatch gives a block less shared memory than its layout (the kernel traps on the GPU;
    /// this catches it without one).
    #[test]
    fn gemvm_constants_match_the_kernel() {
        let src = include_str!("../../kernels/gemvm.cu");
        let define = |name: &str| crate::kernels::kernel_define(src, name);
        assert_eq!(define("GEMVM_W"), super::COMPUTE_WARPS);
        assert_eq!(define("GEMVM_ROWS"), super::ROWS_PER_BLOCK);
        assert_eq!(define("GEMVM_NB"), super::BUFFERS);
        assert_eq!(define("GEMVM_NS"), super::SLOTS);
        // the planes' bytes per unit / super-block (GemvmPlanes)
        for needle in [
            "SB = QT == QT_Q4_K ? 144 : (QT == QT_Q5_K ? 176 : 224)",
            "PU = QT == QT_Q8_0 ? 32 : 16",
            "MSZ = (QT == QT_Q4_0 || QT == QT_Q8_0) ? 2 : (QT == QT_Q4_1 ? 4 : 8)",
            "XB = NT * GEMVM_RU * 32",
            "XM = NT * GEMVM_RU * 8",
            "fit(nb - 1)",
            "227 * 1024",
        ] {
            assert!(src.contains(needle), "gemvm.cu no longer has `{needle}`: update crate::matmul::mmq_order::dims");
        }
        let (threads, smem) = super::dims("q4_K", 1).unwrap();
        assert_eq!(threads, 32 * (8 + 1 + 1));
        // 4 slots of 1,472 floats, 3 buffers of 16 rows x (8 x 144 + 16) bytes + 64 units x 40, 14 barriers
        assert_eq!(smem as usize, 4 * 1472 * 4 + 3 * (16 * 1168 + 64 * 40) + 14 * 8);
        assert!(super::dims("q2_K", 1).is_err());
    }
}
