//! MXFP4: `{ u8 e; u8 qs[16] }`, value = `e8m0_half(e) * KVALUES_MXFP4[nibble]`.

use super::{e8m0_to_fp32_half, KVALUES_MXFP4};
use crate::layout::{decode_blocks, dot_blocks, encode_blocks, read_f16, BLOCK_MXFP4_SIZE, BLOCK_Q8_0_SIZE, QK8_0, QK_MXFP4};
use crate::legacy::{dequantize_pairs, dot_pairs, q4_pair};

/// Elements per block.
pub const QK: usize = QK_MXFP4;
/// Bytes per block.
pub const BLOCK_BYTES: usize = BLOCK_MXFP4_SIZE;

/// `dequantize_row_mxfp4`.
pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    for (b, y) in decode_blocks("mxfp4", QK, BLOCK_BYTES, src, dst) {
        let d = e8m0_to_fp32_half(b[0]);
        dequantize_pairs(y, |j| q4_pair(&b[1..], j), |q| KVALUES_MXFP4[q as usize] as f32 * d);
    }
}

/// ggml's `best_index_mxfp4`: first index minimising `|k[i] * e - x|`.
#[inline]
fn best_index_mxfp4(x: f32, e: f32) -> u8 {
    let mut best_index = 0u8;
    let mut best_err = (KVALUES_MXFP4[0] as f32 * e - x).abs();
    for (i, &k) in KVALUES_MXFP4.iter().enumerate().skip(1) {
        let err = (k as f32 * e - x).abs();
        if err < best_err {
            best_index = i as u8;
            best_err = err;
        }
    }
    best_index
}

/// `quantize_row_mxfp4_ref`: `e = floor(log2(amax)) - 2 + 127` (so the largest
/// magnitude lands in the top E2M1 binade), then nearest codebook entry.
pub fn quantize_row(src: &[f32], dst: &mut [u8]) {
    for (x, y) in encode_blocks("mxfp4", QK, BLOCK_BYTES, src, dst) {
        let mut amax = 0.0f32;
        for &v in x {
            if amax < v.abs() {
                amax = v.abs();
            }
        }
        // C: (uint8_t)(floorf(log2f(amax)) - 2 + 127); the float->int->u8 path
        // wraps like x86 does for the (in C undefined) out-of-range case.
        let e = if amax > 0.0 { ((amax.log2().floor() - 2.0 + 127.0) as i32) as u8 } else { 0 };
        let d = e8m0_to_fp32_half(e);
        y[0] = e;
        for j in 0..QK / 2 {
            let x0 = best_index_mxfp4(x[j], d);
            let x1 = best_index_mxfp4(x[QK / 2 + j], d);
            y[1 + j] = x0 | (x1 << 4);
        }
    }
}

/// `ggml_vec_dot_mxfp4_q8_0_generic`: `w` is MXFP4, `a` is Q8_0.
pub fn vec_dot_q8_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in dot_blocks(["mxfp4 vec_dot w", "mxfp4 vec_dot a (q8_0)"], n, (w, QK, BLOCK_BYTES), (a, QK8_0, BLOCK_Q8_0_SIZE)) {
        let d = read_f16(y, 0) * e8m0_to_fp32_half(x[0]);
        let sumi = dot_pairs(&y[2..], |j| {
            let (v0, v1) = q4_pair(&x[1..], j);
            (KVALUES_MXFP4[v0 as usize] as i32, KVALUES_MXFP4[v1 as usize] as i32)
        });
        sumf += d * sumi as f32;
    }
    sumf
}
