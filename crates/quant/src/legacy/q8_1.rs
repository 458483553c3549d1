//! Q8_1: `{ f16 d; f16 s; i8 qs[32] }` with `s = d * sum(qs)`, value = `d * q`.
//! Activation partner of Q4_1/Q5_1 (the `s` term folds in their `m` offsets).
//! ggml has no `dequantize_row_q8_1`; ours is the obvious `d * q`.

use crate::layout::{decode_blocks, encode_blocks, write_f16};

crate::layout::block_geometry!(Q8_1);

/// `d * q` for each element (the `s` field is ignored).
pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    for (b, y) in decode_blocks("q8_1", QK, BLOCK_BYTES, src, dst) {
        super::dequantize_i8(b, 4, y);
    }
}

/// `quantize_row_q8_1_ref`: like Q8_0, plus `s = fp16(sum(q) * d)`.
pub fn quantize_row(src: &[f32], dst: &mut [u8]) {
    for (x, b) in encode_blocks("q8_1", QK, BLOCK_BYTES, src, dst) {
        let (d, sum) = super::quantize_i8(x, b, 4);
        write_f16(b, 2, sum as f32 * d);
    }
}
