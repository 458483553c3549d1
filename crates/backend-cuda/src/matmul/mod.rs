//! `out (n_tok, n_out) = x (n_tok, n_in) · Wᵀ` on the device.
//!
//! ```text
//!  n_tok <= GEMV_MAX_TOKENS: quantized W: x ──quantize_q8──► (xq, xm) ──gemv_<type>_<NT> (dp4a)──► out
//!                            float W:     x ──gemv_<type>_<NT> (f32 FMA)──► out
//!  more tokens:              W ──dequant_<type>──► W16 (scratch) ┐
//!                            x ──tof16_f32──► x16                ├─ cuBLAS GemmEx (f16 in, f32 accumulate) ──► out
//!  quantized W where mmq::mmq_wins (by shape): MMQ (mmq.rs), Q8 activations on the int8 tensor cores
//! ```

pub(crate) mod cpu_order;
pub mod mmq;
pub(crate) mod mmq_order;

use crate::fusion::{Device, Held};
use crate::runtime::{Arg, DevMem, PoolMem};
use std::sync::Mutex;

/// Activations already quantized to Q8: `x` (device pointer) as (xq, xm).
pub(crate) struct QCache {
    pub x: u64,
    /// values (n_tok * n_in)
    pub n: usize,
    pub xq: PoolMem,
    pub xm: PoolMem,
}

impl QCache {
    /// Scratch for the Q8 form of `n` values at `x` (filled by the kernel that writes `x`).
    pub fn new(dev: &Device, x: u64, n: usize) -> Result<QCache, CudaError> {
        Ok(QCache { x, n, xq: dev.scratch(n)?, xm: dev.scratch(n / 32 * 8)? })
    }
}

/// The Q8 form (`xq`, `xm` pointers) of `n_tok` rows of `n_in` values at `x`: the cached one
/// when the op that wrote `x` (or a matmul before) left it, else quantized now and cached.
/// Not reused when the matmul writes over its own input.
pub(crate) fn q8_activations(
    dev: &Device,
    qc: &Mutex<Option<QCache>>,
    x: u64,
    n_tok: usize,
    n_in: usize,
    out: u64,
) -> Result<(u64, u64), CudaError> {
    let mut g = qc.lock().map_err(|_| CudaError::Driver("lock poisoned".into()))?;
    let hit = g.as_ref().is_some_and(|c| c.x == x && c.n == n_tok * n_in) && x != out;
    if !hit {
        let c = QCache::new(dev, x, n_tok * n_in)?;
        let nb = (n_tok * (n_in / 32)) as u32;
        dev.launch("quantize_q8", (nb.div_ceil(8), 1, 1), 256, 0, &[Arg::P(x), Arg::P(c.xq.ptr()), Arg::P(c.xm.ptr()), Arg::I(nb as i32)])?;
        *g = Some(c);
    }
    let c = g.as_ref().expect("set above");
    Ok((c.xq.ptr(), c.xm.ptr()))
}
use crate::error::CudaError;
use crate::weights::{CudaWeight, DevType};
use cudarc::cublas::{result as blas, sys as bsys, CudaBlas};

/// Up to this many tokens the GEMV kernels run (weights read once per 8 tokens); above, the GEMM.
pub const GEMV_MAX_TOKENS: usize = 8;

/// GEMV_WARPS and GEMV_ROWS in matmul.cu.
const GEMV_WARPS: usize = 4;
const GEMV_ROWS: usize = 2;

/// Warps per row (1, 2 or 4) and the grid. Quantized rows of `units` units of 32 values: two
/// warps per row (each lane then has at most a few units per row, all loads in flight), four
/// for matrices of few rows (n_out < 2400) with rows of at least 128 units: one warp per row
/// leaves too few loads in flight per lane (about 10% slower on 7B shapes,
/// scripts/gemv-bench.py). Float weights and short rows (< 64 units): by the block count
/// (enough blocks for ~1000 to run).
fn gemv_shape(n_out: usize, units: usize) -> (usize, (u32, u32, u32)) {
    let wpr = if units >= 64 {
        if units >= 128 && n_out < 2400 {
            4
        } else {
            2
        }
    } else {
        let blocks1 = n_out.div_ceil(GEMV_WARPS * GEMV_ROWS);
        if blocks1 >= 1024 {
            1
        } else if blocks1 >= 512 {
            2
        } else {
            4
        }
    };
    let rows_per_block = GEMV_ROWS * GEMV_WARPS / wpr;
    (wpr, (n_out.div_ceil(rows_per_block) as u32, 1, 1))
}

