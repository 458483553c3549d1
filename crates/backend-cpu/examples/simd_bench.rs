//! Micro benchmark of the SIMD dot-product kernels and activation quantizers.
//!
//! `cargo run --release -p quarrel-cpu --example simd_bench [-- --n 4096 --stream]`
//!
//! For every weight type: ns per 4096-wide row (cache-resident: one row dotted repeatedly)
//! for the quarrel-quant reference and for each SIMD level this CPU supports, the weight
//! bytes per second of the best level, and with `--stream` a GEMV-like pass over a
//! `rows x n` matrix that does not fit in cache (one activation row, every weight row once,
//! single thread) for the best one-row kernel and the four-row kernel.

use quarrel_core::QuantType;
use quarrel_cpu::simd::{self, Level};
use std::hint::black_box;
use std::time::Instant;

#[path = "../tests/common/mod.rs"]
mod common;
use common::random_row;

fn quantized(ty: QuantType, x: &[f32]) -> Vec<u8> {
    let mut q = vec![0u8; ty.row_bytes(x.len()).unwrap()];
    quarrel_quant::quantize(ty, x, &mut q).unwrap();
    q
}

/// Best-of-`reps` mean time of `f` in ns, each rep running `f` `iters` times.
fn time_ns(iters: usize, reps: usize, mut f: impl FnMut()) -> f64 {
    let mut best = f64::INFINITY;
    for _ in 0..reps {
        let t = Instant::now();
        for _ in 0..iters {
            f();
        }
        best = best.min(t.elapsed().as_nanos() as f64 / iters as f64);
    }
    best
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n: usize = args.iter().position(|a| a == "--n").map(|i| args[i + 1].parse().unwrap()).unwrap_or(4096);
    let stream = args.iter().any(|a| a == "--stream");
    let only: Option<String> = args.iter().position(|a| a == "--type").map(|i| args[i + 1].clone());
    let levels: Vec<Level> = simd::available_levels().into_iter().filter(|&l| l != Level::Scalar).collect();
    println!("features: {}; n = {n}", simd::features_string());

    print!("{:<8} {:>9} {:>9}", "type", "bytes/row", "ref ns");
    for l in &levels {
        print!(" {:>11}", format!("{} ns", l.name()));
    }
    print!(" {:>8} {:>9}", "speedup", "GB/s");
    if stream {
        print!(" {:>14} {:>14}", "stream ns/row", "stream x4 ns");
    }
    println!();

    for &ty in QuantType::ALL {
        if matches!(ty, QuantType::Q8_1 | QuantType::Q8_K) {
            continue;
        }
        if only.as_deref().is_some_and(|o| o != ty.name()) {
            continue;
        }
        let wq = quantized(ty, &random_row(1, n));
        let aq = quantized(ty.vec_dot_type(), &random_row(2, n));
        let wb = wq.len();
        let iters = (2_000_000 / n).max(20);
        let t_ref = time_ns(iters / 4 + 1, 5, || {
            black_box(simd::reference_dot(ty, n, black_box(&wq), black_box(&aq)));
        });
        print!("{:<8} {:>9} {:>9.0}", ty.name(), wb, t_ref);
        let mut best = f64::INFINITY;
        for &l in &levels {
            match simd::dot_fn_for(ty, l) {
                Some(f) => {
                    let t = time_ns(iters / 4 + 1, 31, || {
                        black_box(f(n, black_box(&wq), black_box(&aq)));
                    });
                    best = best.min(t);
                    print!(" {:>11.0}", t);
                }
                None => print!(" {:>11}", "-"),
            }
        }
        print!(" {:>7.1}x {:>9.1}", t_ref / best, wb as f64 / best);
        if stream {
            // ~64 MiB of weights (at least 256 rows): 16 distinct rows repeated
            let rows = ((64 << 20) / wb).max(256) / 4 * 4;
            let distinct: Vec<Vec<u8>> = (0..16).map(|r| quantized(ty, &random_row(100 + r, n))).collect();
            let mut mat = vec![0u8; rows * wb];
            for r in 0..rows {
                mat[r * wb..(r + 1) * wb].copy_from_slice(&distinct[r % 16]);
            }
            let f = simd::dot_fn(ty).unwrap();
            let t1 = time_ns(1, 3, || {
                for r in 0..rows {
                    black_box(f(n, &mat[r * wb..(r + 1) * wb], &aq));
                }
            });
            print!(" {:>14.0}", t1 / rows as f64);
            match simd::dot4_fn(ty) {
                Some(f4) => {
                    let t4 = time_ns(1, 3, || {
                        for r in (0..rows).step_by(4) {
                            let w = |k: usize| &mat[(r + k) * wb..(r + k + 1) * wb];
                            black_box(f4(n, [w(0), w(1), w(2), w(3)], &aq));
                        }
                    });
                    print!(" {:>14.0}", t4 / rows as f64);
                }
                None => print!(" {:>14}", "-"),
            }
        }
        println!();
    }

    println!();
    println!(
        "{:<8} {:>9} {:>9} {:>8}   {:>12} {:>12} {:>8}",
        "quantize", "ref ns", "simd ns", "speedup", "actquant ns", "simd x86 ns", "speedup"
    );
    for ty in [QuantType::Q8_0, QuantType::Q8_1, QuantType::Q8_K] {
        let x = random_row(3, n);
        let mut out = vec![0u8; ty.row_bytes(n).unwrap()];
        let t_ref = time_ns(50, 7, || {
            quarrel_quant::quantize(ty, black_box(&x), &mut out).unwrap();
            black_box(&out);
        });
        let q = simd::quantize_row_fn(ty).expect("quantizer");
        let t = time_ns(500, 7, || {
            q(black_box(&x), &mut out);
            black_box(&out);
        });
        let t_act = time_ns(50, 7, || {
            quarrel_cpu::actquant::quantize_row(ty, black_box(&x), &mut out).unwrap();
            black_box(&out);
        });
        let q = simd::quantize_row_fn_ggml_x86(ty).expect("quantizer");
        let t_x86 = time_ns(500, 7, || {
            q(black_box(&x), &mut out);
            black_box(&out);
        });
        println!(
            "{:<8} {:>9.0} {:>9.0} {:>7.1}x   {:>12.0} {:>12.0} {:>7.1}x",
            ty.name(),
            t_ref,
            t,
            t_ref / t,
            t_act,
            t_x86,
            t_act / t_x86
        );
    }
}
