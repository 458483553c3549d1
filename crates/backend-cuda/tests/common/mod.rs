//! Helpers shared by the GPU test files: the device check, the error measure, deterministic
//! inputs, fixture and scratch paths.
#![allow(dead_code)] // each test file uses what it needs

use quarrel_core::{AttnParams, Backend, ForwardBatch, WeightSource};
use quarrel_cpu::CpuBackend;
use quarrel_cuda::CudaBackend;
use quarrel_gguf::Gguf;
use std::path::PathBuf;
use std::sync::Arc;

/// Fails where there is no CUDA device (the GPU tests are ignored unless asked for).
pub fn require_gpu() {
    assert!(quarrel_cuda::device_count() > 0, "no CUDA device: this test needs a GPU (scripts/gpu-test.sh runs it on one)");
}

/// The backend on device 0 (fails where there is none).
pub fn cuda() -> CudaBackend {
    require_gpu();
    CudaBackend::new(0).expect("CUDA backend")
}

/// [`cuda`] and the CPU backend it is compared with (the CPU's default thread count).
pub fn cuda_and_cpu() -> (CudaBackend, CpuBackend) {
    (cuda(), CpuBackend::new(0).unwrap())
}

/// The tensor `name` of `g` loaded on `be`.
pub fn load<B: Backend>(be: &B, g: &Arc<Gguf>, name: &str) -> B::Weight {
    be.load_weight(WeightSource { gguf: g, name }).unwrap()
}

/// `w` times the `n_tok` rows of `x` on `be`: the `n_tok * n_out` outputs.
pub fn matmul_out<B: Backend>(be: &B, w: &B::Weight, x: &B::Buf, n_tok: usize, n_out: usize) -> Vec<f32> {
    let mut out = be.alloc(n_tok * n_out).unwrap();
    be.matmul(w, x, n_tok, &mut out).unwrap();
    be.download(&out).unwrap()
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

/// `rnd(n, seed)` times `scale`.
pub fn rnd_scaled(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    rnd(n, seed).iter().map(|v| v * scale).collect()
}

/// `k` and `v` (rows of the cache's width, one per token of `batch`) stored in `layer`.
pub fn store<B: Backend>(be: &B, kv: &mut B::Kv, layer: usize, batch: &ForwardBatch, k: &[f32], v: &[f32]) {
    let k = be.upload(k).unwrap();
    let v = be.upload(v).unwrap();
    be.kv_store(kv, layer, &k, &v, batch).unwrap();
}

/// [`store`] of `k` and `v`, then the attention of `q` over the cache in `layer`: its output
/// (as long as `q`).
pub fn store_attend<B: Backend>(
    be: &B,
    kv: &mut B::Kv,
    layer: usize,
    batch: &ForwardBatch,
    p: &AttnParams,
    [k, v, q]: [&[f32]; 3],
    sinks: Option<&[f32]>,
) -> Vec<f32> {
    store(be, kv, layer, batch, k, v);
    let qb = be.upload(q).unwrap();
    let sb = sinks.map(|s| be.upload(s).unwrap());
    let mut out = be.alloc(q.len()).unwrap();
    be.attention(&qb, kv, layer, batch, p, sb.as_ref(), &mut out).unwrap();
    be.download(&out).unwrap()
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