/// `ordered`: Q4_0 / Q4_1 / Q8_0 weights (`exact::applies`) take the GEMV in the CPU's float
/// order (`gemvo_*`, kernels/exact.cu) up to `exact::ORDERED_MAX_TOKENS` tokens.
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul(
    dev: &Device,
    blas: &CudaBlas,
    qc: &Mutex<Option<QCache>>,
    w: &CudaWeight,
    x: u64,
    n_tok: usize,
    out: u64,
    ordered: bool,
) -> Result<(), CudaError> {
    if n_tok == 0 {
        return Ok(());
    }
    forget_input_at(qc, out);
    let ordered = ordered && crate::matmul::cpu_order::applies(w);
    if n_tok <= GEMV_MAX_TOKENS || (ordered && n_tok <= crate::matmul::cpu_order::ORDERED_MAX_TOKENS) {
        gemv(dev, qc, w, x, n_tok, out, ordered)
    } else if matches!(w.dev_ty, DevType::Quant(_)) && (w.exact || crate::matmul::mmq::mmq_wins(w.n_in, w.n_out, n_tok)) {
        crate::matmul::mmq::mmq(dev, qc, w, x, n_tok, out, true)
    } else if small_float(w) && (n_tok <= SMALL_FLOAT_MAX_TOKENS || w.n_out <= ROUTER_MAX_ROWS) {
        gemv_float_tiled(dev, w, x, n_tok, out)
    } else {
        gemm(dev, blas, w, x, n_tok, out)
    }
}

/// GEMV in chunks of at most 8 tokens (one weight read per chunk). `ordered`: in the CPU's float
/// order (`gemvo_*`) where `exact::applies`, else the fast kernels (`gemv_*`).
pub(crate) fn gemv(
    dev: &Device,
    qc: &Mutex<Option<QCache>>,
    w: &CudaWeight,
    x: u64,
    n_tok: usize,
    out: u64,
    ordered: bool,
) -> Result<(), CudaError> {
    let (n_in, n_out) = (w.n_in, w.n_out);
    let ordered = ordered && crate::matmul::cpu_order::applies(w);
    // float weights: by the block count (units 0)
    let units = if matches!(w.dev_ty, DevType::Quant(_)) { n_in / 32 } else { 0 };
    let (wpr, grid) = gemv_shape(n_out, units);
    let name = w.dev_ty.name();
    match w.dev_ty {
        DevType::Quant(_) => {
            let (xq, xm) = q8_activations(dev, qc, x, n_tok, n_in, out)?;
            if holds(n_tok) {
                let order = if ordered { GemvOrder::Ordered } else { GemvOrder::Fast };
                return hold(dev, order, w, (xq, xm), n_tok, out);
            }
            for (t0, nt, reps) in chunks(n_tok) {
                let (name_nt, grid) = if ordered {
                    (format!("gemvo_{name}_{nt}"), crate::matmul::cpu_order::grid(name, nt, n_out))
                } else {
                    (format!("gemv_{name}_{nt}"), grid)
                };
                let mut args = chunk_args(w, (xq, xm), out, t0);
                if !ordered {
                    args.push(Arg::I(wpr as i32));
                }
                dev.launch(&name_nt, (grid.0, reps as u32, 1), 128, 0, &args)?;
            }
        }
        _ => return gemv_float_tiled(dev, w, x, n_tok, out),
    }
    Ok(())
}

