//! Helpers shared by the GPU test files: the error measure and deterministic inputs.
#![allow(dead_code)] // each test file uses what it needs

/// Normalized mean squared error of `b` against `a` (same length; `b` finite).
pub fn nmse(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    assert!(b.iter().all(|v| v.is_finite()), "non-finite value");
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum();
    num / den.max(1e-30)
}

/// Deterministic pseudo-random values in [-1, 1).
pub fn rnd(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}
