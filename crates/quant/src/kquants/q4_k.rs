//! Q4_K: `{ f16 d; f16 dmin; u8 scales[12]; u8 qs[128] }`, 8 sub-blocks of 32.
//! Sub-block `j` value = `d * sc_j * q - dmin * m_j` (6-bit `sc_j`, `m_j`, see
//! [`super::get_scale_min_k4`]). Sub-blocks `2i` / `2i+1` are the low / high
//! nibbles of `qs[32i..32i+32]`.

use super::{get_scale_min_k4, make_qkx2_quants, nearest_int, pack_scale_min_k4, rms_plus_abs_weights, scaled_pair_k4, Lanes, Qkx2Params};
use crate::layout::*;

crate::layout::block_geometry!(Q4_K);

/// `dequantize_row_q4_K`.
pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    for (b, y) in decode_blocks("q4_K", QK, BLOCK_BYTES, src, dst) {
        let d = read_f16(b, Q4_K_D_OFF);
        let min = read_f16(b, Q4_K_DMIN_OFF);
        let scales = &b[Q4_K_SCALES_OFF..Q4_K_SCALES_OFF + K_SCALE_SIZE];
        for (i, y64) in y.chunks_exact_mut(64).enumerate() {
            let q = &b[Q4_K_QS_OFF + 32 * i..Q4_K_QS_OFF + 32 * i + 32];
            let [(d1, m1), (d2, m2)] = scaled_pair_k4(i, scales, d, min);
            for l in 0..32 {
                y64[l] = d1 * (q[l] & 0xF) as f32 - m1;
                y64[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
            }
        }
    }
}

/// The part of the Q4_K / Q5_K reference quantizers they share, for one block `x`: the
/// (scale, min) search of each 32-element sub-block, then
/// [`finish_scales_and_requantize`]. Writes `d`, `dmin` and the scales into `y` and leaves
/// the quants (`0..=params.nmax`) in `l`, for the caller to pack.
pub(crate) fn quantize_scales_and_mins(x: &[f32], params: Qkx2Params, l: &mut [u8; QK_K], y: &mut [u8]) {
    let mut laux = [0u8; 32];
    let mut weights = [0f32; 32];
    let mut mins = [0f32; 8];
    let mut scales = [0f32; 8];
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        rms_plus_abs_weights(xs, &mut weights);
        let (s, m) = make_qkx2_quants(xs, &weights, &mut l[32 * j..32 * j + 32], &mut laux, params);
        scales[j] = s;
        mins[j] = m;
    }
    finish_scales_and_requantize(x, &scales, &mins, params.nmax, l, y);
}

/// Quantize the 8 sub-block (scale, min) pairs to 6 bits against their maxima, write
/// `d`, `dmin` and the packed scales, then re-quantize every element against
/// the rounded scales into `l` (values `0..=nmax`).
fn finish_scales_and_requantize(x: &[f32], scales: &[f32; 8], mins: &[f32; 8], nmax: i32, l: &mut [u8; QK_K], y: &mut [u8]) {
    let mut max_scale = 0.0f32;
    let mut max_min = 0.0f32;
    for j in 0..8 {
        if scales[j] > max_scale {
            max_scale = scales[j];
        }
        if mins[j] > max_min {
            max_min = mins[j];
        }
    }
    let inv_scale = if max_scale > 0.0 { 63.0 / max_scale } else { 0.0 };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut ls = [0u8; 8];
    let mut lm = [0u8; 8];
    for j in 0..8 {
        // C: uint8_t ls = nearest_int(..); ls = MIN(63, ls);
        ls[j] = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        lm[j] = (nearest_int(inv_min * mins[j]) as u8).min(63);
    }
    // (scales field at offset 4 in both Q4_K and Q5_K)
    pack_scale_min_k4(&ls, &lm, &mut y[4..4 + K_SCALE_SIZE]);
    write_f16(y, 0, max_scale / 63.0);
    write_f16(y, 2, max_min / 63.0);

    let dd = read_f16(y, 0);
    let dmin = read_f16(y, 2);
    for j in 0..8 {
        let (sc, m) = get_scale_min_k4(j, &y[4..4 + K_SCALE_SIZE]);
        let d = dd * sc as f32;
        if d == 0.0 {
            continue;
        }
        let dm = dmin * m as f32;
        for ii in 0..32 {
            let q = nearest_int((x[32 * j + ii] + dm) / d);
            l[32 * j + ii] = q.clamp(0, nmax) as u8;
        }
    }
}