/// Drop the cached Q8 form of an input that lives at `out`: a matmul's output may reuse the
/// memory of its cached input.
pub(crate) fn forget_input_at(qc: &Mutex<Option<QCache>>, out: u64) {
    if let Ok(mut g) = qc.lock() {
        if g.as_ref().is_some_and(|c| c.x == out) {
            *g = None;
        }
    }
}

/// The arguments of a quantized GEMV launch over the chunk of tokens from `t0` (weight planes,
/// the chunk's Q8 activations and output rows, units per row, rows): `gemv_*`, `gemvo_*`, `gemvm_*`.
pub(crate) fn chunk_args(w: &CudaWeight, (xq, xm): (u64, u64), out: u64, t0: usize) -> Vec<Arg> {
    let (n_in, n_out, units) = (w.n_in, w.n_out, w.n_in / 32);
    vec![
        Arg::P(w.p.ptr),
        Arg::P(w.m_ptr()),
        Arg::P(xq + (t0 * n_in) as u64),
        Arg::P(xm + (t0 * units * 8) as u64),
        Arg::P(out + 4 * (t0 * n_out) as u64),
        Arg::I(units as i32),
        Arg::I(n_out as i32),
    ]
}

/// Whether a GEMV over `n_tok` tokens is held to join the matrices that follow over the same
/// input.
pub(crate) fn holds(n_tok: usize) -> bool {
    matches!(n_tok, 1 | 2 | 4 | 8)
}

/// Hold the GEMV of quantized `w` over the Q8 input `(xq, xm)` of `n_tok` tokens: q/k/v
/// (gate/up) that follow over the same input join it in one launch.
pub(crate) fn hold(dev: &Device, order: GemvOrder, w: &CudaWeight, (xq, xm): (u64, u64), n_tok: usize, out: u64) -> Result<(), CudaError> {
    let (name, units) = (w.dev_ty.name(), w.n_in / 32);
    let item = GemvItem { p: w.p.ptr, m: w.m_ptr(), out, n_out: w.n_out };
    let joined = dev.take_held_if(|h| matches!(h, Held::Gemv(gr) if gr.accepts(name, order, n_tok, xq, units, out)));
    let group = match joined {
        Some(Held::Gemv(mut gr)) => {
            gr.items.push(item);
            gr
        }
        _ => GemvGroup { name, order, nt: n_tok, xq, xm, units, items: vec![item], rope: None },
    };
    dev.hold(Held::Gemv(group))
}

/// The float order of a held GEMV group's kernels.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum GemvOrder {
    /// `gemv_*` / `gemv3_*`: lanes over units, a warp reduction
    Fast,
    /// `gemvo_*` / `gemvo3_*`: the CPU's order (exact numerics)
    Ordered,
    /// `gemvm_*` / `gemvm3_*`: MMQ's order (invariant numerics)
    Mmq,
}

/// One matrix of a held GEMV group.
pub(crate) struct GemvItem {
    p: u64,
    m: u64,
    out: u64,
    n_out: usize,
}

/// Quantized GEMVs of one weight type over the same Q8 input, launched together.
pub(crate) struct GemvGroup {
    name: &'static str,
    order: GemvOrder,
    nt: usize,
    xq: u64,
    xm: u64,
    units: usize,
    items: Vec<GemvItem>,
    /// q/k/v with RoPE and the KV-cache store in the epilogue (`gemv3r_*`)
    rope: Option<RopeFuse>,
}

/// The RoPE of q (and k) and the f16 KV-cache store of k and v that followed a q/k/v GEMV,
/// done in its epilogue (`gemv3r_*`, kernels/matmul.cu: the rope and kv_store kernels'
/// arithmetic on the same values, so the same bits).
#[derive(Clone, Copy, PartialEq)]
pub(crate) struct RopeFuse {
    pub pos: u64,
    pub ff: u64,
    pub theta_scale: f32,
    pub freq_scale: f32,
    pub hd: usize,
    /// k rotated too
    pub rope_k: bool,
    /// (k cache, v cache, slots): k and v stored
    pub kv: Option<(u64, u64, u64)>,
}

