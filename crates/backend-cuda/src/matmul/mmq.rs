//! MMQ: quantized matmul for several tokens on the int8 tensor cores (`kernels/mmq.cu`).
//!
//! ```text
//!  x (n_tok, n_in) f32 ──quantize_q8──► xq int8 + xm {d, d·Σq} per 32 values (shared with the GEMV)
//!  W repacked (weight.rs) ─┐
//!                          ├─ mmq_<type>_<NT>: 128 rows x 16·NT tokens per block, mma.sync
//!  (xq, xm) ───────────────┘  m16n8k32 s8 -> exact s32 sums per unit, f32 scale epilogue
//!                             ──► out (n_tok, n_out), or split-K partials ──mmq_reduce──► out
//! ```
//!
//! The per-unit integer sums and scale products are the GEMV's, so prefill, batched decode and
//! single-token decode see the same numerics to float order (and the CPU backend's for the
//! legacy types, which pair with Q8_0 / Q8_1 alike); the offset terms of Q4_1 / Q5_1 / Q4_K /
//! Q5_K are summed per stage of 8 units on the tensor cores (`mmq_offsets` in mmq.cu). `reference` is the plain-Rust twin of the kernel; the GPU tests hold the kernel
//! to it and to the CPU backend.

use crate::error::CudaError;
use crate::fusion::Device;
use crate::matmul::QCache;
use crate::runtime::Arg;
use crate::weights::unit::{load_unit, Unit};
use crate::weights::{CudaWeight, DevType};
use quarrel_core::QuantType;
use std::sync::Mutex;

/// Units staged per iteration (MMQ_KU in mmq.cu).
const KU: usize = 8;
/// Row stride of the shared int8 tiles in 4-byte words (MMQ_WS in mmq.cu).
const WS: usize = KU * 8 + 4;
/// Multiprocessors of a large data-centre GPU: grids smaller than about two blocks per
/// multiprocessor get split-K.
const SMS: usize = 132;

/// Up to this many tokens a quantized matmul takes MMQ whatever its shape; up to
/// `MMQ_SMALL_MATRIX_TOKENS` when the matrix is small; above, the f16 cuBLAS GEMM
/// (`examples/mmq_bench.rs` compares them per shape). Up to 32 tokens MMQ is level with
/// cuBLAS-f16 over cached f16 weights per matrix and ahead end to end (no f16 copies); small
/// matrices (k/v projections, at most 4096 x 2048) stay about level up to 64 tokens; the
/// others fall behind from 48 tokens on (down to a quarter of cuBLAS's speed at 128+ tokens).
pub const MMQ_MAX_TOKENS: usize = 32;
/// See `MMQ_MAX_TOKENS`.
pub const MMQ_SMALL_MATRIX_TOKENS: usize = 64;

/// The weight types with an MMQ kernel (and a unit decoding in `weights::unit`).
pub const MMQ_TYPES: [QuantType; 8] = [
    QuantType::Q4_0,
    QuantType::Q4_1,
    QuantType::Q5_0,
    QuantType::Q5_1,
    QuantType::Q8_0,
    QuantType::Q4_K,
    QuantType::Q5_K,
    QuantType::Q6_K,
];

/// Whether a matmul of `n_tok` tokens over an `n_out x n_in` quantized weight takes MMQ.
pub fn mmq_wins(n_in: usize, n_out: usize, n_tok: usize) -> bool {
    n_tok <= MMQ_MAX_TOKENS || (n_tok <= MMQ_SMALL_MATRIX_TOKENS && n_in * n_out <= 4096 * 2048)
}

/// A kernel's tile: NT n8 tiles per warp (16·NT tokens per block), `WM` warps along the rows
/// (32·WM rows, 64·WM threads per block), and how many such blocks share a multiprocessor
/// (`__launch_bounds__` in mmq.cu).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Tile {
    nt: usize,
}

/// Warps along the rows of every tile: 128-row blocks of 8 warps.
const WM: usize = 4;

