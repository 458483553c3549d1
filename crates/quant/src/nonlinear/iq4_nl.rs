//! IQ4_NL: `{ f16 d; u8 qs[16] }`, value = `d * KVALUES_IQ4NL[nibble]`.

use super::{best_index_int8, KVALUES_IQ4NL};
use crate::kquants::GROUP_MAX_EPS;
use crate::layout::{decode_blocks, dot_blocks, encode_blocks, read_f16, write_f16, BLOCK_IQ4_NL_SIZE, BLOCK_Q8_0_SIZE, QK4_NL, QK8_0};
use crate::legacy::{dequantize_pairs, dot_pairs, q4_pair};
use crate::scan::inverse_or_zero;

/// Elements per block.
pub const QK: usize = QK4_NL;
/// Bytes per block.
pub const BLOCK_BYTES: usize = BLOCK_IQ4_NL_SIZE;

/// `dequantize_row_iq4_nl`.
pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    for (b, y) in decode_blocks("iq4_nl", QK, BLOCK_BYTES, src, dst) {
        let d = read_f16(b, 0);
        dequantize_pairs(y, |j| q4_pair(&b[2..], j), |q| d * KVALUES_IQ4NL[q as usize] as f32);
    }
}

/// `quantize_row_iq4_nl_ref` (ggml's `quantize_row_iq4_nl_impl` with no
/// importance weights and `ntry = -1`: one weighted least-squares scale fit,
/// no scale search). Deterministic but, like ggml, an all-zero block keeps the
/// quants of the previous block (its scale is 0, so the values are 0 anyway).
pub fn quantize_row(src: &[f32], dst: &mut [u8]) {
    quantize_row_ntry(src, dst, -1);
}

/// `quantize_iq4_nl` as used by `llama-quantize` without an imatrix
/// (`ntry = 7`: also tries 15 candidate scales). Better quality than
/// [`quantize_row`], different bytes.
pub fn quantize_row_search(src: &[f32], dst: &mut [u8]) {
    quantize_row_ntry(src, dst, 7);
}

/// `quantize_row_iq4_nl_impl(32, 32, ..., quant_weights = NULL, ntry)`.
pub fn quantize_row_ntry(src: &[f32], dst: &mut [u8], ntry: i32) {
    let values = &KVALUES_IQ4NL;
    let mut l = [0u8; QK]; // persists across blocks, as in ggml
    let mut weight = [0f32; QK];
    for (xb, y) in encode_blocks("iq4_nl", QK, BLOCK_BYTES, src, dst) {
        y.fill(0);
        for (w, &v) in weight.iter_mut().zip(xb) {
            *w = v * v;
        }
        let mut amax = 0.0f32;
        let mut max = 0.0f32;
        for &v in xb {
            let ax = v.abs();
            if ax > amax {
                amax = ax;
                max = v;
            }
        }
        let scale = if amax < GROUP_MAX_EPS {
            0.0
        } else {
            let v0 = values[0] as f32;
            let mut d = if ntry > 0 { -max / v0 } else { max / v0 };
            let mut id = 1.0 / d;
            let mut sumqx = 0.0f32;
            let mut sumq2 = 0.0f32;
            for j in 0..QK {
                let al = id * xb[j];
                let li = best_index_int8(values, al);
                l[j] = li as u8;
                let q = values[li] as f32;
                let w = weight[j];
                sumqx += w * q * xb[j];
                sumq2 += w * q * q;
            }
            d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
            let mut best = d * sumqx;
            for itry in -ntry..=ntry {
                id = (itry + values[0] as i32) as f32 / max;
                sumqx = 0.0;
                sumq2 = 0.0;
                for j in 0..QK {
                    let al = id * xb[j];
                    let li = best_index_int8(values, al);
                    let q = values[li] as f32;
                    let w = weight[j];
                    sumqx += w * q * xb[j];
                    sumq2 += w * q * q;
                }
                if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
                    d = sumqx / sumq2;
                    best = d * sumqx;
                }
            }
            d
        };
        write_f16(y, 0, scale);
        if ntry > 0 {
            let id = inverse_or_zero(scale);
            for j in 0..QK {
                l[j] = best_index_int8(values, id * xb[j]) as u8;
            }
        }
        for j in 0..QK / 2 {
            y[2 + j] = l[j] | (l[QK / 2 + j] << 4);
        }
    }
}

/// `ggml_vec_dot_iq4_nl_q8_0_generic`: `w` is IQ4_NL, `a` is Q8_0.
pub fn vec_dot_q8_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in dot_blocks(["iq4_nl vec_dot w", "iq4_nl vec_dot a (q8_0)"], n, (w, QK, BLOCK_BYTES), (a, QK8_0, BLOCK_Q8_0_SIZE)) {
        let d = read_f16(y, 0) * read_f16(x, 0);
        let sumi = dot_pairs(&y[2..], |j| {
            let (v0, v1) = q4_pair(&x[2..], j);
            (KVALUES_IQ4NL[v0 as usize] as i32, KVALUES_IQ4NL[v1 as usize] as i32)
        });
        sumf += d * sumi as f32;
    }
    sumf
}