impl RopeFuse {
    /// The `*3r` kernels' trailing arguments (no KV store: null caches and slots).
    fn args(&self) -> [Arg; 9] {
        let (kd, vd, slots) = self.kv.unwrap_or((0, 0, 0));
        [
            Arg::P(self.pos),
            Arg::P(self.ff),
            Arg::F(self.theta_scale),
            Arg::F(self.freq_scale),
            Arg::I(self.hd as i32),
            Arg::I(self.rope_k as i32),
            Arg::P(kd),
            Arg::P(vd),
            Arg::P(slots),
        ]
    }
}

/// Whether RoPE and the KV store may join a q/k/v GEMV (the fused kernel pairs rows).
pub(crate) fn rope_fusion() -> bool {
    GEMV_ROWS.is_multiple_of(2)
}

impl GemvGroup {
    /// The one matrix of a one-token group in MMQ's order over `xq` of `units` units per row
    /// and weight type `name` (planes, output, rows), if this is such a group.
    pub(crate) fn single_mmq(&self, name: &str, xq: u64, units: usize) -> Option<(u64, u64, u64, usize)> {
        let i = self.items.first()?;
        (self.order == GemvOrder::Mmq
            && self.items.len() == 1
            && self.nt == 1
            && self.rope.is_none()
            && self.name == name
            && self.xq == xq
            && self.units == units)
            .then_some((i.p, i.m, i.out, i.n_out))
    }

    /// A fast q/k/v group of `n_tok` tokens whose next RoPE target (q, then k) is `x` of
    /// `n` values with these parameters (`r`: rope_k false, kv unset).
    pub(crate) fn rope_fits(&self, x: u64, n_tok: usize, n: usize, r: &RopeFuse) -> bool {
        // the fast GEMV's epilogue (gemv3r_*) or the MMQ-order GEMV's fold (gemvm3r_*)
        if !matches!(self.order, GemvOrder::Fast | GemvOrder::Mmq)
            || self.items.len() != 3
            || self.nt != n_tok
            || r.hd == 0
            || !r.hd.is_multiple_of(2)
        {
            return false;
        }
        let k = match &self.rope {
            None => 0,
            Some(f) if !f.rope_k && f.kv.is_none() && RopeFuse { rope_k: false, kv: None, ..*f } == *r => 1,
            _ => return false,
        };
        let it = &self.items[k];
        it.out == x && it.n_out * n_tok == n && it.n_out.is_multiple_of(r.hd)
    }

    /// Add the RoPE of the next target (after `rope_fits`).
    pub(crate) fn add_rope(&mut self, r: RopeFuse) {
        match &mut self.rope {
            None => self.rope = Some(r),
            Some(f) => f.rope_k = true,
        }
    }

    /// Whether the KV store of `k` and `v` (`n_tok` tokens of `row` values) can join: q and k
    /// rotated here already, k and v this group's second and third outputs.
    pub(crate) fn kv_fits(&self, k: u64, v: u64, n_tok: usize, row: usize) -> bool {
        self.rope.is_some_and(|f| f.rope_k && f.kv.is_none())
            && self.nt == n_tok
            && self.items[1].out == k
            && self.items[2].out == v
            && self.items[1].n_out == row
            && self.items[2].n_out == row
    }

    pub(crate) fn add_kv(&mut self, kd: u64, vd: u64, slots: u64) {
        if let Some(f) = &mut self.rope {
            f.kv = Some((kd, vd, slots));
        }
    }
}

impl GemvGroup {
    #[allow(clippy::too_many_arguments)]
    fn accepts(&self, name: &str, order: GemvOrder, nt: usize, xq: u64, units: usize, out: u64) -> bool {
        self.items.len() < 3
            && self.name == name
            && self.order == order
            && self.nt == nt
            && self.xq == xq
            && self.units == units
            && self.items.iter().all(|i| i.out != out)
    }

