//! Q3_K: `{ u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d }`, 16 sub-blocks of 16.
//! Value = `d * (scale_j - 32) * (q - (hbit ? 0 : 4))` with 2 low bits in `qs`
//! (same packing as Q2_K), the high bit in `hmask`, 6-bit signed scales.

use super::{make_q3_quants, nearest_int, Lanes};
use crate::layout::*;

crate::layout::block_geometry!(Q3_K);

/// Unpack the sixteen 6-bit scales (still offset by +32) from the 12-byte field.
/// Low 4 bits: `s[j]` (j < 8) or `s[j-8] >> 4`; high 2 bits: `s[8 + j%4] >> 2*(j/4)`.
#[inline]
pub fn unpack_scales(s: &[u8]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (j, o) in out.iter_mut().enumerate() {
        let lo = if j < 8 { s[j] & 0xF } else { s[j - 8] >> 4 };
        let hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        *o = (lo | (hi << 4)) as i8;
    }
    out
}

/// Signed quant (-4..=3) of element `idx` (0..256) of a block.
#[inline]
fn quant(b: &[u8], idx: usize) -> i32 {
    let half = idx / 128;
    let r = idx % 128;
    let k = r / 32; // which 2-bit group
    let l = r % 32;
    let q = ((b[Q3_K_QS_OFF + 32 * half + l] >> (2 * k)) & 3) as i32;
    let m = 1u8 << (4 * half + k);
    let h = b[Q3_K_HMASK_OFF + l] & m;
    q - if h != 0 { 0 } else { 4 }
}

/// `dequantize_row_q3_K`.
pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    for (b, y) in decode_blocks("q3_K", QK, BLOCK_BYTES, src, dst) {
        let d_all = read_f16(b, Q3_K_D_OFF);
        let scales = unpack_scales(&b[Q3_K_SCALES_OFF..Q3_K_SCALES_OFF + 12]);
        for (j, yj) in y.chunks_exact_mut(16).enumerate() {
            let dl = d_all * (scales[j] as i32 - 32) as f32;
            for (ii, o) in yj.iter_mut().enumerate() {
                *o = dl * quant(b, 16 * j + ii) as f32;
            }
        }
    }
}

/// `quantize_row_q3_K_ref`.
pub fn quantize_row(src: &[f32], dst: &mut [u8]) {
    let mut l = [0i8; QK_K];
    let mut scales = [0f32; QK_K / 16];
    for (x, y) in encode_blocks("q3_K", QK, BLOCK_BYTES, src, dst) {
        let mut max_scale = 0.0f32;
        let mut amax = 0.0f32;
        for j in 0..QK_K / 16 {
            scales[j] = make_q3_quants(4, &x[16 * j..16 * j + 16], &mut l[16 * j..16 * j + 16], true);
            let scale = scales[j].abs();
            if scale > amax {
                amax = scale;
                max_scale = scales[j];
            }
        }

        y[Q3_K_SCALES_OFF..Q3_K_SCALES_OFF + 12].fill(0);
        if max_scale != 0.0 {
            let iscale = -32.0 / max_scale;
            let s = &mut y[Q3_K_SCALES_OFF..Q3_K_SCALES_OFF + 12];
            for j in 0..QK_K / 16 {
                // C: int8_t l = nearest_int(..); l = MAX(-32, MIN(31, l)) + 32;
                let lv = (nearest_int(iscale * scales[j]) as i8).clamp(-32, 31) + 32;
                let lv = lv as u8;
                if j < 8 {
                    s[j] = lv & 0xF;
                } else {
                    s[j - 8] |= (lv & 0xF) << 4;
                }
                s[j % 4 + 8] |= (lv >> 4) << (2 * (j / 4));
            }
            write_f16(y, Q3_K_D_OFF, 1.0 / iscale);
        } else {
            write_f16(y, Q3_K_D_OFF, 0.0);
        }

        let d_all = read_f16(y, Q3_K_D_OFF);
        let sc = unpack_scales(&y[Q3_K_SCALES_OFF..Q3_K_SCALES_OFF + 12]);
        for j in 0..QK_K / 16 {
            let d = d_all * (sc[j] as i32 - 32) as f32;
            if d == 0.0 {
                continue;
            }
            for ii in 0..16 {
                let q = nearest_int(x[16 * j + ii] / d).clamp(-4, 3);
                l[16 * j + ii] = (q + 4) as i8;
            }
        }

        y[Q3_K_HMASK_OFF..Q3_K_HMASK_OFF + QK_K / 8].fill(0);
        let mut m = 0usize;
        let mut hm = 1u8;
        for lj in l.iter_mut() {
            if *lj > 3 {
                y[Q3_K_HMASK_OFF + m] |= hm;
                *lj -= 4;
            }
            m += 1;
            if m == QK_K / 8 {
                m = 0;
                hm = hm.wrapping_shl(1);
            }
        }
        let qs = &mut y[Q3_K_QS_OFF..Q3_K_QS_OFF + QK_K / 4];
        for j in (0..QK_K).step_by(128) {
            for i in 0..32 {
                let v = l[j + i] as u8 | ((l[j + i + 32] as u8) << 2) | ((l[j + i + 64] as u8) << 4) | ((l[j + i + 96] as u8) << 6);
                qs[j / 4 + i] = v;
            }
        }
    }
}

/// `ggml_vec_dot_q3_K_q8_K_generic`: `w` is Q3_K, `a` is Q8_K. Keeps ggml's
/// 8 f32 partial sums (lane `l` gets elements `l mod 8`) and their final order.
pub fn vec_dot_q8_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut lanes = Lanes::default();
    for (x, y) in dot_blocks(["q3_K vec_dot w", "q3_K vec_dot a (q8_K)"], n, (w, QK, BLOCK_BYTES), (a, QK_K, BLOCK_Q8_K_SIZE)) {
        let q8 = &y[Q8_K_QS_OFF..Q8_K_QS_OFF + QK_K];
        let scales = unpack_scales(&x[Q3_K_SCALES_OFF..Q3_K_SCALES_OFF + 12]);
        let mut aux32 = [0i32; 8];
        for (j, &sj) in scales.iter().enumerate() {
            let s = sj as i32 - 32;
            for k in 0..16 {
                let idx = 16 * j + k;
                aux32[k % 8] += s * (q8[idx] as i8 as i32 * quant(x, idx));
            }
        }
        let d = read_f16(x, Q3_K_D_OFF) * read_f32(y, Q8_K_D_OFF);
        lanes.add(d, &aux32);
    }
    lanes.sum_onto(0.0)
}
