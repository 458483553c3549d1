//! Q4_0: `{ f16 d; u8 qs[16] }`, value = `d * (nibble - 8)`.
//! Element `j` (0..16) is the low nibble of `qs[j]`, element `j + 16` the high nibble.

use super::{dequantize_pairs, dot_pairs, q4_pair, quantize_pairs, symmetric_scale};
use crate::layout::{decode_blocks, dot_blocks, encode_blocks, read_f16, write_f16, BLOCK_Q8_0_SIZE, QK8_0};
use crate::scan::{inverse_or_zero, signed_absmax};

crate::layout::block_geometry!(Q4_0);

/// `dequantize_row_q4_0`. Panics unless `src` holds exactly `dst.len()` elements.
pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    for (b, y) in decode_blocks("q4_0", QK, BLOCK_BYTES, src, dst) {
        let d = read_f16(b, 0);
        dequantize_pairs(y, |j| q4_pair(&b[2..], j), |q| (q as i32 - 8) as f32 * d);
    }
}

/// `quantize_row_q4_0_ref`: `d = max / -8` where `max` is the signed value of
/// largest magnitude; `q = min(15, trunc(x/d + 8.5))`.
pub fn quantize_row(src: &[f32], dst: &mut [u8]) {
    for (x, b) in encode_blocks("q4_0", QK, BLOCK_BYTES, src, dst) {
        let id = symmetric_scale(x, b, 8.0);
        let q = |v: f32| ((v * id + 8.5) as i8).min(15) as u8;
        quantize_pairs(x, q, |j, xi0, xi1| b[2 + j] = xi0 | (xi1 << 4));
    }
}

/// Q4_0 blocks with the scale chosen for the least squared error (same format as
/// [`quantize_row`], which maps the largest magnitude to -8 and so can waste a level):
/// candidate scales map the largest magnitude to ±4 .. ±10 levels (clamping beyond), the
/// scale is rounded to f16 as stored, and the block with the smallest error is kept. For
/// values Quarrel quantizes itself (the KV cache), where llama.cpp parity is not at stake.
pub fn quantize_row_mse(src: &[f32], dst: &mut [u8]) {
    for (x, b) in encode_blocks("q4_0", QK, BLOCK_BYTES, src, dst) {
        let (_, max) = signed_absmax(x);
        let (mut best_d, mut best_err) = (0.0f32, f32::INFINITY);
        if max != 0.0 {
            for sign in [-1.0f32, 1.0] {
                for step in 0..=24 {
                    let levels = 4.0 + step as f32 * 0.25;
                    let d = half::f16::from_f32(max / (sign * levels)).to_f32();
                    if d == 0.0 || !d.is_finite() {
                        continue;
                    }
                    let id = 1.0 / d;
                    let err: f32 = x
                        .iter()
                        .map(|&v| {
                            let q = (v * id).round().clamp(-8.0, 7.0);
                            let e = v - q * d;
                            e * e
                        })
                        .sum();
                    if err < best_err {
                        (best_d, best_err) = (d, err);
                    }
                }
            }
        }
        let id = inverse_or_zero(best_d);
        write_f16(b, 0, best_d);
        let q = |v: f32| ((v * id).round().clamp(-8.0, 7.0) as i32 + 8) as u8;
        quantize_pairs(x, q, |j, xi0, xi1| b[2 + j] = xi0 | (xi1 << 4));
    }
}

/// `ggml_vec_dot_q4_0_q8_0_generic`: `w` is Q4_0, `a` is Q8_0, `n` elements.
pub fn vec_dot_q8_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in dot_blocks(["q4_0 vec_dot w", "q4_0 vec_dot a (q8_0)"], n, (w, QK, BLOCK_BYTES), (a, QK8_0, BLOCK_Q8_0_SIZE)) {
        let sumi = dot_pairs(&y[2..], |j| {
            let (v0, v1) = q4_pair(&x[2..], j);
            (v0 as i32 - 8, v1 as i32 - 8)
        });
        sumf += sumi as f32 * read_f16(x, 0) * read_f16(y, 0);
    }
    sumf
}

#[cfg(test)]
mod mse_tests {
    use super::*;

    fn sse(x: &[f32], b: &[u8]) -> f32 {
        let mut y = vec![0f32; x.len()];
        dequantize_row(b, &mut y);
        x.iter().zip(&y).map(|(a, b)| (a - b) * (a - b)).sum()
    }

    #[test]
    fn least_squares_scale_never_loses_to_the_reference_and_usually_wins() {
        let mut s = 0x1234_5678u32;
        let mut rnd = || {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        };
        let (mut total_ref, mut total_mse) = (0f32, 0f32);
        for blk in 0..500 {
            // Gaussian-ish values, some blocks with an outlier, one all-zero block
            let mut x: Vec<f32> = (0..QK).map(|_| (0..4).map(|_| rnd()).sum::<f32>()).collect();
            if blk % 7 == 0 {
                x[blk % QK] *= 20.0;
            }
            if blk == 3 {
                x.iter_mut().for_each(|v| *v = 0.0);
            }
            let (mut a, mut b) = ([0u8; BLOCK_BYTES], [0u8; BLOCK_BYTES]);
            quantize_row(&x, &mut a);
            quantize_row_mse(&x, &mut b);
            let (ea, eb) = (sse(&x, &a), sse(&x, &b));
            assert!(eb <= ea * (1.0 + 1e-5) + 1e-12, "block {blk}: {eb} > {ea}");
            if blk % 7 != 0 {
                total_ref += ea;
                total_mse += eb;
            }
        }
        // on blocks without an outlier the search finds clearly better scales
        eprintln!("no-outlier blocks: mse {total_mse} ref {total_ref}");
        assert!(total_mse < 0.95 * total_ref, "mse {total_mse} vs ref {total_ref}");
    }
}
