//! Q5_0: `{ f16 d; u8 qh[4]; u8 qs[16] }`, value = `d * (q - 16)` where the
//! 5th bit of element `j` is bit `j` of the little-endian u32 `qh`.

use super::q5_high_bits;
use crate::layout::{
    assert_geometry, read_f16, read_u32, write_f16, BLOCK_Q5_0_SIZE, BLOCK_Q8_0_SIZE, QK5_0, QK8_0,
};

/// Elements per block.
pub const QK: usize = QK5_0;
/// Bytes per block.
pub const BLOCK_BYTES: usize = BLOCK_Q5_0_SIZE;

/// `dequantize_row_q5_0`.
pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    assert_geometry("q5_0", QK, BLOCK_BYTES, dst.len(), src.len());
    for (b, y) in src.chunks_exact(BLOCK_BYTES).zip(dst.chunks_exact_mut(QK)) {
        let d = read_f16(b, 0);
        let qh = read_u32(b, 2);
        let qs = &b[6..];
        for j in 0..QK / 2 {
            let (xh_0, xh_1) = q5_high_bits(qh, j);
            let x0 = ((qs[j] & 0x0F) | xh_0) as i32 - 16;
            let x1 = ((qs[j] >> 4) | xh_1) as i32 - 16;
            y[j] = x0 as f32 * d;
            y[j + QK / 2] = x1 as f32 * d;
        }
    }
}

/// `quantize_row_q5_0_ref`: `d = max / -16`, `q = min(31, trunc(x/d + 16.5))`.
pub fn quantize_row(src: &[f32], dst: &mut [u8]) {
    assert_geometry("q5_0", QK, BLOCK_BYTES, src.len(), dst.len());
    for (x, b) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(BLOCK_BYTES)) {
        let mut amax = 0.0f32;
        let mut max = 0.0f32;
        for &v in x {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        write_f16(b, 0, d);
        let mut qh = 0u32;
        for j in 0..QK / 2 {
            let x0 = x[j] * id;
            let x1 = x[QK / 2 + j] * id;
            let xi0 = ((x0 + 16.5) as i8).min(31) as u8;
            let xi1 = ((x1 + 16.5) as i8).min(31) as u8;
            b[6 + j] = (xi0 & 0x0F) | ((xi1 & 0x0F) << 4);
            qh |= (((xi0 & 0x10) >> 4) as u32) << j;
            qh |= (((xi1 & 0x10) >> 4) as u32) << (j + QK / 2);
        }
        b[2..6].copy_from_slice(&qh.to_le_bytes());
    }
}

/// `ggml_vec_dot_q5_0_q8_0_generic`: `w` is Q5_0, `a` is Q8_0.
pub fn vec_dot_q8_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    assert_geometry("q5_0 vec_dot w", QK, BLOCK_BYTES, n, w.len());
    assert_geometry("q5_0 vec_dot a (q8_0)", QK8_0, BLOCK_Q8_0_SIZE, n, a.len());
    let mut sumf = 0.0f32;
    for (x, y) in w
        .chunks_exact(BLOCK_BYTES)
        .zip(a.chunks_exact(BLOCK_Q8_0_SIZE))
    {
        let qh = read_u32(x, 2);
        let (xq, yq) = (&x[6..], &y[2..]);
        let mut sumi0 = 0i32;
        let mut sumi1 = 0i32;
        for j in 0..QK / 2 {
            let (xh_0, xh_1) = q5_high_bits(qh, j);
            let x0 = ((xq[j] & 0x0F) | xh_0) as i32 - 16;
            let x1 = ((xq[j] >> 4) | xh_1) as i32 - 16;
            sumi0 += x0 * yq[j] as i8 as i32;
            sumi1 += x1 * yq[j + QK / 2] as i8 as i32;
        }
        let sumi = sumi0 + sumi1;
        sumf += (read_f16(x, 0) * read_f16(y, 0)) * sumi as f32;
    }
    sumf
}
