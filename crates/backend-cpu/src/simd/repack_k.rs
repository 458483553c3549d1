//! The repacked form of Q4_K (`simd::repack`'s 16-row groups, one 256-element super-block
//! per group block) and its scalar twin. The float order is llama.cpp's x86
//! `block_q4_Kx8` kernels' (`ggml_gemv_q4_K_8x8_q8_K` / `ggml_gemm_q4_K_8x8_q8_K`): per
//! super-block the exact integer sums `isum = Σ_j scale_j · Σ q·y` and `imin = Σ_j min_j ·
//! bsum_j`, then `acc = fma(f32(isum), d_w * d_a, acc)`, `accm = fma(f32(imin), dmin_w * d_a,
//! accm)`; the result is `acc - accm`.
//!
//! ```text
//!  group block (16 rows, 2368 B): codes  jj = 0..4, k = 0..8: 64 B, lane i = row i's qs[32jj+4k..+4]
//!                                         (low nibbles: sub-block 2jj, high: 2jj + 1)
//!                                 scales u8 [sub-block j][row i]           128 B
//!                                 mins   u8 [pair p][row i][2]              128 B
//!                                 d f16 [16] | dmin f16 [16]                 64 B
//! ```

use super::repack::{ActAux, R};
use quarrel_quant::kquants::get_scale_min_k4;

pub(crate) const QK: usize = 256;
/// GGUF Q4_K block / Q8_K block bytes.
pub(crate) const WB: usize = 144;
pub(crate) const AB: usize = 292;
pub(crate) const CODES: usize = 128 * R;
pub(crate) const SCALES: usize = CODES;
pub(crate) const MINS: usize = SCALES + 8 * R;
pub(crate) const D: usize = MINS + 8 * R;
pub(crate) const DMIN: usize = D + 2 * R;
pub(crate) const GROUP_BLOCK: usize = DMIN + 2 * R;

/// Repack `n_out` Q4_K rows into `out` (see [`super::repack::repack_into`]).
pub(crate) fn repack_into(n_in: usize, n_out: usize, src: &[u8], out: &mut [u8]) {
    super::repack::for_each_block(n_in, n_out, src, out, (QK, WB, GROUP_BLOCK), |i, s, d| {
        let qs = &s[16..];
        for jj in 0..4 {
            for k in 0..8 {
                for j in 0..4 {
                    d[(jj * 8 + k) * 64 + 4 * i + j] = qs[32 * jj + 4 * k + j];
                }
            }
        }
        for j in 0..8 {
            let (sc, m) = get_scale_min_k4(j, &s[4..16]);
            d[SCALES + j * R + i] = sc;
            d[MINS + (j / 2) * 2 * R + 2 * i + j % 2] = m;
        }
        d[D + 2 * i..D + 2 * i + 2].copy_from_slice(&s[0..2]);
        d[DMIN + 2 * i..DMIN + 2 * i + 2].copy_from_slice(&s[2..4]);
    });
}

/// The [`ActAux`] of each super-block of a Q8_K row: `d` and the sub-block sums `bs`.
pub(crate) fn act_aux(n_in: usize, a: &[u8], out: &mut [ActAux]) {
    let nb = n_in / QK;
    assert!(a.len() >= nb * AB && out.len() >= nb);
    for (b, o) in out[..nb].iter_mut().enumerate() {
        let blk = &a[b * AB..(b + 1) * AB];
        let bsum = |j: usize| i16::from_le_bytes([blk[4 + QK + 2 * j], blk[4 + QK + 2 * j + 1]]);
        let mut bs = [0i16; 8];
        for (j, v) in bs.iter_mut().enumerate() {
            *v = bsum(2 * j) + bsum(2 * j + 1);
        }
        *o = ActAux { off: 0, d: f32::from_le_bytes([blk[0], blk[1], blk[2], blk[3]]), _pad: [0; 2], bs };
    }
}

fn f16(b: &[u8], o: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[o], b[o + 1]])).to_f32()
}

/// Row `i` of the group at `group` against the Q8_K row `a` (scalar twin of the kernel).
pub(crate) fn reference_dot(n_in: usize, group: &[u8], i: usize, a: &[u8]) -> f32 {
    let nb = n_in / QK;
    let mut aux = vec![ActAux::default(); nb];
    act_aux(n_in, a, &mut aux);
    let (mut acc, mut accm) = (0f32, 0f32);
    for b in 0..nb {
        let g = &group[b * GROUP_BLOCK..(b + 1) * GROUP_BLOCK];
        let y = &a[b * AB + 4..b * AB + 4 + QK];
        let (mut isum, mut imin) = (0i32, 0i32);
        for j in 0..8 {
            let (jj, hi) = (j / 2, j % 2 == 1);
            let mut dot = 0i32;
            for k in 0..8 {
                for l in 0..4 {
                    let c = g[(jj * 8 + k) * 64 + 4 * i + l];
                    let q = if hi { c >> 4 } else { c & 15 };
                    dot += q as i32 * y[32 * j + 4 * k + l] as i8 as i32;
                }
            }
            isum += g[SCALES + j * R + i] as i32 * dot;
            imin += g[MINS + jj * 2 * R + 2 * i + j % 2] as i32 * aux[b].bs[j] as i32;
        }
        acc = (isum as f32).mul_add(f16(g, D + 2 * i) * aux[b].d, acc);
        accm = (imin as f32).mul_add(f16(g, DMIN + 2 * i) * aux[b].d, accm);
    }
    acc - accm
}
