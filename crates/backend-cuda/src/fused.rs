//! Decode GEMVs that finish the next op in their tail (kernels/matmul.cu `gemvglu_*`,
//! `gemvn_*`): the block that completes a piece of the output last does what the next kernel
//! would have done with it, so a decode step launches fewer kernels.
//!
//! ```text
//!  gate/up GEMV group (2 matrices, one Q8 input) + swiglu(gate, up)      -> gemvglu: per 32 rows,
//!      the last block of both matrices writes h = swiglu and its Q8 form (the down GEMV's input)
//!  one-matrix GEMV y + add(x, y) + rms_norm(x)                          -> gemvn: the last block
//!      does x += y, RMSNorm and its Q8 form (the next GEMV's input)
//! ```
//!
//! The tails run ops.cu's arithmetic (`swiglu_val` + `q8_store`, `norm_row_v4`), so results are
//! those of the separate kernels. Arrival counters: `Device::counters` (zeroed once; each
//! launch leaves the counters it used at 0).

use crate::device::{Arg, Device};
use crate::error::CudaError;
use crate::matmul::{gemv_shape, GemvGroup, GEMV_ROWS, GEMV_WARPS};

/// Arrival counters on the device: one per 32 rows of the widest gate/up GEMV fused.
pub(crate) const COUNTERS: usize = 1 << 16;

/// Whether `group` (held gate, up) can finish `swiglu` into `h` of `n` values in its tail.
pub(crate) fn glu_fits(group: &GemvGroup, g: u64, u: u64, n: usize) -> bool {
    match group.items.as_slice() {
        [a, b] => a.out == g && b.out == u && a.n_out == b.n_out && a.n_out % 32 == 0 && a.n_out / 32 <= COUNTERS && a.n_out * group.nt == n,
        _ => false,
    }
}

/// One `gemvglu_*` launch: gate and up (`group`, checked by `glu_fits`), then `h` and its Q8
/// form (`hq`, `hm`; 0: none).
pub(crate) fn launch_glu(dev: &Device, group: &GemvGroup, h: u64, hq: u64, hm: u64) -> Result<(), CudaError> {
    let (g, u) = (&group.items[0], &group.items[1]);
    let (wpr, _) = gemv_shape(2 * g.n_out, group.units);
    let nb = g.n_out.div_ceil(GEMV_ROWS * GEMV_WARPS / wpr);
    let args = [
        Arg::P(g.p),
        Arg::P(g.m),
        Arg::P(u.p),
        Arg::P(u.m),
        Arg::P(g.out),
        Arg::P(u.out),
        Arg::P(h),
        Arg::I(g.n_out as i32),
        Arg::I(nb as i32),
        Arg::P(group.xq),
        Arg::P(group.xm),
        Arg::I(group.units as i32),
        Arg::I(wpr as i32),
        Arg::P(hq),
        Arg::P(hm),
        Arg::P(dev.counters.ptr),
    ];
    dev.launch_now(&format!("gemvglu_{}_{}", group.name, group.nt), (2 * nb as u32, 1, 1), 128, 0, &args)
}

/// Whether `group` (one matrix, held with `x += its output` of `n` values) can finish the
/// RMSNorm of `x` (rows of `d`) in its tail.
pub(crate) fn norm_fits(group: &GemvGroup, n: u64, d: usize) -> bool {
    match group.items.as_slice() {
        [i] => i.n_out == d && d % 4 == 0 && (d * group.nt) as u64 == n,
        _ => false,
    }
}

/// One `gemvn_*` launch: the GEMV's output y, then `x += y` and `out = RMSNorm(x) * w` with
/// its Q8 form (`oq`, `om`; 0: none).
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_norm(dev: &Device, group: &GemvGroup, x: u64, w: u64, out: u64, eps: f32, oq: u64, om: u64) -> Result<(), CudaError> {
    let i = &group.items[0];
    let (wpr, grid) = gemv_shape(i.n_out, group.units);
    let args = [
        Arg::P(i.p),
        Arg::P(i.m),
        Arg::P(group.xq),
        Arg::P(group.xm),
        Arg::P(i.out),
        Arg::I(group.units as i32),
        Arg::I(i.n_out as i32),
        Arg::I(wpr as i32),
        Arg::P(x),
        Arg::P(w),
        Arg::P(out),
        Arg::F(eps),
        Arg::P(oq),
        Arg::P(om),
        Arg::P(dev.counters.ptr),
    ];
    dev.launch_now(&format!("gemvn_{}_{}", group.name, group.nt), grid, 128, 0, &args)
}
