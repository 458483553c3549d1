//! Every SIMD kernel, at every SIMD level this CPU supports, against its reference twin in
//! quarrel-quant, on random data (dot products, four-row dot products, quantizers).

use proptest::prelude::*;
use quarrel_core::QuantType;
use quarrel_cpu::simd::{self, Level};

mod common;
use common::random_row;

/// SIMD levels to test: every supported one above Scalar.
fn levels() -> Vec<Level> {
    simd::available_levels().into_iter().filter(|&l| l != Level::Scalar).collect()
}

fn quantized(ty: QuantType, x: &[f32]) -> Vec<u8> {
    let mut q = vec![0u8; ty.row_bytes(x.len()).unwrap()];
    quarrel_quant::quantize(ty, x, &mut q).unwrap();
    q
}

/// Integer block sums are exact; only the float accumulation order differs.
fn tolerance(r: f32, n: usize) -> f32 {
    1e-5 * (1.0 + r.abs()) + 1e-4 * (n as f32).sqrt()
}

fn check(ty: QuantType, n_blocks: usize, seed: u64) -> Result<(), TestCaseError> {
    let n = n_blocks * ty.block_size();
    let w = random_row(seed, n);
    let a = random_row(seed ^ 0xABCDEF, n);
    let wq = quantized(ty, &w);
    let aq = quantized(ty.vec_dot_type(), &a);
    let r = simd::reference_dot(ty, n, &wq, &aq);
    for level in levels() {
        let Some(fast) = simd::dot_fn_for(ty, level) else { continue };
        let f = fast(n, &wq, &aq);
        prop_assert!((r - f).abs() <= tolerance(r, n), "{} at {level:?}: reference {r} vs simd {f} (n = {n})", ty.name());
    }
    Ok(())
}

fn check_dot4(ty: QuantType, n_blocks: usize, seed: u64) -> Result<(), TestCaseError> {
    let n = n_blocks * ty.block_size();
    let a = random_row(seed ^ 0x5555, n);
    let aq = quantized(ty.vec_dot_type(), &a);
    let wq: Vec<Vec<u8>> = (0..4).map(|r| quantized(ty, &random_row(seed.wrapping_add(r), n))).collect();
    for level in levels() {
        let Some(dot4) = simd::dot4_fn_for(ty, level) else { continue };
        let got = dot4(n, [&wq[0], &wq[1], &wq[2], &wq[3]], &aq);
        for r in 0..4 {
            let want = simd::reference_dot(ty, n, &wq[r], &aq);
            prop_assert!(
                (want - got[r]).abs() <= tolerance(want, n),
                "{} dot4 row {r} at {level:?}: reference {want} vs simd {} (n = {n})",
                ty.name(),
                got[r]
            );
        }
    }
    Ok(())
}

/// Both quantizer flavours against their scalar twins: `quantize_row_fn*` against
/// `quarrel_quant::quantize`, `quantize_row_fn_ggml_x86*` against `actquant::quantize_row`.
fn check_quantize(ty: QuantType, x: &[f32]) -> Result<(), TestCaseError> {
    let want = quantized(ty, x);
    let mut want_x86 = vec![0u8; want.len()];
    quarrel_cpu::actquant::quantize_row(ty, x, &mut want_x86).unwrap();
    for level in levels() {
        let Some(q) = simd::quantize_row_fn_for(ty, level) else { continue };
        let mut got = vec![0xAAu8; want.len()];
        q(x, &mut got);
        prop_assert!(want == got, "{} quantizer at {level:?} differs from the reference (n = {})", ty.name(), x.len());
        let Some(q) = simd::quantize_row_fn_ggml_x86_for(ty, level) else { continue };
        let mut got = vec![0xAAu8; want.len()];
        q(x, &mut got);
        prop_assert!(want_x86 == got, "{} ggml-x86 quantizer at {level:?} differs from actquant (n = {})", ty.name(), x.len());
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test]
    fn simd_dot_matches_reference(n_blocks in 1usize..40, seed in any::<u64>()) {
        for &ty in QuantType::ALL {
            check(ty, n_blocks, seed)?;
        }
    }

    #[test]
    fn simd_dot4_matches_reference(n_blocks in 1usize..24, seed in any::<u64>()) {
        for &ty in QuantType::ALL {
            check_dot4(ty, n_blocks, seed)?;
        }
    }

    /// Float types have block size 1: also check long rows with ragged tails.
    #[test]
    fn simd_float_dot_long_rows(n in 1usize..3000, seed in any::<u64>()) {
        for ty in [QuantType::F32, QuantType::F16, QuantType::BF16] {
            check(ty, n, seed)?;
        }
    }

    #[test]
    fn simd_quantizers_match_reference(n_blocks in 1usize..12, seed in any::<u64>(), scale_exp in -20i32..20) {
        let scale = 2f32.powi(scale_exp);
        for ty in [QuantType::Q8_0, QuantType::Q8_1, QuantType::Q8_K] {
            let n = n_blocks * ty.block_size();
            let x: Vec<f32> = random_row(seed, n).iter().map(|v| v * scale).collect();
            check_quantize(ty, &x)?;
        }
    }
}

