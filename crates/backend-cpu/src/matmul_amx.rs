//! F16 matmuls on the matrix units ([`crate::simd::amx`]) for a backend told to use them
//! ([`CpuBackend::set_matrix_units`]): encoders, whose vectors are compared by cosine, at every
//! token count (a text's vector then does not depend on what shares its forward). Decoders keep
//! the vector kernels, whose float order is llama.cpp's.
//!
//! Weights are packed once into groups of 16 rows (bf16 hi and lo tiles, twice the F16 bytes)
//! and kept like the GEMM panels; the activations are split per call. Tasks are ranges of row
//! pairs x ranges of 32-token pairs of tiles, run in passes over blocks of inputs that fit L2.

use crate::matmul::SyncPtr;
use crate::simd::amx::{self, Tiles, TILE};
use crate::{CpuBackend, CpuWeight};
use quarrel_core::{QuantType, Result};

/// Pairs of 16-row weight groups per task (at most).
const ROW_PAIRS_PER_TASK: usize = 8;
/// Pairs of 16-token activation tiles per task (at most).
const TOKEN_PAIRS_PER_TASK: usize = 8;
/// Blocks of 32 inputs per pass over a task's tiles: 8 row pairs' weights (512 KB) and 8 token
/// pairs' activations (512 KB) stay in L2 together.
const K_BLOCKS_PER_PASS: usize = 16;
/// Fewest tasks per thread before row blocks narrow (the pool hands them out one at a time).
const MIN_TASKS_PER_THREAD: usize = 2;

