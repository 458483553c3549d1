//! Every SIMD kernel against its reference twin in quarrel-quant, on random data.

use proptest::prelude::*;
use quarrel_core::QuantType;
use quarrel_cpu::simd;

fn random_row(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0
        })
        .collect()
}

fn check(ty: QuantType, n_blocks: usize, seed: u64) -> Result<(), TestCaseError> {
    let Some(fast) = simd::dot_fn(ty) else { return Ok(()) };
    let n = n_blocks * ty.block_size();
    let w = random_row(seed, n);
    let a = random_row(seed ^ 0xABCDEF, n);
    let mut wq = vec![0u8; ty.row_bytes(n).unwrap()];
    quarrel_quant::quantize(ty, &w, &mut wq).unwrap();
    let at = ty.vec_dot_type();
    let mut aq = vec![0u8; at.row_bytes(n).unwrap()];
    quarrel_quant::quantize(at, &a, &mut aq).unwrap();
    let r = simd::reference_dot(ty, n, &wq, &aq);
    let f = fast(n, &wq, &aq);
    // integer block sums are exact; only the float accumulation order differs
    let tol = 1e-5 * (1.0 + r.abs()) + 1e-4 * (n as f32).sqrt();
    prop_assert!((r - f).abs() <= tol, "{}: reference {r} vs simd {f} (n = {n})", ty.name());
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
}

#[test]
fn some_kernel_is_selected_on_x86() {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::env::var_os("QUARREL_NO_SIMD").is_none() {
        assert!(simd::dot_fn(QuantType::Q4_0).is_some());
        assert!(simd::dot_fn(QuantType::Q4_1).is_some());
        assert!(simd::dot_fn(QuantType::Q8_0).is_some());
    }
}