/// Rounding ties, zero blocks, equal-magnitude extremes of opposite sign, tiny values.
#[test]
fn simd_quantizers_edge_cases() {
    for ty in [QuantType::Q8_0, QuantType::Q8_1, QuantType::Q8_K] {
        let bs = ty.block_size();
        let mut rows: Vec<Vec<f32>> = vec![];
        rows.push(vec![0.0; bs * 2]);
        rows.push((0..bs * 2).map(|i| if i % 3 == 0 { -0.0 } else { 0.0 }).collect());
        // exact .5 ties after scaling by 127 / amax = 1: values k + 0.5
        // amax = 127 makes the scale 1, so the k + 0.5 values are exact rounding ties
        rows.push((0..bs * 2).map(|i| if i % bs == 0 { -127.0 } else { (i % 41) as f32 - 20.5 }).collect());
        rows.push((0..bs * 2).map(|i| if i % bs == 0 { 127.0 } else { (i % 37) as f32 - 18.5 }).collect());
        let mut r: Vec<f32> = (0..bs).map(|i| ((i % 17) as f32 - 8.0) * 0.25).collect();
        r[3] = 9.0;
        r[bs - 1] = -9.0; // same magnitude as the earlier +9: the first one's sign wins
        rows.push(r.clone());
        r[3] = -9.0;
        r[bs - 1] = 9.0;
        rows.push(r);
        rows.push((0..bs).map(|i| (i as f32 + 1.0) * 1e-30).collect());
        rows.push((0..bs).map(|i| (i as f32 - 7.0) * 1e30).collect());
        rows.push((0..bs).map(|i| ((i * 7919) % 255) as f32 - 127.0).collect());
        for x in rows {
            assert_eq!(x.len() % bs, 0);
            check_quantize(ty, &x).unwrap();
        }
    }
}

#[test]
fn every_type_has_a_kernel_at_every_simd_level() {
    for level in levels() {
        for &ty in QuantType::ALL {
            if matches!(ty, QuantType::Q8_1 | QuantType::Q8_K) {
                continue; // activation-only types: no vec_dot
            }
            assert!(simd::dot_fn_for(ty, level).is_some(), "{} has no kernel at {level:?}", ty.name());
        }
        for ty in [QuantType::Q8_0, QuantType::Q8_1, QuantType::Q8_K] {
            assert!(simd::quantize_row_fn_for(ty, level).is_some(), "{} has no quantizer at {level:?}", ty.name());
            assert!(simd::quantize_row_fn_ggml_x86_for(ty, level).is_some(), "{}: no ggml-x86 quantizer", ty.name());
        }
    }
}

#[test]
fn some_kernel_is_selected_on_x86() {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && std::arch::is_x86_feature_detected!("f16c")
        && quarrel_cpu::tuning::get().simd_cap.is_none_or(|c| c >= Level::Avx2)
    {
        assert!(simd::detected_level() >= Level::Avx2);
        for ty in [QuantType::Q4_0, QuantType::Q4_1, QuantType::Q8_0, QuantType::Q4_K, QuantType::Q6_K] {
            assert!(simd::dot_fn(ty).is_some());
        }
    }
}

#[test]
fn unsupported_levels_give_no_kernel() {
    for &level in Level::ALL {
        if !level.is_supported() {
            assert!(simd::dot_fn_for(QuantType::Q4_0, level).is_none());
        }
    }
    assert!(simd::dot_fn_for(QuantType::Q4_0, Level::Scalar).is_none());
    println!("levels: {:?}; features: {}", simd::available_levels(), simd::features_string());
}