    /// One `gemv_*` launch, or one `gemv3_*` for two or three matrices (`gemvo*`, `gemvm*` in
    /// the other orders).
    pub(crate) fn launch(&self, dev: &Device) -> Result<(), CudaError> {
        let (name, nt, u) = (self.name, self.nt, self.units as i32);
        match self.order {
            GemvOrder::Ordered => return self.launch_ordered(dev),
            GemvOrder::Mmq => return self.launch_mmq(dev),
            GemvOrder::Fast => {}
        }
        if let [i] = self.items.as_slice() {
            let (wpr, grid) = gemv_shape(i.n_out, self.units);
            let args = [
                Arg::P(i.p),
                Arg::P(i.m),
                Arg::P(self.xq),
                Arg::P(self.xm),
                Arg::P(i.out),
                Arg::I(u),
                Arg::I(i.n_out as i32),
                Arg::I(wpr as i32),
            ];
            return dev.launch_now(&format!("gemv_{name}_{nt}"), grid, 128, 0, &args);
        }
        // each matrix with the warps per row and blocks of its own launch: the same bits as a
        // prefill's (unjoined) launches of it
        let shapes: Vec<(usize, (u32, u32, u32))> = self.items.iter().map(|i| gemv_shape(i.n_out, self.units)).collect();
        let nb: Vec<u32> = shapes.iter().map(|s| s.1 .0).collect();
        let mut args = self.joined_args(&nb);
        args.extend([Arg::P(self.xq), Arg::P(self.xm), Arg::I(u)]);
        args.extend((0..3).map(|k| Arg::I(shapes.get(k).map_or(1, |s| s.0) as i32)));
        if let Some(r) = self.rope {
            args.extend(r.args());
            return dev.launch_now(&format!("gemv3r_{name}_{nt}"), (nb.iter().sum(), 1, 1), 128, 0, &args);
        }
        dev.launch_now(&format!("gemv3_{name}_{nt}"), (nb.iter().sum(), 1, 1), 128, 0, &args)
    }
}

impl GemvGroup {
    /// The per-matrix arguments of a joined launch (`gemv3_*` / `gemvo3_*`): (weights, meta, out,
    /// rows[, blocks]) for each of up to three matrices (the last takes the blocks left), a third
    /// empty matrix when two are joined.
    fn joined_args(&self, blocks: &[u32]) -> Vec<Arg> {
        let mut args = Vec::with_capacity(19);
        for (k, i) in self.items.iter().enumerate() {
            args.extend([Arg::P(i.p), Arg::P(i.m), Arg::P(i.out), Arg::I(i.n_out as i32)]);
            if k < 2 {
                args.push(Arg::I(blocks[k] as i32));
            }
        }
        if self.items.len() == 2 {
            args.extend([Arg::P(0), Arg::P(0), Arg::P(0), Arg::I(0)]);
        }
        args
    }

    /// `gemvm_*` / `gemvm3_*` (invariant numerics): blocks of 16 rows, each matrix's the same
    /// joined or alone.
    fn launch_mmq(&self, dev: &Device) -> Result<(), CudaError> {
        let (name, nt, u) = (self.name, self.nt, self.units as i32);
        let (threads, smem) = crate::matmul::mmq_order::dims(name, nt)?;
        let blocks = |n_out: usize| n_out.div_ceil(crate::matmul::mmq_order::ROWS_PER_BLOCK) as u32;
        if let [i] = self.items.as_slice() {
            let args = [Arg::P(i.p), Arg::P(i.m), Arg::P(self.xq), Arg::P(self.xm), Arg::P(i.out), Arg::I(u), Arg::I(i.n_out as i32)];
            let kernel = format!("gemvm_{name}_{nt}");
            let grid = crate::matmul::mmq_order::grid(dev, &kernel, (threads, smem), blocks(i.n_out) as usize)?;
            return dev.launch_now(&kernel, (grid, 1, 1), threads, smem, &args);
        }
        let nb: Vec<u32> = self.items.iter().map(|i| blocks(i.n_out)).collect();
        let mut args = self.joined_args(&nb);
        args.extend([Arg::P(self.xq), Arg::P(self.xm), Arg::I(u)]);
        // q/k/v with RoPE and the KV store: in the fold's epilogue (the same bits as the kernels)
        let kernel = if self.rope.is_some() { format!("gemvm3r_{name}_{nt}") } else { format!("gemvm3_{name}_{nt}") };
        if let Some(r) = self.rope {
            args.extend(r.args());
        }
        let grid = crate::matmul::mmq_order::grid(dev, &kernel, (threads, smem), nb.iter().sum::<u32>() as usize)?;
        dev.launch_now(&kernel, (grid, 1, 1), threads, smem, &args)
    }

