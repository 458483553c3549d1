//! Helpers shared by the benchmark examples: deterministic inputs, a weight of any shape without
//! a model file, and host timing of queued matmuls.

use quarrel_core::QuantType;
use quarrel_cuda::CudaBackend;
use quarrel_gguf::{Gguf, GgufWriter};
use std::sync::Arc;
use std::time::Instant;

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

/// A random quantized 64-row block repeated to `n_out` rows (the kernels' cost is that of any
/// weight of the shape).
pub fn weight(ty: QuantType, n_in: usize, n_out: usize) -> Arc<Gguf> {
    let block = quarrel_quant::quantize_to_vec(ty, &rnd(n_in * 64, 5)).expect("quantize");
    let mut bytes = Vec::with_capacity(block.len() * n_out.div_ceil(64));
    for _ in 0..n_out.div_ceil(64) {
        bytes.extend_from_slice(&block);
    }
    bytes.truncate(n_out * n_in / ty.block_size() * ty.type_size());
    let mut w = GgufWriter::new();
    w.add_tensor("w", &[n_in as u64, n_out as u64], ty).expect("tensor");
    Arc::new(Gguf::from_bytes(w.to_bytes(&[bytes.as_slice()]).expect("gguf")).expect("gguf"))
}

/// Microseconds per call of `f(i)` over `reps` calls, after `warm` warm-up calls.
pub fn time(be: &CudaBackend, reps: usize, warm: usize, mut f: impl FnMut(usize) -> quarrel_core::Result<()>) -> f64 {
    for i in 0..warm {
        f(i).expect("warm-up");
    }
    be.synchronize().expect("sync");
    let t = Instant::now();
    for i in 0..reps {
        f(i).expect("matmul");
    }
    be.synchronize().expect("sync");
    t.elapsed().as_secs_f64() * 1e6 / reps as f64
}