thread_local! {
    /// A task's output tiles between passes (kept: a fresh 256 KB would fault in its pages on
    /// every task).
    static ACC: std::cell::RefCell<Vec<[[f32; TILE * TILE]; 4]>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Whether `matmul` runs `w` on the matrix units.
pub(crate) fn takes(be: &CpuBackend, w: &CpuWeight) -> bool {
    w.ty == QuantType::F16 && be.matrix_units()
}

/// `out[t * n_out + r] = x[t] · w[r]` for `n_tok` tokens.
pub(crate) fn matmul_f16(be: &CpuBackend, w: &CpuWeight, x: &[f32], n_tok: usize, out: &mut [f32]) -> Result<()> {
    let (n_in, n_out) = (w.n_in, w.n_out);
    if x.len() < n_tok * n_in || out.len() < n_tok * n_out {
        return Err(quarrel_core::CoreError::Shape(format!(
            "matmul: {} inputs and {} outputs for {n_tok} tokens of a ({n_in}, {n_out}) weight",
            x.len(),
            out.len()
        )));
    }
    let pairs = n_out.div_ceil(2 * TILE);
    let bytes = pairs * 2 * amx::group_bytes(n_in);
    let fill = |v: &mut [u8]| pack_weights(be, w, v);
    let mut run = |packed: &[u8]| run(be, packed, n_in, n_out, x, n_tok, out);
    match w.kept_gemm_panels(bytes, fill) {
        Some(packed) => run(packed),
        None => w.with_gemm_panels(bytes, fill, run),
    }
    Ok(())
}

/// `w`'s rows as packed groups (`v`: one [`amx::group_bytes`] piece per 16 rows, an even
/// number of groups), in parallel.
fn pack_weights(be: &CpuBackend, w: &CpuWeight, v: &mut [u8]) {
    let (n_in, n_out, gb) = (w.n_in, w.n_out, amx::group_bytes(w.n_in));
    let (bytes, rb) = (w.bytes(), w.row_bytes());
    be.par_chunks_mut(v, gb, &|g, piece| {
        let rows: Vec<&[u8]> = (g * TILE..((g + 1) * TILE).min(n_out)).map(|r| &bytes[r * rb..(r + 1) * rb]).collect();
        amx::pack_group(n_in, &rows, piece);
    });
}

fn run(be: &CpuBackend, packed: &[u8], n_in: usize, n_out: usize, x: &[f32], n_tok: usize, out: &mut [f32]) {
    let (kb, gb, arb) = (amx::k_blocks(n_in), amx::group_bytes(n_in), amx::act_row_bytes(n_in));
    let token_pairs = n_tok.div_ceil(2 * TILE);
    let rows = token_pairs * 2 * TILE;
    crate::matmul::with_act_scratch(2 * rows * arb, |act| {
        let (hi, lo) = act[..2 * rows * arb].split_at_mut(rows * arb);
        split_activations(be, x, n_in, n_tok, arb, hi, lo);
        let (hi, lo): (&[u8], &[u8]) = (hi, lo);
        let row_pairs = n_out.div_ceil(2 * TILE);
        let tpb = TOKEN_PAIRS_PER_TASK.min(token_pairs);
        let tp_tasks = token_pairs.div_ceil(tpb);
        // narrower row blocks where there would be too few tasks to share
        let mut rpb = ROW_PAIRS_PER_TASK.min(row_pairs);
        while rpb > 1 && row_pairs.div_ceil(rpb) * tp_tasks < MIN_TASKS_PER_THREAD * be.n_threads() {
            rpb /= 2;
        }
        let rp_tasks = row_pairs.div_ceil(rpb);
        let optr = SyncPtr(out.as_mut_ptr());
        be.for_each_task(rp_tasks * tp_tasks, &|task| {
            let (rt, tt) = (task % rp_tasks, task / rp_tasks);
            let Some(tiles) = Tiles::new() else { return };
            let (rps, tps) = (rt * rpb..((rt + 1) * rpb).min(row_pairs), tt * tpb..((tt + 1) * tpb).min(token_pairs));
            ACC.with_borrow_mut(|c| {
                c.resize(rps.len() * tps.len(), [[0f32; TILE * TILE]; 4]);
                // blocks of inputs outermost: their weights and activations stay in L2 while every
                // (token pair, row pair) of the task takes them; the sums go on in `c`
                for k0 in (0..kb).step_by(K_BLOCKS_PER_PASS) {
                    let nk = K_BLOCKS_PER_PASS.min(kb - k0);
                    for (i, tp) in tps.clone().enumerate() {
                        let at = tp * 2 * TILE * arb + k0 * 64;
                        for (j, rp) in rps.clone().enumerate() {
                            let w0 = &packed[2 * rp * gb + k0 * 2048..(2 * rp + 1) * gb];
                            let w1 = &packed[(2 * rp + 1) * gb + k0 * 2048..(2 * rp + 2) * gb];
                            tiles.block_2x2(&hi[at..], &lo[at..], arb, nk, w0, w1, k0 > 0, &mut c[i * rps.len() + j]);
                        }
                    }
                }
                for (i, tp) in tps.clone().enumerate() {
                    for (j, rp) in rps.clone().enumerate() {
                        for (q, tile) in c[i * rps.len() + j].iter().enumerate() {
                            let (t0, r0) = (tp * 2 * TILE + (q / 2) * TILE, rp * 2 * TILE + (q % 2) * TILE);
                            let nr = TILE.min(n_out.saturating_sub(r0));
                            for t in 0..TILE.min(n_tok.saturating_sub(t0)) {
                                // SAFETY: token t0 + t < n_tok and rows r0 .. r0 + nr <= n_out: this
                                // task's own outputs, inside `out` (checked by the caller).
                                unsafe { optr.write_slice((t0 + t) * n_out + r0, &tile[t * TILE..t * TILE + nr]) };
                            }
                        }
                    }
                }
            });
        });
    });
}

/// The hi and lo activation matrices (`rows` of `arb` bytes each; rows past `n_tok` zero), in
/// parallel over tokens.
fn split_activations(be: &CpuBackend, x: &[f32], n_in: usize, n_tok: usize, arb: usize, hi: &mut [u8], lo: &mut [u8]) {
    const ROWS_PER_TASK: usize = 16;
    let lo_ptr = lo.as_mut_ptr() as usize;
    be.par_chunks_mut(hi, ROWS_PER_TASK * arb, &|c, his| {
        // SAFETY: the lo matrix has the hi one's shape; chunk c's rows are this task's alone.
        let los = unsafe { std::slice::from_raw_parts_mut((lo_ptr as *mut u8).add(c * ROWS_PER_TASK * arb), his.len()) };
        for (i, (h, l)) in his.chunks_exact_mut(arb).zip(los.chunks_exact_mut(arb)).enumerate() {
            let t = c * ROWS_PER_TASK + i;
            if t < n_tok {
                amx::pack_act_row(&x[t * n_in..(t + 1) * n_in], h, l);
            } else {
                h.fill(0);
                l.fill(0);
            }
        }
    });
}
