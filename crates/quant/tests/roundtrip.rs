//! Quantize -> dequantize round trips on random data, with one table of
//! per-type relative-RMSE bounds (in the spirit of ggml's test-quantize-fns,
//! but relative to the data RMS so the bounds are scale free). The bounds are
//! ~1.2x the errors these reference algorithms actually achieve, so a broken
//! quantizer (wrong rounding, lost bit, bad scale search) fails them.

mod common;

use common::{normals, rng};
use quarrel_quant::{dequantize_to_vec, quantize_to_vec, QuantType};

/// Max relative RMSE `rms(dequant(quant(x)) - x) / rms(x)` for N(0,1) data.
fn max_rel_rmse(ty: QuantType) -> f64 {
    use QuantType::*;
    match ty {
        F32 => 0.0,
        F16 => 2.6e-4,
        BF16 => 2.0e-3,
        Q8_0 | Q8_1 => 6.5e-3,
        Q8_K => 8.7e-3,
        Q6_K => 2.15e-2,
        Q5_0 => 5.2e-2,
        Q5_1 => 4.6e-2,
        Q5_K => 4.4e-2,
        Q4_0 => 1.03e-1,
        Q4_1 => 9.4e-2,
        Q4_K => 8.5e-2,
        IQ4_NL => 9.6e-2,
        MXFP4 => 1.38e-1,
        Q3_K => 1.8e-1,
        Q2_K => 3.5e-1,
    }
}

fn rel_rmse(x: &[f32], y: &[f32]) -> f64 {
    let (mut num, mut den) = (0f64, 0f64);
    for (a, b) in x.iter().zip(y) {
        num += ((a - b) as f64).powi(2);
        den += (*a as f64).powi(2);
    }
    (num / den).sqrt()
}

#[test]
fn round_trip_error_within_bounds() {
    let mut report = String::new();
    let mut failures = Vec::new();
    for &ty in QuantType::ALL {
        // 16 K-quant super-blocks / 128 small blocks.
        let n = 4096;
        let mut r = rng(0xC0FFEE ^ ty.ggml_id() as u64);
        let x = normals(&mut r, n);
        let q = quantize_to_vec(ty, &x).unwrap();
        let y = dequantize_to_vec(ty, &q, n).unwrap();
        let err = rel_rmse(&x, &y);
        let bound = max_rel_rmse(ty);
        report += &format!("{:7} rel_rmse {err:.5} (bound {bound:.5})\n", ty.name());
        if err > bound || !err.is_finite() {
            failures.push(format!("{ty}: {err} > {bound}"));
        }
        // Scale invariance sanity: a block-aligned scaled copy (x * 2^k) is
        // reproduced with the same relative error (power-of-two scaling is exact
        // for all scale encodings except where f16 scales would underflow).
        let xs: Vec<f32> = x.iter().map(|v| v * 8.0).collect();
        let ys = dequantize_to_vec(ty, &quantize_to_vec(ty, &xs).unwrap(), n).unwrap();
        let err_s = rel_rmse(&xs, &ys);
        if (err_s - err).abs() > 1e-3 * bound.max(1e-6) + 1e-9 {
            failures.push(format!("{ty}: scaled error {err_s} != {err}"));
        }
    }
    println!("{report}");
    assert!(failures.is_empty(), "{failures:#?}\n{report}");
}

#[test]
fn zero_and_constant_blocks_round_trip() {
    for &ty in QuantType::ALL {
        let n = ty.block_size().max(256) * 2;
        let zeros = vec![0f32; n];
        let y = dequantize_to_vec(ty, &quantize_to_vec(ty, &zeros).unwrap(), n).unwrap();
        assert!(y.iter().all(|v| *v == 0.0), "{ty}: zeros not preserved");

        let c = vec![0.75f32; n];
        let y = dequantize_to_vec(ty, &quantize_to_vec(ty, &c).unwrap(), n).unwrap();
        let tol = 2.0 * max_rel_rmse(ty) * 0.75 + 1e-6;
        for v in &y {
            assert!((v - 0.75).abs() <= tol as f32, "{ty}: constant block -> {v}");
        }
    }
}

#[test]
fn quantize_is_deterministic_and_blockwise() {
    // Quantizing a row equals quantizing each block separately (no cross-block
    // state for non-degenerate data; IQ4_NL's all-zero-block quirk is not hit here).
    for &ty in QuantType::ALL {
        let bs = ty.block_size().max(32);
        let n = bs * 3;
        let mut r = rng(7 + ty.ggml_id() as u64);
        let x = normals(&mut r, n);
        let whole = quantize_to_vec(ty, &x).unwrap();
        assert_eq!(whole, quantize_to_vec(ty, &x).unwrap());
        let mut parts = Vec::new();
        for c in x.chunks(bs) {
            parts.extend(quantize_to_vec(ty, c).unwrap());
        }
        assert_eq!(whole, parts, "{ty}");
    }
}
