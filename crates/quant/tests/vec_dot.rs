//! `vec_dot(w, quantize(vec_dot_type, a))` against f64 references:
//! * tight: vs `dequant(w) . dequant(quantize(a))` — checks the integer /
//!   scale bookkeeping of each kernel (only f32 rounding differs; for Q4_1/Q5_1
//!   the reference uses Q8_1's stored f16 `s = d * sum(q)` like the kernel);
//! * loose: vs `dequant(w) . a` — the activation quantization error must stay
//!   within a few standard deviations of its expected size.

mod common;

use common::{normals, rng};
use quarrel_quant::{dequantize_to_vec, fp16_to_f32, quantize_to_vec, vec_dot, QuantError, QuantType};

/// Typical relative RMSE of quantizing N(0,1) activations to `ty`.
fn act_rel_rmse(ty: QuantType) -> f64 {
    use QuantType::*;
    match ty {
        F32 => 0.0,
        F16 => 2.2e-4,
        BF16 => 1.7e-3,
        Q8_0 | Q8_1 => 5.5e-3,
        Q8_K => 7.3e-3,
        other => panic!("{other} is not an activation type"),
    }
}

fn dot64(x: &[f32], y: &[f32]) -> f64 {
    x.iter().zip(y).map(|(a, b)| *a as f64 * *b as f64).sum()
}

#[test]
fn vec_dot_matches_dequantized_reference() {
    let mut report = String::new();
    for &ty in QuantType::ALL {
        let vdt = ty.vec_dot_type();
        if matches!(ty, QuantType::Q8_1 | QuantType::Q8_K) {
            assert!(matches!(vec_dot(ty, &[], &[], 0), Err(QuantError::Unsupported { .. })));
            continue;
        }
        for (trial, n) in [256usize, 1024, 4096].into_iter().enumerate() {
            let mut r = rng(((ty.ggml_id() as u64) << 8) | trial as u64);
            // weights with a per-row offset so Q4_1/Q5_1 mins and K-quant mins matter
            let x: Vec<f32> = normals(&mut r, n).into_iter().map(|v| 0.02 * v + 0.003).collect();
            let a = normals(&mut r, n);
            let w = quantize_to_vec(ty, &x).unwrap();
            let aq = quantize_to_vec(vdt, &a).unwrap();
            let got = vec_dot(ty, &w, &aq, n).unwrap() as f64;

            let wd = dequantize_to_vec(ty, &w, n).unwrap();
            let ad = dequantize_to_vec(vdt, &aq, n).unwrap();
            let mut exact = dot64(&wd, &ad);
            if matches!(ty, QuantType::Q4_1 | QuantType::Q5_1) {
                // The kernel applies the weight min `m` through Q8_1's stored
                // s = fp16(d * sum(q)) instead of the exact block sum: use it too.
                let (ws, as_) = (ty.type_size(), vdt.type_size());
                for (b, (wb, ab)) in w.chunks_exact(ws).zip(aq.chunks_exact(as_)).enumerate() {
                    let m = fp16_to_f32(u16::from_le_bytes([wb[2], wb[3]])) as f64;
                    let stored_s = fp16_to_f32(u16::from_le_bytes([ab[2], ab[3]])) as f64;
                    let true_s: f64 = ad[32 * b..32 * b + 32].iter().map(|v| *v as f64).sum();
                    exact += m * (stored_s - true_s);
                }
            }
            let abs_sum: f64 = wd.iter().zip(&ad).map(|(p, q)| (*p as f64 * *q as f64).abs()).sum();
            // f32 accumulation: ~1e-7 relative in practice; one wrong quant
            // (|w_i a_i| ~ 1e-2) would exceed this by orders of magnitude.
            let tight = 1e-6 * abs_sum + 1e-12;
            assert!((got - exact).abs() <= tight, "{ty} n={n}: vec_dot {got} vs dequantized dot {exact} (tol {tight})");

            let reference = dot64(&wd, &a);
            let w_norm = dot64(&wd, &wd).sqrt();
            let a_rms = (dot64(&a, &a) / n as f64).sqrt();
            let loose = 5.0 * act_rel_rmse(vdt) * a_rms * w_norm + 1e-6 * abs_sum + 1e-9;
            assert!((got - reference).abs() <= loose, "{ty} n={n}: vec_dot {got} vs f32-activation dot {reference} (tol {loose})");
            if trial == 2 {
                report += &format!(
                    "{:7} x {:5}: |d_exact| {:.2e} (tol {:.1e}), |d_ref| {:.2e} (tol {:.1e})\n",
                    ty.name(),
                    vdt.name(),
                    (got - exact).abs(),
                    tight,
                    (got - reference).abs(),
                    loose
                );
            }
        }
    }
    println!("{report}");
}

#[test]
fn float_dots_accumulate_in_f64() {
    // 1e8 + 1 - 1e8 style cancellation survives thanks to the f64 accumulator.
    let x = [1.0e8f32, 1.0, -1.0e8, 1.0];
    let y = [1.0f32; 4];
    let xb = quantize_to_vec(QuantType::F32, &x).unwrap();
    let yb = quantize_to_vec(QuantType::F32, &y).unwrap();
    assert_eq!(vec_dot(QuantType::F32, &xb, &yb, 4).unwrap(), 2.0);
}