    /// `gemvo_*` / `gemvo3_*` (grids: `cpu_order::grid`).
    fn launch_ordered(&self, dev: &Device) -> Result<(), CudaError> {
        let (name, nt, u) = (self.name, self.nt, self.units as i32);
        if let [i] = self.items.as_slice() {
            let args = [Arg::P(i.p), Arg::P(i.m), Arg::P(self.xq), Arg::P(self.xm), Arg::P(i.out), Arg::I(u), Arg::I(i.n_out as i32)];
            return dev.launch_now(&format!("gemvo_{name}_{nt}"), crate::matmul::cpu_order::grid(name, nt, i.n_out), 128, 0, &args);
        }
        let nb: Vec<u32> = self.items.iter().map(|i| crate::matmul::cpu_order::grid(name, nt, i.n_out).0).collect();
        let mut args = self.joined_args(&nb);
        args.extend([Arg::P(self.xq), Arg::P(self.xm), Arg::I(u)]);
        dev.launch_now(&format!("gemvo3_{name}_{nt}"), (nb.iter().sum(), 1, 1), 128, 0, &args)
    }
}

/// Float matrices of at most this many bytes (MoE routers: 0.1-1.4 MB) take the GEMV: read from
/// L2 once per 8 tokens, in the decode GEMV's float order, and without cuBLAS, whose call holds
/// the host for ~480 us per small router matrix.
const SMALL_FLOAT_BYTES: usize = 4 << 20;
/// Routers (one row per expert) take it at every token count, so that they see decode's numbers;
/// other small float matrices up to this many tokens. Beyond, the GEMV's time grows with the
/// tokens where cuBLAS's tensor cores barely notice them (an encoder's 768 x 2304 F16 matrix at
/// 8192 tokens: 1 ms on the H200 through the GEMV).
const SMALL_FLOAT_MAX_TOKENS: usize = 1024;
/// Most rows of a matrix treated as a router (expert counts are 8 to 256).
const ROUTER_MAX_ROWS: usize = 512;

fn small_float(w: &CudaWeight) -> bool {
    let elem = match w.dev_ty {
        DevType::F32 => 4,
        DevType::F16 | DevType::BF16 => 2,
        _ => return false,
    };
    w.n_in.is_multiple_of(8) && w.n_in * w.n_out * elem <= SMALL_FLOAT_BYTES
}

/// Float weights: `gemv_<float type>_<nt>` over `chunks(n_tok)`; each output has the bits of a
/// one-token GEMV.
pub(crate) fn gemv_float_tiled(dev: &Device, w: &CudaWeight, x: u64, n_tok: usize, out: u64) -> Result<(), CudaError> {
    let (n_in, n_out) = (w.n_in, w.n_out);
    let (wpr, grid) = gemv_shape(n_out, 0);
    for (t0, nt, reps) in chunks(n_tok) {
        dev.launch(
            &format!("gemv_{}_{nt}", w.dev_ty.name()),
            (grid.0, reps as u32, 1),
            128,
            0,
            &[
                Arg::P(w.p.ptr),
                Arg::P(x + 4 * (t0 * n_in) as u64),
                Arg::P(out + 4 * (t0 * n_out) as u64),
                Arg::I(n_in as i32),
                Arg::I(n_out as i32),
                Arg::I(wpr as i32),
            ],
        )?;
    }
    Ok(())
}

/// Most grid rows (`blockIdx.y`, one chunk of tokens each) in one GEMV launch.
const MAX_GRID_Y: usize = 65535;

