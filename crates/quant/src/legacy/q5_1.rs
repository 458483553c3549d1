//! Q5_1: `{ f16 d; f16 m; u8 qh[4]; u8 qs[16] }`, value = `d * q + m`.

use super::{dequantize_pairs, dot_pairs, q5_pack, q5_pair, quantize_pairs, scale_and_min};
use crate::layout::{decode_blocks, dot_blocks, encode_blocks, read_f16, read_u32, BLOCK_Q8_1_SIZE, QK8_1};

crate::layout::block_geometry!(Q5_1);

/// `dequantize_row_q5_1`.
pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    for (b, y) in decode_blocks("q5_1", QK, BLOCK_BYTES, src, dst) {
        let d = read_f16(b, 0);
        let m = read_f16(b, 2);
        let qh = read_u32(b, 4);
        dequantize_pairs(y, |j| q5_pair(&b[8..], qh, j), |q| q as f32 * d + m);
    }
}

/// `quantize_row_q5_1_ref`: `d = (max - min) / 31`, `m = min`,
/// `q = trunc((x - min)/d + 0.5)` (5 bits kept).
pub fn quantize_row(src: &[f32], dst: &mut [u8]) {
    for (x, b) in encode_blocks("q5_1", QK, BLOCK_BYTES, src, dst) {
        let (min, id) = scale_and_min(x, b, 31.0);
        let mut qh = 0u32;
        // ggml: `(uint8_t)(x0 + 0.5f)`, no clamp (the value is <= 31.5 by construction).
        let q = |v: f32| ((v - min) * id + 0.5) as u8;
        quantize_pairs(x, q, |j, xi0, xi1| q5_pack(&mut b[8..], &mut qh, j, xi0, xi1));
        b[4..8].copy_from_slice(&qh.to_le_bytes());
    }
}

/// `ggml_vec_dot_q5_1_q8_1_generic`: `w` is Q5_1, `a` is Q8_1.
pub fn vec_dot_q8_1(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in dot_blocks(["q5_1 vec_dot w", "q5_1 vec_dot a (q8_1)"], n, (w, QK, BLOCK_BYTES), (a, QK8_1, BLOCK_Q8_1_SIZE)) {
        let qh = read_u32(x, 4);
        let sumi = dot_pairs(&y[4..], |j| {
            let (x0, x1) = q5_pair(&x[8..], qh, j);
            (x0 as i32, x1 as i32)
        });
        sumf += (read_f16(x, 0) * read_f16(y, 0)) * sumi as f32 + read_f16(x, 2) * read_f16(y, 2);
    }
    sumf
}
