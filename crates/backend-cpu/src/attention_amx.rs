//! Attention on the matrix units ([`crate::simd::amx`]) for a backend that uses them
//! ([`CpuBackend::set_matrix_units`]: encoders), over an f16 cache: per (sequence, head), the
//! scores of 32 queries at a time against every key (`Q Kᵀ`), an exact softmax per query (every
//! score is at hand, so no running maximum), then `P V`. Queries and probabilities are split
//! into bf16 hi and lo halves (16 significant bits), keys and values exactly (they are F16);
//! sums in f32. A token sees the keys `0 ..= its position` (every key of its text for an
//! encoder, whose tokens all stand at the last position).
//!
//! Each (sequence, head) is one task; its keys and values are packed once for all of its query
//! blocks. Sinks, soft-capping and sliding windows take the vector path (`attention`).

use crate::kv::CpuKv;
use crate::matmul::SyncPtr;
use crate::simd::amx::{self, Tiles, TILE};
use crate::simd::attn::KvRows;
use crate::CpuBackend;
use quarrel_core::{AttnParams, ForwardBatch, KvType};

/// Queries per block (two tiles of tokens).
const QB: usize = 2 * TILE;

thread_local! {
    /// A task's packed keys and values, split queries and probabilities (kept between calls).
    static BYTES: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    /// A query block's scores.
    static SCORES: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Whether [`attention`] takes this call: matrix units in use, an f16 cache, and none of
/// sinks, soft-capping or a sliding window.
pub(crate) fn takes(be: &CpuBackend, kv: &CpuKv, layer: usize, p: &AttnParams, sinks: Option<&[f32]>) -> bool {
    be.matrix_units()
        && kv.spec.ty == KvType::F16
        && sinks.is_none()
        && p.softcap.is_none()
        && p.sliding_window.is_none()
        && matches!((kv.k[layer].rows(), kv.v[layer].rows()), (Some(KvRows::F16(_)), Some(KvRows::F16(_))))
}

/// `out` for every token of `batch` (validated by the caller: shapes, heads, blocks).
pub(crate) fn attention(be: &CpuBackend, q: &[f32], kv: &CpuKv, layer: usize, batch: &ForwardBatch, p: &AttnParams, out: &mut [f32]) {
    let (Some(KvRows::F16(k)), Some(KvRows::F16(v))) = (kv.k[layer].rows(), kv.v[layer].rows()) else {
        return;
    };
    let (hd, nh) = (p.head_dim, p.n_head);
    let group = nh / p.n_kv_head;
    let optr = SyncPtr(out.as_mut_ptr());
    be.for_each_task(batch.seqs.len() * nh, &|task| {
        let (si, h) = (task / nh, task % nh);
        let seq = &batch.seqs[si];
        if seq.len == 0 {
            return;
        }
        let Some(tiles) = Tiles::new() else { return };
        let kvh = h / group;
        let poss = &batch.positions[seq.start..seq.start + seq.len];
        let n_keys = poss.iter().map(|&x| x as usize + 1).max().unwrap_or(0);
        let keys = n_keys.next_multiple_of(QB);
        // value dimensions as weight rows: pairs of 16-row groups
        let dims = hd.next_multiple_of(QB);
        let (kgb, vgb) = (amx::group_bytes(hd), amx::group_bytes(keys));
        let (qrb, prb) = (amx::act_row_bytes(hd), amx::act_row_bytes(keys));
        let (k_bytes, v_bytes) = (keys / TILE * kgb, dims / TILE * vgb);
        let need = k_bytes + v_bytes + 2 * QB * qrb + 2 * QB * prb;
        BYTES.with_borrow_mut(|buf| {
            if buf.len() < need {
                buf.resize(need, 0);
            }
            let (kp, rest) = buf.split_at_mut(k_bytes);
            let (vp, rest) = rest.split_at_mut(v_bytes);
            let (qs, ps) = rest.split_at_mut(2 * QB * qrb);
            let (qh, ql) = qs.split_at_mut(QB * qrb);
            let (ph, pl) = ps[..2 * QB * prb].split_at_mut(QB * prb);
            let key = |j: usize| kv.row_offset(&seq.block_table, j, kvh);
            // keys as weight rows (16 positions a group), values transposed (16 dimensions a
            // group, positions as inputs); positions past the last key are zero
            for (g, piece) in kp.chunks_exact_mut(kgb).enumerate() {
                let rows = (g * TILE..(g + 1) * TILE).filter(|&j| j < n_keys).count();
                amx::pack_group_with(hd, rows, |n, d| k[key(g * TILE + n) + d].to_f32(), piece);
            }
            for (g, piece) in vp.chunks_exact_mut(vgb).enumerate() {
                let rows = TILE.min(hd.saturating_sub(g * TILE));
                amx::pack_group_with(n_keys, rows, |n, j| v[key(j) + g * TILE + n].to_f32(), piece);
            }
            SCORES.with_borrow_mut(|s| {
                s.resize(QB * keys, 0.0);
                let mut c = [[0f32; TILE * TILE]; 4];
                for q0 in (0..seq.len).step_by(QB) {
                    let nq = QB.min(seq.len - q0);
                    for i in 0..QB {
                        let (h_row, l_row) = (&mut qh[i * qrb..(i + 1) * qrb], &mut ql[i * qrb..(i + 1) * qrb]);
                        if i < nq {
                            let t = seq.start + q0 + i;
                            amx::split_row(&q[(t * nh + h) * hd..][..hd], false, h_row, l_row);
                        } else {
                            h_row.fill(0);
                            l_row.fill(0);
                        }
                    }
                    // scores of the block's queries against every key pair of groups
                    for kp2 in 0..keys / QB {
                        let (w0, w1) = (&kp[2 * kp2 * kgb..(2 * kp2 + 1) * kgb], &kp[(2 * kp2 + 1) * kgb..(2 * kp2 + 2) * kgb]);
                        tiles.block_2x2(qh, ql, qrb, amx::k_blocks(hd), w0, w1, false, &mut c);
                        for (tq, tile) in c.iter().enumerate() {
                            let (r0, c0) = ((tq / 2) * TILE, kp2 * QB + (tq % 2) * TILE);
                            for r in 0..TILE {
                                s[(r0 + r) * keys + c0..][..TILE].copy_from_slice(&tile[r * TILE..(r + 1) * TILE]);
                            }
                        }
                    }
                    // softmax rows: keys past a query's position (and padding) weigh nothing
                    let mut sums = [0f32; QB];
                    for i in 0..QB {
                        let row = &mut s[i * keys..(i + 1) * keys];
                        let seen = if i < nq { poss[q0 + i] as usize + 1 } else { 0 };
                        let (vis, rest) = row.split_at_mut(seen);
                        rest.fill(0.0);
                        if !vis.is_empty() {
                            vis.iter_mut().for_each(|x| *x *= p.scale);
                            let m = vis.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
                            vis.iter_mut().for_each(|x| *x -= m);
                            amx::exp_in_place(vis);
                            sums[i] = vis.iter().sum();
                        }
                        amx::split_row(row, false, &mut ph[i * prb..(i + 1) * prb], &mut pl[i * prb..(i + 1) * prb]);
                    }
                    // P V, two value groups (32 dimensions) at a time
                    for d2 in 0..dims / QB {
                        let (w0, w1) = (&vp[2 * d2 * vgb..(2 * d2 + 1) * vgb], &vp[(2 * d2 + 1) * vgb..(2 * d2 + 2) * vgb]);
                        tiles.block_2x2(ph, pl, prb, amx::k_blocks(keys), w0, w1, false, &mut c);
                        for (tq, tile) in c.iter().enumerate() {
                            let (r0, d0) = ((tq / 2) * TILE, d2 * QB + (tq % 2) * TILE);
                            let nd = TILE.min(hd.saturating_sub(d0));
                            for r in (0..TILE).filter(|&r| r0 + r < nq) {
                                let t = seq.start + q0 + r0 + r;
                                let inv = if sums[r0 + r] > 0.0 { 1.0 / sums[r0 + r] } else { 0.0 };
                                for d in 0..nd {
                                    // SAFETY: (token, head) belongs to this task alone; the
                                    // index lies inside `out` (n_tokens x n_head x head_dim).
                                    unsafe { optr.write((t * nh + h) * hd + d0 + d, tile[r * TILE + d] * inv) };
                                }
                            }
                        }
                    }
                }
            });
        });
    });
}