impl Tile {
    /// The smallest token tile that holds the batch.
    fn for_tokens(n_tok: usize) -> Tile {
        let nt = match n_tok {
            0..=16 => 1,
            17..=32 => 2,
            33..=64 => 4,
            _ => 8,
        };
        Tile { nt }
    }
    fn rows(self) -> usize {
        32 * WM
    }
    fn tokens(self) -> usize {
        16 * self.nt
    }
    fn threads(self) -> u32 {
        64 * WM as u32
    }
    /// Resident blocks per multiprocessor (the kernels' `__launch_bounds__`).
    fn per_sm(self) -> usize {
        match self.nt {
            1 | 2 => 2,
            _ => 1,
        }
    }
    /// Whether the kernel keeps two weight tiles (the 128 x 128 tile: `mmq_*_8_4d`, one
    /// barrier per stage, each warp decoding the next stage's weights after its multiplies).
    fn db(self) -> bool {
        self.nt == 8
    }
    /// Kernel name suffix: `<NT>_<WM>`, then `d` for two weight tiles.
    fn suffix(self) -> String {
        format!("{}_{WM}{}", self.nt, if self.db() { "d" } else { "" })
    }
    /// Dynamic shared memory: the weight tile(s) (int8 rows + a float4 of scales per unit) and
    /// two stages of the activation tile (int8 rows + {d, d·Σq} per unit).
    fn smem_bytes(self) -> u32 {
        let (bm, bn) = (self.rows(), self.tokens());
        let nw = if self.db() { 2 } else { 1 };
        (nw * (4 * bm * WS + 16 * KU * bm) + 2 * (4 * bn * WS + 8 * KU * bn)) as u32
    }
}

/// (tile, grid, units per split, splits) for a matmul; `split: false` keeps every unit of a row
/// in one block (invariant numerics: the sums do not depend on the grid).
fn shape(n_in: usize, n_out: usize, n_tok: usize, split: bool) -> (Tile, (u32, u32, u32), usize, usize) {
    let t = Tile::for_tokens(n_tok);
    let (bx, by) = (n_out.div_ceil(t.rows()), n_tok.div_ceil(t.tokens()));
    let units = n_in / 32;
    let iters = units.div_ceil(KU);
    if !split {
        return (t, (bx as u32, by as u32, 1), units, 1);
    }
    // split K while the grid leaves multiprocessors idle, each split keeping at least two
    // stages; the partial sums (written and read back) stay at or below the weight bytes:
    // splits <= n_in / (8 n_tok), except for grids that would leave most of the GPU idle
    let target = 2 * SMS * t.per_sm();
    let traffic = (n_in / (8 * n_tok)).max(if bx * by < target / 4 { 4 } else { 1 });
    let splits = target.div_ceil(bx * by).min(iters / 2).min(traffic).clamp(1, 8);
    let k_per = iters.div_ceil(splits) * KU;
    let splits = units.div_ceil(k_per);
    (t, (bx as u32, by as u32, splits as u32), k_per, splits)
}

/// The grouped expert kernels' tile (`mmq_id_<type>_<NT>_<WM>`) for work items of up to
/// `per_item` routes: (kernel suffix, rows per block, routes per item, threads, dynamic shared
/// bytes). The token tile is the smallest of 16 / 32 / 64 / 128 holding `per_item` (the
/// average routes per routed expert), as `Tile::for_tokens`.
pub(crate) fn id_tile(per_item: usize) -> (String, usize, usize, u32, u32) {
    let t = Tile::for_tokens(per_item);
    (t.suffix(), t.rows(), t.tokens(), t.threads(), t.smem_bytes())
}

/// `out (n_tok, n_out) = x · Wᵀ` through MMQ; `x` f32 on the device. Quantized weights only.
/// `split: false`: every unit of a row in one block (no split K), so each output sums in the
/// order the decode GEMV in MMQ's order (`gemvm_*`, invariant numerics) reproduces.
#[allow(clippy::too_many_arguments)]
pub(crate) fn mmq(
    dev: &Device,
    qc: &Mutex<Option<QCache>>,
    w: &CudaWeight,
    x: u64,
    n_tok: usize,
    out: u64,
    split: bool,
) -> Result<(), CudaError> {
    let DevType::Quant(name) = w.dev_ty else {
        return Err(CudaError::Unsupported(format!("MMQ for {} weights", w.dev_ty.name())));
    };
    mmq_raw(dev, qc, name, w.p.ptr, w.m_ptr(), w.n_in, w.n_out, x, n_tok, out, split)
}

