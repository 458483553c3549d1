//! The matmul with compact kept panels (the default; Q4_0 through them with the repacked path
//! off, `tuning::set_repack(false)`, before the first matmul of this test binary) against the one-row
//! kernels: every output the same bits.

mod common;
use common::rnd;
use quarrel_core::{Backend, QuantType, WeightSource};
use quarrel_cpu::simd;
use quarrel_cpu::CpuBackend;
use quarrel_gguf::{Gguf, GgufWriter};
use std::sync::Arc;

fn check(ty: QuantType, n_in: usize, n_out: usize, n_tok: usize, threads: usize, seed: u64) {
    let mut w = vec![0u8; ty.row_bytes(n_in).unwrap() * n_out];
    quarrel_quant::quantize(ty, &rnd(seed, n_in * n_out, 1.0), &mut w).unwrap();
    let mut g = GgufWriter::new();
    g.add_tensor("w", &[n_in as u64, n_out as u64], ty).unwrap();
    let gg = Arc::new(Gguf::from_bytes(g.to_bytes(&[&w]).unwrap()).unwrap());
    let be = CpuBackend::new(threads).unwrap();
    let wt = be.load_weight(WeightSource { gguf: &gg, name: "w" }).unwrap();
    let x = rnd(seed ^ 9, n_in * n_tok, 3.0);
    let mut got = vec![0f32; n_tok * n_out];
    be.matmul(&wt, &x, n_tok, &mut got).unwrap();
    let act = ty.vec_dot_type();
    let arb = act.row_bytes(n_in).unwrap();
    let wrb = ty.row_bytes(n_in).unwrap();
    let mut xq = vec![0u8; arb];
    for t in 0..n_tok {
        match simd::quantize_row_fn_ggml_x86(act) {
            Some(f) => f(&x[t * n_in..(t + 1) * n_in], &mut xq),
            None => quarrel_cpu::actquant::quantize_row(act, &x[t * n_in..(t + 1) * n_in], &mut xq).unwrap(),
        }
        for r in 0..n_out {
            let wr = &w[r * wrb..(r + 1) * wrb];
            let want = match simd::dot_fn(ty) {
                Some(f) => f(n_in, wr, &xq),
                None => simd::reference_dot(ty, n_in, wr, &xq),
            };
            assert_eq!(got[t * n_out + r].to_bits(), want.to_bits(), "{} {n_in}x{n_out} x{n_tok} t{threads}: token {t} row {r}", ty.name());
        }
    }
}

#[test]
fn compact_panels_give_the_one_row_kernels_bits() {
    // set before any weight of this binary is used (the only test here)
    quarrel_cpu::tuning::set_repack(false);
    let g = simd::gemm_fn(QuantType::Q4_1);
    if g.is_none_or(|g| g.compact_panel_bytes(64).is_none()) {
        eprintln!("no compact GEMM panels on this CPU: skipped");
        return;
    }
    for ty in [QuantType::Q4_1, QuantType::Q4_0] {
        for (n_in, n_out, n_tok, threads) in [(576, 192, 16, 2), (64, 37, 5, 1), (1536, 101, 33, 3), (96, 8, 12, 2), (32, 3, 70, 2)] {
            check(ty, n_in, n_out, n_tok, threads, n_out as u64);
        }
    }
}
