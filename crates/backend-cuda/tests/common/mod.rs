//! Helpers shared by the GPU test files: the device check, the error measure, deterministic
//! inputs, fixture and scratch paths.
#![allow(dead_code)] // each test file uses what it needs

use quarrel_cuda::CudaBackend;
use std::path::PathBuf;

/// Fails where there is no CUDA device (the GPU tests are ignored unless asked for).
pub fn require_gpu() {
    assert!(quarrel_cuda::device_count() > 0, "no CUDA device: this test needs a GPU (scripts/gpu-test.sh runs it on one)");
}

/// The backend on device 0 (fails where there is none).
pub fn cuda() -> CudaBackend {
    require_gpu();
    CudaBackend::new(0).expect("CUDA backend")
}

/// Normalized mean squared error of `b` against `a` (same length; `b` finite).
pub fn nmse(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    assert!(b.iter().all(|v| v.is_finite()), "non-finite value");
    nmse_any(a, b)
}

/// `nmse` where `b` may hold NaN or infinities (the result is then NaN or infinite: the caller
/// reports it).
pub fn nmse_any(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
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

/// `tests/fixtures/<rel>`; `QUARREL_FIXTURES` overrides the folder (prebuilt test binaries
/// run from another checkout).
pub fn fixture(rel: &str) -> PathBuf {
    match std::env::var_os("QUARREL_FIXTURES") {
        Some(d) => PathBuf::from(d).join(rel),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(rel),
    }
}

/// A fresh scratch folder `quarrel-cuda-<tag>-<pid>` under the system's temporary folder.
pub fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("quarrel-cuda-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}