/// The launches of a GEMV over `n_tok` tokens: (first token, tokens per chunk, chunks). Full
/// chunks of 8 tokens go in launches of up to `MAX_GRID_Y` chunks, one per grid row
/// (`blockIdx.y`), and the rest in chunks of 4, 2 and 1. A chunk's sums are what its own
/// launch would give.
pub(crate) fn chunks(n_tok: usize) -> Vec<(usize, usize, usize)> {
    let mut plan = vec![];
    let mut t0 = 0;
    while t0 < n_tok {
        let nt = chunk(n_tok - t0);
        let reps = if nt == GEMV_MAX_TOKENS { ((n_tok - t0) / nt).min(MAX_GRID_Y) } else { 1 };
        plan.push((t0, nt, reps));
        t0 += nt * reps;
    }
    plan
}

/// Tokens per GEMV launch: 8, 4, 2 or 1.
fn chunk(left: usize) -> usize {
    [8, 4, 2, 1].into_iter().find(|&c| c <= left).unwrap_or(1)
}

pub(crate) fn gemm(dev: &Device, blas: &CudaBlas, w: &CudaWeight, x: u64, n_tok: usize, out: u64) -> Result<(), CudaError> {
    let (n_in, n_out) = (w.n_in, w.n_out);
    let n_w = (n_in * n_out) as u64;
    // the weight as f16: in place for F16 weights; else a cached f16 copy (made once while
    // free memory allows) or a scratch dequantized per call
    let w16_scratch;
    let mut cached = w.f16.lock().map_err(|_| CudaError::Driver("lock poisoned".into()))?;
    let w16 = match w.dev_ty {
        DevType::F16 => w.p.ptr,
        DevType::F32 => {
            drop(cached);
            return gemm_ex(dev, blas, (w.p.ptr, x, bsys::cudaDataType_t::CUDA_R_32F), n_in, n_out, n_tok, out, ("cublas sgemm", "SGEMM"));
        }
        _ => {
            if cached.is_none() && f16_cache_fits(dev, 2 * n_w as usize) {
                let m = DevMem::alloc(dev, 2 * n_w as usize)?;
                to_f16(dev, w, m.ptr, n_w)?;
                *cached = Some(m);
            }
            match cached.as_ref() {
                Some(m) => m.ptr,
                None => {
                    w16_scratch = dev.scratch(2 * n_w as usize)?;
                    to_f16(dev, w, w16_scratch.ptr(), n_w)?;
                    w16_scratch.ptr()
                }
            }
        }
    };
    drop(cached);
    let n_x = (n_tok * n_in) as u64;
    let x16 = dev.scratch(2 * n_x as usize)?;
    dev.launch_1d("tof16_f32", n_x, &[Arg::P(x), Arg::P(x16.ptr()), Arg::U64(n_x)])?;
    gemm_ex(dev, blas, (w16, x16.ptr(), bsys::cudaDataType_t::CUDA_R_16F), n_in, n_out, n_tok, out, ("cublas gemm f16", "GemmEx"))
}

/// Whether an f16 copy of `bytes` fits, leaving a fifth of the device free.
fn f16_cache_fits(dev: &Device, bytes: usize) -> bool {
    let (free, total) = dev.ctx.mem_get_info().unwrap_or((0, 0));
    free > bytes + total / 5
}

/// Dequantize (or convert) `w` into `n_w` f16 values at `dst`.
fn to_f16(dev: &Device, w: &CudaWeight, dst: u64, n_w: u64) -> Result<(), CudaError> {
    match w.dev_ty {
        DevType::Quant(name) => {
            let units = n_w / 32;
            dev.launch_1d(
                &format!("dequant_{name}"),
                units,
                &[Arg::P(w.p.ptr), Arg::P(w.m_ptr()), Arg::P(dst), Arg::I((w.n_in / 32) as i32), Arg::U64(units)],
            )
        }
        t => dev.launch_1d(&format!("tof16_{}", t.name()), n_w, &[Arg::P(w.p.ptr), Arg::P(dst), Arg::U64(n_w)]),
    }
}

