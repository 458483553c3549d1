//! Q8_1: `{ f16 d; f16 s; i8 qs[32] }` with `s = d * sum(qs)`, value = `d * q`.
//! Activation partner of Q4_1/Q5_1 (the `s` term folds in their `m` offsets).
//! ggml has no `dequantize_row_q8_1`; ours is the obvious `d * q`.

use crate::scan::absmax_c;
use crate::layout::{decode_blocks, encode_blocks, write_f16, BLOCK_Q8_1_SIZE, QK8_1};

/// Elements per block.
pub const QK: usize = QK8_1;
/// Bytes per block.
pub const BLOCK_BYTES: usize = BLOCK_Q8_1_SIZE;

/// `d * q` for each element (the `s` field is ignored).
pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    for (b, y) in decode_blocks("q8_1", QK, BLOCK_BYTES, src, dst) {
        super::dequantize_i8(b, 4, y);
    }
}

/// `quantize_row_q8_1_ref`: like Q8_0, plus `s = fp16(sum(q) * d)`.
pub fn quantize_row(src: &[f32], dst: &mut [u8]) {
    for (x, b) in encode_blocks("q8_1", QK, BLOCK_BYTES, src, dst) {
        let amax = absmax_c(x);
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        write_f16(b, 0, d);
        let mut sum = 0i32;
        for j in 0..QK / 2 {
            let q0 = (x[j] * id).round() as i8;
            let q1 = (x[QK / 2 + j] * id).round() as i8;
            b[4 + j] = q0 as u8;
            b[4 + QK / 2 + j] = q1 as u8;
            sum += q0 as i32 + q1 as i32;
        }
        write_f16(b, 2, sum as f32 * d);
    }
}
