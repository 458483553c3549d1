//! Prompt-processing matmul benchmark: `CpuBackend::matmul` on SmolLM2-135M's shapes.
//!
//! `cargo run --release -p quarrel-cpu --example gemm_bench [-- --threads 2 --tokens 512 --type q4_1]`
//! (`--dim 1024 --ffn 2816 --kv 256 --vocab 32000` for other shapes, e.g. for the K-quants,
//! whose rows must be multiples of 256).

use quarrel_core::{Backend, QuantType, WeightSource};
use quarrel_cpu::CpuBackend;
use quarrel_gguf::{Gguf, GgufWriter};
use std::sync::Arc;
use std::time::Instant;

#[path = "../tests/common/mod.rs"]
mod common;
use common::{best_secs, rnd};

fn arg<T: std::str::FromStr>(args: &[String], name: &str, default: T) -> T {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)?.parse().ok()).unwrap_or(default)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let threads: usize = arg(&args, "--threads", 2);
    let n_tok: usize = arg(&args, "--tokens", 512);
    let reps: usize = arg(&args, "--reps", 3);
    let ty = QuantType::from_name(&arg(&args, "--type", "q4_1".to_string())).expect("--type");
    let be = CpuBackend::new(threads).unwrap();
    println!("{}; {} tokens; gemm for {}: {}", be.name(), n_tok, ty.name(), quarrel_cpu::simd::gemm_fn(ty).is_some());
    let (dim, ffn, kv, vocab): (usize, usize, usize, usize) =
        (arg(&args, "--dim", 576), arg(&args, "--ffn", 1536), arg(&args, "--kv", 192), arg(&args, "--vocab", 49152));
    let shapes = [
        ("q/o", ty, dim, dim, n_tok),
        ("k/v", ty, dim, kv, n_tok),
        ("gate/up", ty, dim, ffn, n_tok),
        ("down", ty, ffn, dim, n_tok),
        ("lm head (q8_0)", QuantType::Q8_0, dim, vocab, n_tok / 2),
    ];
    if args.iter().any(|a| a == "--kernel") {
        kernel_only(ty, arg(&args, "--n-in", 1536));
        return;
    }
    let mut total = 0.0;
    for (name, ty, n_in, n_out, n_tok) in shapes {
        let name = format!("{name} {n_in}x{n_out}");
        let mut bytes = vec![0u8; ty.row_bytes(n_in).unwrap() * n_out];
        quarrel_quant::quantize(ty, &rnd(1, n_in * n_out, 1.0), &mut bytes).unwrap();
        let mut g = GgufWriter::new();
        g.add_tensor("w", &[n_in as u64, n_out as u64], ty).unwrap();
        let g = Arc::new(Gguf::from_bytes(g.to_bytes(&[&bytes]).unwrap()).unwrap());
        let w = be.load_weight(WeightSource { gguf: &g, name: "w" }).unwrap();
        let x = rnd(2, n_in * n_tok, 2.0);
        let mut out = vec![0f32; n_out * n_tok];
        let best = best_secs(reps, || be.matmul(&w, &x, n_tok, &mut out).unwrap());
        total += best;
        let gmac = (n_in * n_out * n_tok) as f64 / best / 1e9;
        println!("{name:<24} {:>9.2} ms {gmac:>7.1} GMAC/s", best * 1e3);
    }
    println!("sum {:.2} ms", total * 1e3);
}

/// One tile computed over and over on cache-resident panels (single thread): the kernel's
/// own speed.
fn kernel_only(ty: QuantType, n_in: usize) {
    use quarrel_cpu::simd::{self, GEMM_ROWS, GEMM_TOKENS};
    let Some(g) = simd::gemm_fn(ty) else {
        println!("no GEMM kernel for {}", ty.name());
        return;
    };
    let act = ty.vec_dot_type();
    let (wrb, arb) = (ty.row_bytes(n_in).unwrap(), act.row_bytes(n_in).unwrap());
    let mut w = vec![0u8; wrb * GEMM_ROWS];
    quarrel_quant::quantize(ty, &rnd(3, n_in * GEMM_ROWS, 1.0), &mut w).unwrap();
    let mut a = vec![0u8; arb * GEMM_TOKENS];
    quarrel_quant::quantize(act, &rnd(4, n_in * GEMM_TOKENS, 1.0), &mut a).unwrap();
    let wrows: Vec<&[u8]> = w.chunks(wrb).collect();
    let arows: Vec<&[u8]> = a.chunks(arb).collect();
    let mut wp = vec![0u8; g.weight_panel_bytes(n_in)];
    let mut ap = vec![0u8; g.act_panel_bytes(n_in)];
    g.pack_weights(n_in, &wrows, &mut wp);
    g.pack_act(n_in, &arows, &mut ap);
    let mut out = [[0f32; GEMM_TOKENS]; GEMM_ROWS];
    let iters = 20_000;
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let t = Instant::now();
        for _ in 0..iters {
            g.tile(n_in, std::hint::black_box(&wp), &ap, GEMM_TOKENS, &mut out);
        }
        best = best.min(t.elapsed().as_secs_f64() / iters as f64);
    }
    let macs = (n_in * GEMM_ROWS * GEMM_TOKENS) as f64;
    println!("{}: tile {}x{} over {n_in}: {:.0} ns, {:.1} GMAC/s", ty.name(), GEMM_ROWS, GEMM_TOKENS, best * 1e9, macs / best / 1e9);
}