/// Bytes per unit of 32 values of a repacked type: payload plane as a fraction
/// (numerator, denominator) and meta plane (0: none).
pub(crate) fn unit_bytes(name: &str) -> Result<((u64, u64), u64), CudaError> {
    Ok(match name {
        "q4_0" => ((16, 1), 2),
        "q4_1" => ((16, 1), 4),
        "q5_0" | "q5_1" => ((16, 1), 8),
        "q8_0" => ((32, 1), 2),
        "q4_K" => ((144, 8), 0),
        "q5_K" => ((176, 8), 0),
        "q6_K" => ((224, 8), 0),
        other => return Err(CudaError::Unsupported(format!("MMQ for {other} weights"))),
    })
}

/// MMQ over raw planes (`p`, `m`) of `n_out` rows of `n_in` values of type `name`;
/// `split: false`: never split over K.
#[allow(clippy::too_many_arguments)]
pub(crate) fn mmq_raw(
    dev: &Device,
    qc: &Mutex<Option<QCache>>,
    name: &str,
    p: u64,
    m: u64,
    n_in: usize,
    n_out: usize,
    x: u64,
    n_tok: usize,
    out: u64,
    split: bool,
) -> Result<(), CudaError> {
    if n_tok == 0 || n_out == 0 {
        return Ok(());
    }
    let units = n_in / 32;
    let (xq, xm) = crate::matmul::q8_activations(dev, qc, x, n_tok, n_in, out)?;
    let (tile, grid, k_per, splits) = shape(n_in, n_out, n_tok, split);
    let (kernel, threads, smem) = (format!("mmq_{name}_{}", tile.suffix()), tile.threads(), tile.smem_bytes());
    let n = n_tok * n_out;
    let part = if splits > 1 { Some(dev.scratch(4 * n * splits)?) } else { None };
    let dst = part.as_ref().map_or(out, |p| p.ptr());
    dev.launch(
        &kernel,
        grid,
        threads,
        smem,
        &[
            Arg::P(p),
            Arg::P(m),
            Arg::P(xq),
            Arg::P(xm),
            Arg::P(dst),
            Arg::I(units as i32),
            Arg::I(n_out as i32),
            Arg::I(n_tok as i32),
            Arg::I(k_per as i32),
        ],
    )?;
    if let Some(pm) = part {
        dev.launch_1d("mmq_reduce", n as u64, &[Arg::P(pm.ptr()), Arg::P(out), Arg::I(splits as i32), Arg::U64(n as u64)])?;
    }
    Ok(())
}

/// `quantize_q8` on the host: per 32 values int8 q = rint(v · 127 / amax) and
/// {d, d · Σq} rounded through f16 (ggml's block_q8_0 / block_q8_1).
pub fn quantize_q8_ref(x: &[f32]) -> (Vec<i8>, Vec<(f32, f32)>) {
    let mut q = vec![0i8; x.len()];
    let mut m = Vec::with_capacity(x.len() / 32);
    for (xb, qb) in x.chunks_exact(32).zip(q.chunks_exact_mut(32)) {
        let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let mut sum = 0i32;
        for (v, o) in xb.iter().zip(qb.iter_mut()) {
            *o = (v * id).round_ties_even() as i8;
            sum += *o as i32;
        }
        let h = |v: f32| half::f16::from_f32(v).to_f32();
        m.push((h(d), h(d * sum as f32)));
    }
    (q, m)
}

