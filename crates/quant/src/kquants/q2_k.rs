//! Q2_K: `{ u8 scales[16]; u8 qs[64]; f16 d; f16 dmin }`, 16 sub-blocks of 16.
//! Sub-block `j` value = `d * (scales[j] & 15) * q - dmin * (scales[j] >> 4)`,
//! `q` in 0..=3. Quant `l` of group `k` (0..4) in 128-element half `h` sits in
//! bits `2k..2k+2` of `qs[32h + l]`.

use super::{make_qkx2_quants, nearest_int, Qkx2Params};
use crate::layout::*;

crate::layout::block_geometry!(Q2_K);

/// `dequantize_row_q2_K`.
pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    for (b, y) in decode_blocks("q2_K", QK, BLOCK_BYTES, src, dst) {
        let d = read_f16(b, Q2_K_D_OFF);
        let min = read_f16(b, Q2_K_DMIN_OFF);
        let scales = &b[Q2_K_SCALES_OFF..Q2_K_SCALES_OFF + 16];
        for (j, (ys, &sc)) in y.chunks_exact_mut(16).zip(scales).enumerate() {
            let dl = d * (sc & 0xF) as f32;
            let ml = min * (sc >> 4) as f32;
            for (v, q) in ys.iter_mut().zip(sub_block(b, j)) {
                *v = dl * q as f32 - ml;
            }
        }
    }
}

/// The quants (0..=3) of sub-block `j`, elements `16j..16j + 16` of block `b`: group
/// `k = (j / 2) % 4` of half `j / 8`, bytes `16 * (j % 2)..` of that half's 32.
#[inline(always)]
fn sub_block(b: &[u8], j: usize) -> [u8; 16] {
    let (half, shift, part) = (j / 8, 2 * ((j / 2) % 4), j % 2);
    let off = Q2_K_QS_OFF + 32 * half + 16 * part;
    std::array::from_fn(|l| (b[off + l] >> shift) & 3)
}

/// `quantize_row_q2_K_ref`.
pub fn quantize_row(src: &[f32], dst: &mut [u8]) {
    const Q4SCALE: f32 = 15.0;
    let params = Qkx2Params { nmax: 3, rmin: -0.5, rdelta: 0.1, nstep: 15, use_mad: true };
    let mut l = [0u8; QK_K];
    let mut laux = [0u8; 16];
    let mut weights = [0f32; 16];
    let mut mins = [0f32; QK_K / 16];
    let mut scales = [0f32; QK_K / 16];

    for (x, y) in encode_blocks("q2_K", QK, BLOCK_BYTES, src, dst) {
        y.fill(0);
        let mut max_scale = 0.0f32;
        let mut max_min = 0.0f32;
        for j in 0..QK_K / 16 {
            let xs = &x[16 * j..16 * j + 16];
            for (w, &v) in weights.iter_mut().zip(xs) {
                *w = v.abs();
            }
            let (s, m) = make_qkx2_quants(xs, &weights, &mut l[16 * j..16 * j + 16], &mut laux, params);
            scales[j] = s;
            mins[j] = m;
            if s > max_scale {
                max_scale = s;
            }
            if m > max_min {
                max_min = m;
            }
        }

        let sc = &mut y[Q2_K_SCALES_OFF..Q2_K_SCALES_OFF + 16];
        if max_scale > 0.0 {
            let iscale = Q4SCALE / max_scale;
            for j in 0..QK_K / 16 {
                sc[j] = nearest_int(iscale * scales[j]) as u8;
            }
            write_f16(y, Q2_K_D_OFF, max_scale / Q4SCALE);
        } else {
            sc.fill(0);
            write_f16(y, Q2_K_D_OFF, 0.0);
        }
        let sc = &mut y[Q2_K_SCALES_OFF..Q2_K_SCALES_OFF + 16];
        if max_min > 0.0 {
            let iscale = Q4SCALE / max_min;
            for j in 0..QK_K / 16 {
                let lm = nearest_int(iscale * mins[j]);
                sc[j] |= (lm << 4) as u8;
            }
            write_f16(y, Q2_K_DMIN_OFF, max_min / Q4SCALE);
        } else {
            write_f16(y, Q2_K_DMIN_OFF, 0.0);
        }

        let dd = read_f16(y, Q2_K_D_OFF);
        let dmin = read_f16(y, Q2_K_DMIN_OFF);
        for j in 0..QK_K / 16 {
            let scj = y[Q2_K_SCALES_OFF + j];
            let d = dd * (scj & 0xF) as f32;
            if d == 0.0 {
                continue;
            }
            let dm = dmin * (scj >> 4) as f32;
            for ii in 0..16 {
                let q = nearest_int((x[16 * j + ii] + dm) / d);
                l[16 * j + ii] = q.clamp(0, 3) as u8;
            }
        }

        let qs = &mut y[Q2_K_QS_OFF..Q2_K_QS_OFF + QK_K / 4];
        for j in (0..QK_K).step_by(128) {
            for i in 0..32 {
                qs[j / 4 + i] = l[j + i] | (l[j + i + 32] << 2) | (l[j + i + 64] << 4) | (l[j + i + 96] << 6);
            }
        }
    }
}

/// `ggml_vec_dot_q2_K_q8_K_generic`: `w` is Q2_K, `a` is Q8_K (uses its `bsums`).
pub fn vec_dot_q8_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in dot_blocks(["q2_K vec_dot w", "q2_K vec_dot a (q8_K)"], n, (w, QK, BLOCK_BYTES), (a, QK_K, BLOCK_Q8_K_SIZE)) {
        let sc = &x[Q2_K_SCALES_OFF..Q2_K_SCALES_OFF + 16];
        let q8 = &y[Q8_K_QS_OFF..Q8_K_QS_OFF + QK_K];
        let yd = read_f32(y, Q8_K_D_OFF);

        let mut summs = 0i32;
        for (j, &s) in sc.iter().enumerate() {
            summs += read_i16(y, Q8_K_BSUMS_OFF + 2 * j) as i32 * (s >> 4) as i32;
        }
        let dall = yd * read_f16(x, Q2_K_D_OFF);
        let dmin = yd * read_f16(x, Q2_K_DMIN_OFF);

        let mut isum = 0i32;
        for (j, (a8, &s)) in q8.chunks_exact(16).zip(sc).enumerate() {
            let isuml: i32 = a8.iter().zip(sub_block(x, j)).map(|(&a, q)| a as i8 as i32 * q as i32).sum();
            isum += (s & 0xF) as i32 * isuml;
        }
        sumf += dall * isum as f32 - dmin * summs as f32;
    }
    sumf
}
