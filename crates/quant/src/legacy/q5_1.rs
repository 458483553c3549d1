//! Q5_1: `{ f16 d; f16 m; u8 qh[4]; u8 qs[16] }`, value = `d * q + m`.

use super::q5_high_bits;
use crate::layout::{
    assert_geometry, read_f16, read_u32, write_f16, BLOCK_Q5_1_SIZE, BLOCK_Q8_1_SIZE, QK5_1, QK8_1,
};

/// Elements per block.
pub const QK: usize = QK5_1;
/// Bytes per block.
pub const BLOCK_BYTES: usize = BLOCK_Q5_1_SIZE;

/// `dequantize_row_q5_1`.
pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    assert_geometry("q5_1", QK, BLOCK_BYTES, dst.len(), src.len());
    for (b, y) in src.chunks_exact(BLOCK_BYTES).zip(dst.chunks_exact_mut(QK)) {
        let d = read_f16(b, 0);
        let m = read_f16(b, 2);
        let qh = read_u32(b, 4);
        let qs = &b[8..];
        for j in 0..QK / 2 {
            let (xh_0, xh_1) = q5_high_bits(qh, j);
            let x0 = ((qs[j] & 0x0F) | xh_0) as f32;
            let x1 = ((qs[j] >> 4) | xh_1) as f32;
            y[j] = x0 * d + m;
            y[j + QK / 2] = x1 * d + m;
        }
    }
}

/// `quantize_row_q5_1_ref`: `d = (max - min) / 31`, `m = min`,
/// `q = trunc((x - min)/d + 0.5)` (5 bits kept).
pub fn quantize_row(src: &[f32], dst: &mut [u8]) {
    assert_geometry("q5_1", QK, BLOCK_BYTES, src.len(), dst.len());
    for (x, b) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(BLOCK_BYTES)) {
        let mut min = f32::MAX;
        let mut max = -f32::MAX;
        for &v in x {
            if v < min {
                min = v;
            }
            if v > max {
                max = v;
            }
        }
        let d = (max - min) / 31.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        write_f16(b, 0, d);
        write_f16(b, 2, min);
        let mut qh = 0u32;
        for j in 0..QK / 2 {
            let x0 = (x[j] - min) * id;
            let x1 = (x[QK / 2 + j] - min) * id;
            // ggml: `(uint8_t)(x0 + 0.5f)`, no clamp (the value is <= 31.5 by construction).
            let xi0 = (x0 + 0.5) as u8;
            let xi1 = (x1 + 0.5) as u8;
            b[8 + j] = (xi0 & 0x0F) | ((xi1 & 0x0F) << 4);
            qh |= (((xi0 & 0x10) >> 4) as u32) << j;
            qh |= (((xi1 & 0x10) >> 4) as u32) << (j + QK / 2);
        }
        b[4..8].copy_from_slice(&qh.to_le_bytes());
    }
}

/// `ggml_vec_dot_q5_1_q8_1_generic`: `w` is Q5_1, `a` is Q8_1.
pub fn vec_dot_q8_1(n: usize, w: &[u8], a: &[u8]) -> f32 {
    assert_geometry("q5_1 vec_dot w", QK, BLOCK_BYTES, n, w.len());
    assert_geometry("q5_1 vec_dot a (q8_1)", QK8_1, BLOCK_Q8_1_SIZE, n, a.len());
    let mut sumf = 0.0f32;
    for (x, y) in w
        .chunks_exact(BLOCK_BYTES)
        .zip(a.chunks_exact(BLOCK_Q8_1_SIZE))
    {
        let qh = read_u32(x, 4);
        let (xq, yq) = (&x[8..], &y[4..]);
        let mut sumi0 = 0i32;
        let mut sumi1 = 0i32;
        for j in 0..QK / 2 {
            let (xh_0, xh_1) = q5_high_bits(qh, j);
            let x0 = ((xq[j] & 0x0F) | xh_0) as i32;
            let x1 = ((xq[j] >> 4) | xh_1) as i32;
            sumi0 += x0 * yq[j] as i8 as i32;
            sumi1 += x1 * yq[j + QK / 2] as i8 as i32;
        }
        let sumi = sumi0 + sumi1;
        sumf += (read_f16(x, 0) * read_f16(y, 0)) * sumi as f32 + read_f16(x, 2) * read_f16(y, 2);
    }
    sumf
}