/// Reference twin of the MMQ kernel (and the GEMV): `x` (n_tok, n_in) against a repacked
/// weight (`weight::repack` planes `p`, `m`) of `n_out` rows, the same per-unit formula in
/// plain Rust, summed in f64. `n_in` must be a multiple of 32 (256 for K types).
pub fn reference(t: DevType, p: &[u8], m: &[u8], n_in: usize, n_out: usize, x: &[f32], n_tok: usize) -> Vec<f32> {
    let u = n_in / 32;
    let (xq, xm) = quantize_q8_ref(&x[..n_tok * n_in]);
    let units: Vec<Unit> = (0..n_out * u).map(|g| load_unit(t, p, m, g / u, g % u, u)).collect();
    let mut out = vec![0f32; n_tok * n_out];
    for tok in 0..n_tok {
        for row in 0..n_out {
            let mut acc = 0f64;
            for k in 0..u {
                let w = &units[row * u + k];
                let xb = &xq[(tok * u + k) * 32..][..32];
                let (xd, xs) = xm[tok * u + k];
                let i0: i32 = (0..16).map(|i| w.q[i] as i32 * xb[i] as i32).sum();
                let i1: i32 = (16..32).map(|i| w.q[i] as i32 * xb[i] as i32).sum();
                acc += if t == DevType::Quant("q6_K") {
                    (xd * (w.s0 * i0 as f32 + w.s1 * i1 as f32)) as f64
                } else {
                    ((i0 + i1) as f32 * (w.s0 * xd) + w.o * xs) as f64
                };
            }
            out[tok * n_out + row] = acc as f32;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weights::repack;
    use proptest::prelude::*;

    #[test]
    fn shapes_cover_every_unit_once() {
        for (n_in, n_out, n_tok) in [(4096, 4096, 512), (4096, 4096, 32), (14336, 4096, 128), (512, 70, 33), (544, 70, 9), (32, 8, 3)] {
            let (t, grid, k_per, splits) = shape(n_in, n_out, n_tok, true);
            let u = n_in / 32;
            assert_eq!(grid.2 as usize, splits);
            assert!(k_per % KU == 0 && k_per * splits >= u && k_per * (splits - 1) < u, "{n_in} {n_out} {n_tok}");
            assert!(grid.0 as usize * t.rows() >= n_out && grid.1 as usize * t.tokens() >= n_tok);
        }
    }

    #[test]
    fn tiles_fit_in_shared_memory() {
        // sm_90: 227 KiB of shared memory per block, 228 KiB per multiprocessor (1 KiB of it
        // reserved per block)
        for nt in [1, 2, 4, 8] {
            let t = Tile { nt };
            // dynamic (two weight tiles where `db`), plus the static row-index table (a
            // u32 per token slot)
            let b = t.smem_bytes() as usize + 4 * t.tokens();
            assert!(b <= 227 * 1024 && t.per_sm() * (b + 1024) <= 228 * 1024, "{t:?}: {b} bytes");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(16))]
        /// The twin's exact-integer formula equals dequantized weights times dequantized Q8
        /// activations (f64), up to f32 rounding of the scale products.
        #[test]
        fn reference_matches_dequantized_product(seed in any::<u64>(), rows in 1usize..5, blocks in 1usize..3, n_tok in 1usize..4) {
            let n_in = 256 * blocks;
            let mut s = seed | 1;
            let mut r = || { s ^= s << 13; s ^= s >> 7; s ^= s << 17; (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0 };
            let w: Vec<f32> = (0..rows * n_in).map(|_| r()).collect();
            let x: Vec<f32> = (0..n_tok * n_in).map(|_| r()).collect();
            let (xq, xm) = quantize_q8_ref(&x);
            for ty in MMQ_TYPES {
                let bytes = quarrel_quant::quantize_to_vec(ty, &w).unwrap();
                let mut wd = vec![0f32; w.len()];
                quarrel_quant::dequantize(ty, &bytes, &mut wd).unwrap();
                let (t, p, m) = repack(ty, &bytes).unwrap();
                let got = reference(t, &p, &m.unwrap_or_default(), n_in, rows, &x, n_tok);
                for tok in 0..n_tok {
                    for row in 0..rows {
                        let want: f64 = (0..n_in).map(|i| wd[row * n_in + i] as f64 * (xq[tok * n_in + i] as f64 * xm[(tok * n_in + i) / 32].0 as f64)).sum();
                        let mag: f64 = (0..n_in).map(|i| (wd[row * n_in + i] as f64 * x[tok * n_in + i] as f64).abs()).sum();
                        let g = got[tok * rows + row] as f64;
                        // legacy offsets use the f16-rounded d·Σq (as ggml does): a relative 1e-3 of the offset term
                        prop_assert!((g - want).abs() <= 2e-3 * mag + 1e-4, "{ty} tok {tok} row {row}: {g} vs {want} (mag {mag})");
                    }
                }
            }
        }
    }
}
