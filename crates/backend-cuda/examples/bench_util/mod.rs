//! Helpers shared by the benchmark examples: their command line, deterministic inputs (the GPU
//! tests' `rnd`), a weight of any shape without a model file, and host timing of queued matmuls.

use quarrel_core::{Backend, QuantType};
use quarrel_cuda::CudaBackend;
use quarrel_gguf::{Gguf, GgufWriter};
use std::sync::Arc;
use std::time::Instant;

#[path = "../../tests/common/mod.rs"]
mod common;
pub use common::rnd;

/// The benchmarks' command line `[n_tok,...] [reps] [type,...]` (`default_toks`, `default_reps`
/// and `all` where absent; the types picked from `all` by name) and the backend on device 0,
/// its name printed; exits where there is no CUDA device.
pub fn setup(default_toks: &[usize], default_reps: usize, all: &[QuantType]) -> (Vec<usize>, usize, Vec<QuantType>, CudaBackend) {
    let args: Vec<String> = std::env::args().collect();
    let toks: Vec<usize> = args.get(1).map_or(default_toks.to_vec(), |s| s.split(',').filter_map(|v| v.parse().ok()).collect());
    let reps: usize = args.get(2).and_then(|v| v.parse().ok()).unwrap_or(default_reps);
    if quarrel_cuda::device_count() == 0 {
        eprintln!("no CUDA device");
        std::process::exit(1);
    }
    let be = CudaBackend::new(0).expect("CUDA backend");
    println!("{}\n", be.name());
    let types: Vec<QuantType> = match args.get(3) {
        Some(list) => all.iter().copied().filter(|t| list.split(',').any(|n| n.eq_ignore_ascii_case(&t.to_string()))).collect(),
        None => all.to_vec(),
    };
    (toks, reps, types, be)
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