/// `quantize_row_q4_K_ref`.
pub fn quantize_row(src: &[f32], dst: &mut [u8]) {
    let params = Qkx2Params { nmax: 15, rmin: -1.0, rdelta: 0.1, nstep: 20, use_mad: false };
    let mut l = [0u8; QK_K];
    for (x, y) in encode_blocks("q4_K", QK, BLOCK_BYTES, src, dst) {
        quantize_scales_and_mins(x, params, &mut l, y);
        let qs = &mut y[Q4_K_QS_OFF..Q4_K_QS_OFF + QK_K / 2];
        for (i, j) in (0..QK_K).step_by(64).enumerate() {
            for k in 0..32 {
                qs[32 * i + k] = l[j + k] | (l[j + k + 32] << 4);
            }
        }
    }
}

/// Unpack the 8 scales and 8 mins (as ggml's `utmp` trick in the dot product does).
#[inline]
pub(crate) fn scales_and_mins(s: &[u8]) -> ([i32; 8], [i32; 8]) {
    let mut sc = [0i32; 8];
    let mut mn = [0i32; 8];
    for j in 0..8 {
        let (a, b) = get_scale_min_k4(j, s);
        sc[j] = a as i32;
        mn[j] = b as i32;
    }
    (sc, mn)
}

/// Common body of the Q4_K / Q5_K dot products once the unsigned quants of
/// one block are expanded into `aux8`: returns `(aux32 lanes, sumi of mins)`.
#[inline]
fn k_block_dot(aux8: &[i32; QK_K], q8: &[u8], bsums_block: &[u8], scales: &[u8]) -> ([i32; 8], i32) {
    let (sc, mn) = scales_and_mins(scales);
    let mut sumi = 0i32;
    for j in 0..QK_K / 16 {
        sumi += read_i16(bsums_block, 2 * j) as i32 * mn[j / 2];
    }
    let mut aux32 = [0i32; 8];
    for (idx, &a) in aux8.iter().enumerate() {
        aux32[idx % 8] += sc[idx / 32] * (q8[idx] as i8 as i32 * a);
    }
    (aux32, sumi)
}

/// `ggml_vec_dot_q4_K_q8_K_generic`: `w` is Q4_K, `a` is Q8_K (uses `bsums`).
pub fn vec_dot_q8_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let blocks = dot_blocks(["q4_K vec_dot w", "q4_K vec_dot a (q8_K)"], n, (w, QK, BLOCK_BYTES), (a, QK_K, BLOCK_Q8_K_SIZE));
    vec_dot_scale_min(blocks, |x, aux8| {
        let q4 = &x[Q4_K_QS_OFF..Q4_K_QS_OFF + QK_K / 2];
        for j in 0..QK_K / 64 {
            for l in 0..32 {
                aux8[64 * j + l] = (q4[32 * j + l] & 0xF) as i32;
                aux8[64 * j + 32 + l] = (q4[32 * j + l] >> 4) as i32;
            }
        }
    })
}

// Q5_K keeps `d`, `dmin` and the scales where Q4_K does: one dot-product body serves both.
const _: () = assert!(Q5_K_D_OFF == Q4_K_D_OFF && Q5_K_DMIN_OFF == Q4_K_DMIN_OFF && Q5_K_SCALES_OFF == Q4_K_SCALES_OFF);

/// The Q4_K / Q5_K dot product against Q8_K once `unpack` has expanded a weight block's
/// unsigned quants into `aux8` (ggml's order: 8 lanes of scaled sums, minus `dmin` times
/// the mins against `bsums`).
pub(crate) fn vec_dot_scale_min<'a>(blocks: impl Iterator<Item = (&'a [u8], &'a [u8])>, unpack: impl Fn(&[u8], &mut [i32; QK_K])) -> f32 {
    let mut lanes = Lanes::default();
    let mut sumf = 0.0f32;
    let mut aux8 = [0i32; QK_K];
    for (x, y) in blocks {
        unpack(x, &mut aux8);
        let (aux32, sumi) = k_block_dot(
            &aux8,
            &y[Q8_K_QS_OFF..Q8_K_QS_OFF + QK_K],
            &y[Q8_K_BSUMS_OFF..],
            &x[Q4_K_SCALES_OFF..Q4_K_SCALES_OFF + K_SCALE_SIZE],
        );
        let yd = read_f32(y, Q8_K_D_OFF);
        let d = read_f16(x, Q4_K_D_OFF) * yd;
        lanes.add(d, &aux32);
        let dmin = read_f16(x, Q4_K_DMIN_OFF) * yd;
        sumf -= dmin * sumi as f32;
    }
    lanes.sum_onto(sumf)
}
