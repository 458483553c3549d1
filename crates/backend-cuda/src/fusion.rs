//! Fusion over recorded launches: an op may hold its launch back (`Held`) instead of queuing
//! it, and the op after it either absorbs it into one fused kernel (the op takes it with
//! `take_held_if`) or, like any other launch, flush or download, submits it first
//! (`Deferred::launch`). The op modules define the held payloads; the runtime only stores one.
//!
//! ```text
//!  add ─► [Held::Add] ─► rms_norm         => add_rms_norm
//!  gemv(q) ─► [Held::Gemv] ─► gemv(k), gemv(v) over the same Q8 input  => gemv3
//!  rope(q) ─► [Held::Rope] ─► rope(k)  => [Held::RopeQk] ─► kv_store  => rope_kv
//!  moe gemv(up) ─► [Held::Moe] ─► moe gemv(gate)  => moe_gemv2_dev
//!  ssm conv ─► [Held::SsmConv] ─► ssm scan  => conv+scan in one launch
//!  relu² ─► [Held::ReluSqr] ─► relu² of another buffer  => relu_sqr2
//!  moe combine ─► [Held::Comb] ─► add  => [Held::CombAdd] ─► rms_norm  => comb_add_rms_norm
//! ```

use crate::error::CudaError;
use crate::matmul::GemvGroup;
use crate::moe::device_route::{CombHeld, MoeGemv};
use crate::runtime::{self, Arg, Deferred};
use crate::ssm::ConvHeld;

/// The device as the ops see it: its held launch is a `Held`.
pub(crate) type Device = runtime::Device<Held>;

pub(crate) enum Held {
    /// `x += y` (`x += s·y` with `s` set, the product rounded first) over `n` values: a following
    /// RMSNorm of `x` becomes `add_rms_norm` (`add_scaled_rms_norm`).
    Add { x: u64, y: u64, n: u64, s: Option<f32> },
    /// GEMVs over the same Q8 input: up to three become one `gemv3_*` launch.
    Gemv(GemvGroup),
    /// RoPE of one buffer (the `rope` kernel's arguments, `x2` 0): the RoPE of another buffer
    /// by the same positions and parameters that follows (k after q) joins the launch.
    Rope { args: Vec<Arg>, n: u64 },
    /// RoPE of q and k in one launch (the `rope` kernel's arguments, `x2` set; `n` pairs): a
    /// `kv_store` of that k into an f32/f16 cache that follows joins it (`rope_kv_*`).
    RopeQk { args: Vec<Arg>, n: u64 },
    /// A routed expert GEMV of a decode step: the next one over the same input and routes
    /// (gate after up) joins it (`moe_dev::MoeGemv`).
    Moe(MoeGemv),
    /// A decode step's Mamba2 conv: the scan over its output joins it (`ssm::ConvHeld`).
    SsmConv(ConvHeld),
    /// A ReLU² in place over `n` values at `x` (Q8 copy at xq / xm where set): a ReLU² of another
    /// buffer that follows (an MoE layer's shared expert after its routed experts) joins it.
    ReluSqr { x: u64, n: u64, xq: u64, xm: u64 },
    /// The weighted combine of device-routed expert rows (`moe_dev::CombHeld`): an `add` of
    /// its output into `x` makes it `CombAdd`.
    Comb(CombHeld),
    /// A combine, then `x += out` (`x += s·out`) over `n` values: a following RMSNorm of `x`
    /// runs all three as `comb_add_(scaled_)rms_norm`.
    CombAdd { c: CombHeld, x: u64, n: u64, s: Option<f32> },
}

impl Deferred for Held {
    fn launch(self, dev: &Device) -> Result<(), CudaError> {
        match self {
            Held::Add { x, y, n, s } => launch_add(dev, x, y, n, s),
            Held::Gemv(g) => g.launch(dev),
            Held::Moe(g) => g.launch(dev),
            Held::SsmConv(c) => c.launch(dev),
            Held::ReluSqr { x, n, xq, xm } => dev.launch_1d_now("relu_sqr", n, &[Arg::P(x), Arg::U64(n), Arg::P(xq), Arg::P(xm)]),
            Held::Comb(c) => c.launch(dev),
            Held::CombAdd { c, x, n, s } => {
                c.launch(dev)?;
                launch_add(dev, x, c.out, n, s)
            }
            Held::Rope { args, n } | Held::RopeQk { args, n } => dev.launch_now("rope", (n.div_ceil(256) as u32, 1, 1), 256, 0, &args),
        }
    }
}

/// `x += y` (`x += s·y`) over `n` values, queued now.
pub(crate) fn launch_add(dev: &Device, x: u64, y: u64, n: u64, s: Option<f32>) -> Result<(), CudaError> {
    let grid = (n.div_ceil(256) as u32, 1, 1);
    match s {
        None => dev.launch_now("add", grid, 256, 0, &[Arg::P(x), Arg::P(y), Arg::U64(n)]),
        Some(s) => dev.launch_now("add_scaled", grid, 256, 0, &[Arg::P(x), Arg::P(y), Arg::F(s), Arg::U64(n)]),
    }
}
