//! Q8_K: `{ f32 d; i8 qs[256]; i16 bsums[16] }`, value = `d * q`. The
//! activation type of the K-quant dot products; `bsums[j]` is the sum of
//! `qs[16j..16j+16]` and is what Q2_K/Q4_K/Q5_K use to apply their mins.
//! ggml has no `vec_dot` for it (not a weight type).

use super::nearest_int;
use crate::layout::*;

crate::layout::block_geometry!(Q8_K);

/// `dequantize_row_q8_K`: `d * q`.
pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    for (b, y) in decode_blocks("q8_K", QK, BLOCK_BYTES, src, dst) {
        let d = read_f32(b, Q8_K_D_OFF);
        for (o, &q) in y.iter_mut().zip(&b[Q8_K_QS_OFF..Q8_K_QS_OFF + QK_K]) {
            *o = d * q as i8 as f32;
        }
    }
}

/// `quantize_row_q8_K_ref`: `iscale = -127 / max` (`max` = signed value of
/// largest magnitude), `q = min(127, nearest_int(iscale * x))`, `d = 1/iscale`,
/// plus the 16 block sums. An all-zero block gets `d = 0`, `q = 0` and (unlike
/// ggml, which leaves them untouched) zero `bsums`.
pub fn quantize_row(src: &[f32], dst: &mut [u8]) {
    for (x, y) in encode_blocks("q8_K", QK, BLOCK_BYTES, src, dst) {
        let (amax, max) = crate::scan::signed_absmax(x);
        if amax == 0.0 {
            y.fill(0);
            continue;
        }
        let iscale = -127.0 / max;
        for (j, &v) in x.iter().enumerate() {
            let q = nearest_int(iscale * v).min(127);
            y[Q8_K_QS_OFF + j] = q as i8 as u8;
        }
        for j in 0..QK_K / 16 {
            let mut sum = 0i32;
            for &q in &y[Q8_K_QS_OFF + 16 * j..Q8_K_QS_OFF + 16 * j + 16] {
                sum += q as i8 as i32;
            }
            let off = Q8_K_BSUMS_OFF + 2 * j;
            y[off..off + 2].copy_from_slice(&(sum as i16).to_le_bytes());
        }
        write_f32(y, Q8_K_D_OFF, 1.0 / iscale);
    }
}

/// Read the `d` scale of a Q8_K block.
#[inline]
pub fn block_d(b: &[u8]) -> f32 {
    read_f32(b, Q8_K_D_OFF)
}

/// Read `bsums[j]` of a Q8_K block.
#[inline]
pub fn block_bsum(b: &[u8], j: usize) -> i16 {
    read_i16(b, Q8_K_BSUMS_OFF + 2 * j)
}
