//! Q6_K: `{ u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d }`, 16 sub-blocks of 16.
//! Value = `d * scales[j] * (q - 32)`, `q` = 4 low bits from `ql` | 2 high bits from `qh`.
//! Within each 128-element half `h` (ql += 64h, qh += 32h), element `l + 32k`
//! (k = 0..4) uses `ql[l + 32*(k&1)]` nibble `k>>1` and `qh[l]` bits `2k..2k+2`.

use super::{make_qx_quants, nearest_int, Lanes, GROUP_MAX_EPS};
use crate::layout::*;

crate::layout::block_geometry!(Q6_K);

/// Signed quant (-32..=31) of element `idx` (0..256) of a block.
#[inline]
fn quant(b: &[u8], idx: usize) -> i32 {
    let half = idx / 128;
    let r = idx % 128;
    let k = r / 32;
    let l = r % 32;
    let qlb = b[Q6_K_QL_OFF + 64 * half + l + 32 * (k & 1)];
    let lo = if k < 2 { qlb & 0xF } else { qlb >> 4 };
    let hi = (b[Q6_K_QH_OFF + 32 * half + l] >> (2 * k)) & 3;
    (lo | (hi << 4)) as i32 - 32
}

/// `dequantize_row_q6_K`.
pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    for (b, y) in decode_blocks("q6_K", QK, BLOCK_BYTES, src, dst) {
        let d = read_f16(b, Q6_K_D_OFF);
        for (idx, o) in y.iter_mut().enumerate() {
            let sc = b[Q6_K_SCALES_OFF + idx / 16] as i8;
            *o = d * sc as f32 * quant(b, idx) as f32;
        }
    }
}

/// `quantize_row_q6_K_ref`.
pub fn quantize_row(src: &[f32], dst: &mut [u8]) {
    let mut l = [0i8; QK_K];
    let mut scales = [0f32; QK_K / 16];
    for (x, y) in encode_blocks("q6_K", QK, BLOCK_BYTES, src, dst) {
        let mut max_scale = 0.0f32;
        let mut max_abs_scale = 0.0f32;
        for ib in 0..QK_K / 16 {
            let scale = make_qx_quants(32, &x[16 * ib..16 * ib + 16], &mut l[16 * ib..16 * ib + 16], 1);
            scales[ib] = scale;
            let abs_scale = scale.abs();
            if abs_scale > max_abs_scale {
                max_abs_scale = abs_scale;
                max_scale = scale;
            }
        }

        if max_abs_scale < GROUP_MAX_EPS {
            y.fill(0);
            write_f16(y, Q6_K_D_OFF, 0.0);
            continue;
        }

        let iscale = -128.0 / max_scale;
        write_f16(y, Q6_K_D_OFF, 1.0 / iscale);
        for ib in 0..QK_K / 16 {
            y[Q6_K_SCALES_OFF + ib] = nearest_int(iscale * scales[ib]).min(127) as i8 as u8;
        }

        let dd = read_f16(y, Q6_K_D_OFF);
        for j in 0..QK_K / 16 {
            let d = dd * (y[Q6_K_SCALES_OFF + j] as i8) as f32;
            if d == 0.0 {
                continue;
            }
            for ii in 0..16 {
                let q = nearest_int(x[16 * j + ii] / d).clamp(-32, 31);
                l[16 * j + ii] = (q + 32) as i8;
            }
        }

        for (h, j) in (0..QK_K).step_by(128).enumerate() {
            for i in 0..32 {
                let lv = |k: usize| l[j + i + 32 * k] as u8;
                let (q1, q2, q3, q4) = (lv(0) & 0xF, lv(1) & 0xF, lv(2) & 0xF, lv(3) & 0xF);
                y[Q6_K_QL_OFF + 64 * h + i] = q1 | (q3 << 4);
                y[Q6_K_QL_OFF + 64 * h + i + 32] = q2 | (q4 << 4);
                y[Q6_K_QH_OFF + 32 * h + i] = (lv(0) >> 4) | ((lv(1) >> 4) << 2) | ((lv(2) >> 4) << 4) | ((lv(3) >> 4) << 6);
            }
        }
    }
}

/// `ggml_vec_dot_q6_K_q8_K_generic`: `w` is Q6_K, `a` is Q8_K.
pub fn vec_dot_q8_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut lanes = Lanes::default();
    for (x, y) in dot_blocks(["q6_K vec_dot w", "q6_K vec_dot a (q8_K)"], n, (w, QK, BLOCK_BYTES), (a, QK_K, BLOCK_Q8_K_SIZE)) {
        let q8 = &y[Q8_K_QS_OFF..Q8_K_QS_OFF + QK_K];
        let mut aux32 = [0i32; 8];
        for idx in 0..QK_K {
            let scale = x[Q6_K_SCALES_OFF + idx / 16] as i8 as i32;
            aux32[idx % 8] += scale * (q8[idx] as i8 as i32 * quant(x, idx));
        }
        let d = read_f16(x, Q6_K_D_OFF) * read_f32(y, Q8_K_D_OFF);
        lanes.add(d, &aux32);
    }
    lanes.sum_onto(0.0)
}
