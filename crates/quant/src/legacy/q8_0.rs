//! Q8_0: `{ f16 d; i8 qs[32] }`, value = `d * q`. Used for weights, for the
//! activations of Q4_0/Q5_0/Q8_0/IQ4_NL/MXFP4 dot products, and for KV caches.

use crate::layout::{decode_blocks, dot_blocks, encode_blocks, read_f16};

crate::layout::block_geometry!(Q8_0);

/// `dequantize_row_q8_0`.
pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    for (b, y) in decode_blocks("q8_0", QK, BLOCK_BYTES, src, dst) {
        super::dequantize_i8(b, 2, y);
    }
}

/// `quantize_row_q8_0_ref`: `d = amax / 127`, `q = roundf(x / d)` (half away from zero).
pub fn quantize_row(src: &[f32], dst: &mut [u8]) {
    for (x, b) in encode_blocks("q8_0", QK, BLOCK_BYTES, src, dst) {
        super::quantize_i8(x, b, 2);
    }
}

/// `ggml_vec_dot_q8_0_q8_0_generic`: both operands Q8_0.
pub fn vec_dot_q8_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in dot_blocks(["q8_0 vec_dot w", "q8_0 vec_dot a (q8_0)"], n, (w, QK, BLOCK_BYTES), (a, QK, BLOCK_BYTES)) {
        let mut sumi = 0i32;
        for (&p, &q) in x[2..].iter().zip(&y[2..]) {
            sumi += p as i8 as i32 * q as i8 as i32;
        }
        sumf += sumi as f32 * (read_f16(x, 0) * read_f16(y, 0));
    }
    sumf
}
