//! Throughput of the repacked tiles (one group x T tokens) per type: `cargo run --release
//! -p quarrel-cpu --example repack_speed`. A benchmark (prints figures), not a test.
use quarrel_core::QuantType;
use quarrel_cpu::simd::repack::{self, ActAux, RepackTy, R};
use std::time::Instant;

fn main() {
    let n_in = 2048;
    let n_out: usize = std::env::var("N_OUT").ok().and_then(|v| v.parse().ok()).unwrap_or(2048);
    for (rt, ty) in [(RepackTy::Q4_0, QuantType::Q4_0), (RepackTy::Q4_K, QuantType::Q4_K)] {
        let x: Vec<f32> = (0..n_in * n_out).map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 300.0).collect();
        let w = quarrel_quant::quantize_to_vec(ty, &x).unwrap();
        let p = repack::repack(rt, n_in, n_out, &w);
        let act = ty.vec_dot_type();
        let xa: Vec<f32> = (0..n_in * 8).map(|i| ((i * 31 % 97) as f32 - 48.0) / 20.0).collect();
        let aq = quarrel_quant::quantize_to_vec(act, &xa).unwrap();
        let arb = act.row_bytes(n_in).unwrap();
        let aux = repack::act_aux_rows(rt, n_in, &aq, arb);
        let gb = rt.group_bytes(n_in);
        for t in [1usize, 4, 8] {
            let acts: Vec<(&[u8], &[ActAux])> = aq.chunks(arb).zip(&aux).take(t).map(|(a, x)| (a, x.as_slice())).collect();
            let mut out = [[0f32; R]; 8];
            let reps = 20;
            let t0 = Instant::now();
            for _ in 0..reps {
                for g in 0..n_out / R {
                    repack::tile(rt, n_in, &p[g * gb..(g + 1) * gb], &acts, &mut out);
                }
            }
            let s = t0.elapsed().as_secs_f64();
            println!(
                "{rt:?} T={t}: {:.2} GB/s of weights, {:.1} GMAC/s",
                (p.len() * reps) as f64 / s / 1e9,
                (n_in * n_out * t * reps) as f64 / s / 1e9
            );
        }
    }
}
