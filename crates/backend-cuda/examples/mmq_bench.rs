//! MMQ vs the f16 cuBLAS GEMM per matrix shape and token count: the measurement behind
//! `mmq::MMQ_MAX_TOKENS`. Needs a CUDA GPU; no model file (weights are a random quantized
//! 64-row block repeated to full height, which costs the kernels the same as real weights).
//!
//!     cargo run --release -p quarrel-cuda --example mmq_bench -- [n_tok,...] [reps] [type,...]
//!
//! Prints one markdown row per (type, shape, tokens): microseconds per matmul for each path,
//! the cuBLAS/MMQ time ratio (> 1: MMQ faster) and MMQ's weight-read bandwidth.

use quarrel_core::{Backend, QuantType, WeightSource};

mod bench_util;
use bench_util::{rnd, setup, time, weight};

fn main() {
    let all = [QuantType::Q4_0, QuantType::Q4_K, QuantType::Q6_K, QuantType::Q5_K, QuantType::Q8_0];
    let (toks, reps, types, be) = setup(&[9, 16, 32, 64, 128, 256, 512], 20, &all);
    println!("| type | n_in | n_out | tokens | MMQ us | cuBLAS-f16 us | cuBLAS/MMQ | MMQ weight GB/s |\n|---|---:|---:|---:|---:|---:|---:|---:|");
    // Mistral-7B's matrices: q/o, k/v, gate/up, down
    let shapes = [(4096usize, 4096usize), (4096, 1024), (4096, 14336), (14336, 4096)];
    for ty in types {
        for &(n_in, n_out) in &shapes {
            let g = weight(ty, n_in, n_out);
            let w = be.load_weight(WeightSource { gguf: &g, name: "w" }).expect("load");
            let wbytes = (n_in * n_out / ty.block_size() * ty.type_size()) as f64;
            for &n in &toks {
                let x = be.upload(&rnd(n * n_in, n as u64)).expect("upload");
                let mut out = be.alloc(n * n_out).expect("alloc");
                let mmq = time(&be, reps, 1, |_| be.matmul_mmq(&w, &x, n, &mut out));
                let blas = time(&be, reps, 1, |_| be.matmul_gemm(&w, &x, n, &mut out));
                println!("| {ty} | {n_in} | {n_out} | {n} | {mmq:.1} | {blas:.1} | {:.2} | {:.0} |", blas / mmq, wbytes / mmq / 1e3);
            }
        }
    }
}
