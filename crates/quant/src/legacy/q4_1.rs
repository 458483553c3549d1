//! Q4_1: `{ f16 d; f16 m; u8 qs[16] }`, value = `d * nibble + m`.

use super::{dequantize_pairs, dot_pairs, q4_pair, quantize_pairs, scale_and_min};
use crate::layout::{decode_blocks, dot_blocks, encode_blocks, read_f16, BLOCK_Q8_1_SIZE, QK8_1};

crate::layout::block_geometry!(Q4_1);

/// `dequantize_row_q4_1`.
pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    for (b, y) in decode_blocks("q4_1", QK, BLOCK_BYTES, src, dst) {
        let d = read_f16(b, 0);
        let m = read_f16(b, 2);
        dequantize_pairs(y, |j| q4_pair(&b[4..], j), |q| q as f32 * d + m);
    }
}

/// `quantize_row_q4_1_ref`: `d = (max - min) / 15`, `m = min`,
/// `q = min(15, trunc((x - min)/d + 0.5))`.
pub fn quantize_row(src: &[f32], dst: &mut [u8]) {
    for (x, b) in encode_blocks("q4_1", QK, BLOCK_BYTES, src, dst) {
        let (min, id) = scale_and_min(x, b, 15.0);
        let q = |v: f32| (((v - min) * id + 0.5) as i8).min(15) as u8;
        quantize_pairs(x, q, |j, xi0, xi1| b[4 + j] = xi0 | (xi1 << 4));
    }
}

/// `ggml_vec_dot_q4_1_q8_1_generic`: `w` is Q4_1, `a` is Q8_1.
pub fn vec_dot_q8_1(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in dot_blocks(["q4_1 vec_dot w", "q4_1 vec_dot a (q8_1)"], n, (w, QK, BLOCK_BYTES), (a, QK8_1, BLOCK_Q8_1_SIZE)) {
        let sumi = dot_pairs(&y[4..], |j| {
            let (v0, v1) = q4_pair(&x[4..], j);
            (v0 as i32, v1 as i32)
        });
        sumf += (read_f16(x, 0) * read_f16(y, 0)) * sumi as f32 + read_f16(x, 2) * read_f16(y, 2);
    }
    sumf
}
