//! Best-of-N time of one backend matmul: `matmul_speed TYPE N_IN N_OUT N_TOK [THREADS] [REPS]
//! [MATRIX_UNITS]` (random weights; `MATRIX_UNITS` 1: F16 on AMX tiles, as encoders run). A benchmark that prints figures, not a test; compare builds or
//! `QUARREL_SIMD` levels in alternating runs.
use quarrel_core::{Backend, QuantType, WeightSource};
use quarrel_cpu::CpuBackend;
use quarrel_gguf::{Gguf, GgufWriter};
use std::sync::Arc;
#[path = "../tests/common/mod.rs"]
mod common;
use common::best_secs;

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let arg = |i: usize, d: usize| a.get(i).and_then(|v| v.parse().ok()).unwrap_or(d);
    let ty = QuantType::ALL.iter().copied().find(|t| a.get(1).is_some_and(|n| n.eq_ignore_ascii_case(t.name()))).unwrap_or(QuantType::Q8_0);
    let (n_in, n_out, n_tok, threads, reps) = (arg(2, 576), arg(3, 49152), arg(4, 16), arg(5, 2), arg(6, 30));
    let x: Vec<f32> = (0..n_in * n_out).map(|i| ((i.wrapping_mul(2654435761) % 2001) as f32 - 1000.0) / 700.0).collect();
    let wq = quarrel_quant::quantize_to_vec(ty, &x).unwrap();
    let mut g = GgufWriter::new();
    g.add_tensor("w", &[n_in as u64, n_out as u64], ty).unwrap();
    let gg = Arc::new(Gguf::from_bytes(g.to_bytes(&[&wq]).unwrap()).unwrap());
    let be = CpuBackend::new(threads).unwrap();
    be.set_matrix_units(arg(7, 0) == 1);
    let w = be.load_weight(WeightSource { gguf: &gg, name: "w" }).unwrap();
    let xa: Vec<f32> = (0..n_in * n_tok).map(|i| ((i * 37 % 101) as f32 - 50.0) / 30.0).collect();
    let mut out = vec![0f32; n_out * n_tok];
    let best = best_secs(reps, || be.matmul(&w, &xa, n_tok, &mut out).unwrap());
    let flop = 2.0 * (n_in * n_out * n_tok) as f64;
    let units = if be.matrix_units() { ", AMX tiles" } else { "" };
    println!(
        "{} {n_in}x{n_out} x {n_tok} tokens, {threads} threads{units}: best {:.3} ms, {:.1} GFLOP/s",
        ty.name(),
        best * 1e3,
        flop / best / 1e9
    );
}