/// `out` (n_tok x n_out, f32) = `x` · `w`ᵀ through cuBLAS's GemmEx with f32 accumulation; `w`
/// and `x` are device pointers of element type `ty`. `what`: the call's names in the timings
/// and in errors.
#[allow(clippy::too_many_arguments)]
fn gemm_ex(
    dev: &Device,
    blas: &CudaBlas,
    (w, x, ty): (u64, u64, bsys::cudaDataType_t),
    n_in: usize,
    n_out: usize,
    n_tok: usize,
    out: u64,
    what: (&'static str, &str),
) -> Result<(), CudaError> {
    let (alpha, beta) = (1.0f32, 0.0f32);
    // cuBLAS enqueues on the stream itself: submit the queued kernels first
    dev.timed("flush before cuBLAS", || dev.flush())?;
    dev.not_graphable();
    // column-major view: C (n_out x n_tok) = Wᵀ (n_out x n_in) · x (n_in x n_tok)
    // SAFETY: pointers are live device buffers of the sizes given; the handle is on our stream.
    dev.timed(what.0, || unsafe {
        blas::gemm_ex(
            *blas.handle(),
            bsys::cublasOperation_t::CUBLAS_OP_T,
            bsys::cublasOperation_t::CUBLAS_OP_N,
            n_out as i32,
            n_tok as i32,
            n_in as i32,
            &alpha as *const f32 as *const _,
            w as *const _,
            ty,
            n_in as i32,
            x as *const _,
            ty,
            n_in as i32,
            &beta as *const f32 as *const _,
            out as *mut _,
            bsys::cudaDataType_t::CUDA_R_32F,
            n_out as i32,
            bsys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            bsys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    })
    .map_err(|e| CudaError::Blas(format!("{} {n_out}x{n_tok}x{n_in}: {e:?}", what.1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every token in exactly one chunk, in order; full chunks of 8 batched, at most
    /// MAX_GRID_Y per launch; the rest in chunks of 4, 2, 1.
    #[test]
    fn chunk_plan_covers_every_token_once() {
        for n in [0usize, 1, 3, 7, 8, 9, 15, 16, 31, 512, 513, 8 * MAX_GRID_Y + 5, 8 * MAX_GRID_Y * 2 + 8] {
            let plan = chunks(n);
            let mut next = 0;
            for &(t0, nt, reps) in &plan {
                assert_eq!(t0, next, "{n}: {plan:?}");
                assert!([8, 4, 2, 1].contains(&nt) && (1..=MAX_GRID_Y).contains(&reps));
                assert!(nt == 8 || reps == 1);
                next += nt * reps;
            }
            assert_eq!(next, n);
            assert!(plan.iter().filter(|p| p.1 < 8).count() <= 3, "{n}: {plan:?}");
        }
        assert_eq!(chunks(23), vec![(0, 8, 2), (16, 4, 1), (20, 2, 1), (22, 1, 1)]);
    }

    /// The grid covers every row; quantized rows of 64+ units never take one warp per row, and
    /// four warps only where each still has whole 32-unit steps (128+ units) and rows are few.
    #[test]
    fn gemv_shape_covers_rows_and_follows_the_measured_policy() {
        for units in [18usize, 48, 64, 128, 176, 448] {
            for n_out in [1usize, 7, 576, 2048, 2399, 2400, 4096, 6144, 28672, 32000, 151936] {
                let (wpr, grid) = gemv_shape(n_out, units);
                assert!([1, 2, 4].contains(&wpr));
                assert!(grid.0 as usize * GEMV_ROWS * GEMV_WARPS / wpr >= n_out, "{n_out} rows, {units} units");
                if units >= 64 {
                    assert_eq!(wpr, if units >= 128 && n_out < 2400 { 4 } else { 2 }, "{n_out} rows, {units} units");
                }
            }
        }
        assert_eq!(gemv_shape(32000, 0).0, 1);
        assert_eq!(gemv_shape(4096, 0).0, 2);
    }
}
