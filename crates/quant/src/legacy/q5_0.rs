//! Q5_0: `{ f16 d; u8 qh[4]; u8 qs[16] }`, value = `d * (q - 16)` where the
//! 5th bit of element `j` is bit `j` of the little-endian u32 `qh`.

use super::{dequantize_pairs, dot_pairs, q5_pack, q5_pair, quantize_pairs, symmetric_scale};
use crate::layout::{decode_blocks, dot_blocks, encode_blocks, read_f16, read_u32, BLOCK_Q8_0_SIZE, QK8_0};

crate::layout::block_geometry!(Q5_0);

/// `dequantize_row_q5_0`.
pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    for (b, y) in decode_blocks("q5_0", QK, BLOCK_BYTES, src, dst) {
        let d = read_f16(b, 0);
        let qh = read_u32(b, 2);
        dequantize_pairs(y, |j| q5_pair(&b[6..], qh, j), |q| (q as i32 - 16) as f32 * d);
    }
}

/// `quantize_row_q5_0_ref`: `d = max / -16`, `q = min(31, trunc(x/d + 16.5))`.
pub fn quantize_row(src: &[f32], dst: &mut [u8]) {
    for (x, b) in encode_blocks("q5_0", QK, BLOCK_BYTES, src, dst) {
        let id = symmetric_scale(x, b, 16.0);
        let mut qh = 0u32;
        let q = |v: f32| ((v * id + 16.5) as i8).min(31) as u8;
        quantize_pairs(x, q, |j, xi0, xi1| q5_pack(&mut b[6..], &mut qh, j, xi0, xi1));
        b[2..6].copy_from_slice(&qh.to_le_bytes());
    }
}

/// `ggml_vec_dot_q5_0_q8_0_generic`: `w` is Q5_0, `a` is Q8_0.
pub fn vec_dot_q8_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in dot_blocks(["q5_0 vec_dot w", "q5_0 vec_dot a (q8_0)"], n, (w, QK, BLOCK_BYTES), (a, QK8_0, BLOCK_Q8_0_SIZE)) {
        let qh = read_u32(x, 2);
        let sumi = dot_pairs(&y[2..], |j| {
            let (x0, x1) = q5_pair(&x[6..], qh, j);
            (x0 as i32 - 16, x1 as i32 - 16)
        });
        sumf += (read_f16(x, 0) * read_f16(y, 0)) * sumi as f32;
    }
    sumf
}
