//! The quantized matmuls of one decode step of a SmolLM2-135M-shape model (30 layers of
//! distinct Q4_1 weights and a Q8_0 576x49152 output head, so weights stream from memory as
//! in a real step), for several token counts: `step_gemm [THREADS] [REPS] [TOKENS,...]`.
//! Prints the best time of a pass and the per-token cost. `STEP_GEMM_LAYERS=n`: n distinct
//! layers, reused round robin (1: cache-resident weights, to tell memory from compute).
//! A benchmark, not a test.
use quarrel_core::{Backend, QuantType, WeightSource};
use quarrel_cpu::CpuBackend;
use quarrel_gguf::{Gguf, GgufWriter};
use std::sync::Arc;
use std::time::Instant;

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let threads: usize = a.get(1).and_then(|v| v.parse().ok()).unwrap_or(2);
    let reps: usize = a.get(2).and_then(|v| v.parse().ok()).unwrap_or(5);
    let toks: Vec<usize> = a.get(3).map_or(vec![1, 4, 16], |v| v.split(',').filter_map(|x| x.parse().ok()).collect());
    let (dim, kv, ffn, vocab, layers) = (576usize, 192usize, 1536usize, 49152usize, 30usize);
    let distinct: usize = std::env::var("STEP_GEMM_LAYERS").ok().and_then(|v| v.parse().ok()).unwrap_or(layers).clamp(1, layers);
    let mut shapes = vec![];
    for _ in 0..distinct {
        for (n_in, n_out) in [(dim, dim), (dim, kv), (dim, kv), (dim, dim), (dim, ffn), (dim, ffn), (ffn, dim)] {
            shapes.push((QuantType::Q4_1, n_in, n_out));
        }
    }
    shapes.push((QuantType::Q8_0, dim, vocab));
    let be = CpuBackend::new(threads).unwrap();
    let mut seed = 1u32;
    let weights: Vec<_> = shapes
        .iter()
        .map(|(ty, n_in, n_out)| {
            seed = seed.wrapping_mul(2654435761).wrapping_add(12345);
            let x: Vec<f32> =
                (0..*n_in * *n_out).map(|i| (((i as u32).wrapping_mul(2654435761) ^ seed) % 2001) as f32 / 700.0 - 1.43).collect();
            let wq = quarrel_quant::quantize_to_vec(*ty, &x).unwrap();
            let mut g = GgufWriter::new();
            g.add_tensor("w", &[*n_in as u64, *n_out as u64], *ty).unwrap();
            let gg = Arc::new(Gguf::from_bytes(g.to_bytes(&[&wq]).unwrap()).unwrap());
            (be.load_weight(WeightSource { gguf: &gg, name: "w" }).unwrap(), *n_in, *n_out)
        })
        .collect();
    for &nt in &toks {
        let xs: Vec<Vec<f32>> = [dim, ffn].iter().map(|&n| (0..n * nt).map(|i| ((i * 37 % 101) as f32 - 50.0) / 30.0).collect()).collect();
        let mut outs: Vec<Vec<f32>> = [dim, kv, ffn, vocab].iter().map(|&n| vec![0f32; n * nt]).collect();
        let mut best = f64::MAX;
        let mut head = f64::MAX;
        let mut cpu_best = f64::MAX;
        for r in 0..reps + 1 {
            let c0 = cpu_time();
            let t = Instant::now();
            let mut th = t;
            let n_layer_w = weights.len() - 1;
            let order = (0..layers * 7).map(|i| i % n_layer_w).chain([n_layer_w]);
            for (i, (w, n_in, n_out)) in order.map(|i| &weights[i]).enumerate() {
                if i == layers * 7 {
                    th = Instant::now();
                }
                let x = &xs[usize::from(*n_in == ffn)];
                let o = [dim, kv, ffn, vocab].iter().position(|&n| n == *n_out).unwrap();
                be.matmul(w, x, nt, &mut outs[o]).unwrap();
            }
            if r > 0 {
                cpu_best = cpu_best.min(cpu_time() - c0);
                best = best.min(t.elapsed().as_secs_f64());
                head = head.min(th.elapsed().as_secs_f64());
            }
        }
        println!(
            "{nt:>3} tokens, {threads} threads: pass {:.2} ms (head {:.2} ms), {:.3} ms per token; process CPU time per pass {:.2} ms",
            best * 1e3,
            head * 1e3,
            best * 1e3 / nt as f64,
            cpu_best * 1e3
        );
    }
}

/// CPU time of the whole process (all threads, spinning included), seconds.
fn cpu_time() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid clock id and a valid out pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}
