//! Decode GEMV per matrix shape: the fast GEMV (`gemv_*`) against the GEMV in the CPU's float
//! order (`gemvo_*`, `set_ordered_gemv`), as achieved weight-read bandwidth. Needs a CUDA GPU; no
//! model file. Eight copies of each weight are cycled so that the 50 MB L2 cache holds none of
//! them between uses (each matmul reads its weight from DRAM, as in a decode step).
//!
//!     cargo run --release -p quarrel-cuda --example gemv_bench -- [n_tok,...] [reps] [type,...]
//!
//! Prints one markdown row per (type, shape, tokens): microseconds per matmul (host-timed over
//! `reps` matmuls, queued back to back) and GB/s of weight bytes for each kernel, and the ratio.

use quarrel_core::{Backend, QuantType, WeightSource};

mod bench_util;
use bench_util::{rnd, setup, time, weight};

const COPIES: usize = 8;

fn main() {
    let (toks, reps, types, be) = setup(&[1, 8], 400, &[QuantType::Q4_0, QuantType::Q4_1, QuantType::Q8_0]);
    println!("| type | n_in | n_out | tokens | fast us | ordered us | fast GB/s | ordered GB/s | ordered/fast time |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    // Mistral-7B's matrices: q/o, k/v, gate/up, down, output; TinyLlama's q/o, gate/up, down
    let shapes =
        [(4096usize, 4096usize), (4096, 1024), (4096, 14336), (14336, 4096), (4096, 32000), (2048, 2048), (2048, 5632), (5632, 2048)];
    for ty in types {
        for &(n_in, n_out) in &shapes {
            let g = weight(ty, n_in, n_out);
            let ws: Vec<_> = (0..COPIES).map(|_| be.load_weight(WeightSource { gguf: &g, name: "w" }).expect("load")).collect();
            let wbytes = (n_in * n_out / ty.block_size() * ty.type_size()) as f64;
            for &n in &toks {
                // one input: its Q8 form is made once (as in a step, where the op before writes it)
                let x = be.upload(&rnd(n * n_in, n as u64)).expect("upload");
                let mut out = be.alloc(n * n_out).expect("alloc");
                let mut run = |ordered: bool| {
                    be.set_ordered_gemv(ordered);
                    time(&be, reps, COPIES, |i| be.matmul(&ws[i % COPIES], &x, n, &mut out))
                };
                let (fast, ord) = (run(false), run(true));
                println!(
                    "| {ty} | {n_in} | {n_out} | {n} | {fast:.2} | {ord:.2} | {:.0} | {:.0} | {:.2} |",
                    wbytes / fast / 1e3,
                    wbytes / ord / 1e3,
                    ord / fast
                );
            }
        }
    }
}
