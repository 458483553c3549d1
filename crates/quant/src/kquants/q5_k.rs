//! Q5_K: `{ f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128] }`.
//! Like Q4_K with a 5th bit: element `l` of sub-block `j` takes bit `j` of `qh[l]`.

use super::q4_k::{quantize_scales_and_mins, vec_dot_scale_min};
use super::{scaled_pair_k4, Qkx2Params};
use crate::layout::*;

crate::layout::block_geometry!(Q5_K);

/// `dequantize_row_q5_K`.
pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    for (b, y) in decode_blocks("q5_K", QK, BLOCK_BYTES, src, dst) {
        let d = read_f16(b, Q5_K_D_OFF);
        let min = read_f16(b, Q5_K_DMIN_OFF);
        let scales = &b[Q5_K_SCALES_OFF..Q5_K_SCALES_OFF + K_SCALE_SIZE];
        let qh = &b[Q5_K_QH_OFF..Q5_K_QH_OFF + QK_K / 8];
        for (i, y64) in y.chunks_exact_mut(64).enumerate() {
            let ql = &b[Q5_K_QS_OFF + 32 * i..Q5_K_QS_OFF + 32 * i + 32];
            let u1 = 1u8 << (2 * i);
            let u2 = 2u8 << (2 * i);
            let [(d1, m1), (d2, m2)] = scaled_pair_k4(i, scales, d, min);
            for l in 0..32 {
                let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
                let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
                y64[l] = d1 * ((ql[l] & 0xF) + h1) as f32 - m1;
                y64[l + 32] = d2 * ((ql[l] >> 4) + h2) as f32 - m2;
            }
        }
    }
}

/// `quantize_row_q5_K_ref`.
pub fn quantize_row(src: &[f32], dst: &mut [u8]) {
    let params = Qkx2Params { nmax: 31, rmin: -0.5, rdelta: 0.1, nstep: 15, use_mad: false };
    let mut l = [0u8; QK_K];
    for (x, y) in encode_blocks("q5_K", QK, BLOCK_BYTES, src, dst) {
        quantize_scales_and_mins(x, params, &mut l, y);

        y[Q5_K_QH_OFF..Q5_K_QH_OFF + QK_K / 8].fill(0);
        let mut m1 = 1u8;
        let mut m2 = 2u8;
        for (i, n) in (0..QK_K).step_by(64).enumerate() {
            for j in 0..32 {
                let mut l1 = l[n + j];
                if l1 > 15 {
                    l1 -= 16;
                    y[Q5_K_QH_OFF + j] |= m1;
                }
                let mut l2 = l[n + j + 32];
                if l2 > 15 {
                    l2 -= 16;
                    y[Q5_K_QH_OFF + j] |= m2;
                }
                y[Q5_K_QS_OFF + 32 * i + j] = l1 | (l2 << 4);
            }
            m1 = m1.wrapping_shl(2);
            m2 = m2.wrapping_shl(2);
        }
    }
}

/// `ggml_vec_dot_q5_K_q8_K_generic`: `w` is Q5_K, `a` is Q8_K (uses `bsums`).
pub fn vec_dot_q8_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let blocks = dot_blocks(["q5_K vec_dot w", "q5_K vec_dot a (q8_K)"], n, (w, QK, BLOCK_BYTES), (a, QK_K, BLOCK_Q8_K_SIZE));
    vec_dot_scale_min(blocks, |x, aux8| {
        let q4 = &x[Q5_K_QS_OFF..Q5_K_QS_OFF + QK_K / 2];
        let hm = &x[Q5_K_QH_OFF..Q5_K_QH_OFF + QK_K / 8];
        for j in 0..QK_K / 64 {
            let (ma, mb) = (1u8 << (2 * j), 2u8 << (2 * j));
            for l in 0..32 {
                let ha = if hm[l] & ma != 0 { 16 } else { 0 };
                let hb = if hm[l] & mb != 0 { 16 } else { 0 };
                aux8[64 * j + l] = (q4[32 * j + l] & 0xF) as i32 + ha;
                aux8[64 * j + 32 + l] = (q4[32 * j + l] >> 4) as i32 + hb;
            }
        }
    })
}
