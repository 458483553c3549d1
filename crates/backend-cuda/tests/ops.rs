//! Every op of the CUDA backend against the CPU backend (the reference), NMSE per op from one
//! table. Needs a CUDA device: the tests are ignored unless asked for (`--include-ignored`, as
//! `scripts/gpu-test.sh` does on a GPU machine), so CI (no GPU) reports them as ignored.

mod common;
use common::{load, matmul_out, nmse, rnd, rnd_scaled, store_attend};
use quarrel_core::{
    AttnParams, Backend, ForwardBatch, KvSpec, KvType, QuantType, RopeParams, RopeScaling, RopeStyle, Route, SeqBatch, WeightSource,
};
use quarrel_cpu::CpuBackend;
use quarrel_cuda::CudaBackend;
use quarrel_gguf::{Gguf, GgufWriter};
use std::sync::Arc;

/// NMSE bounds (Σ(a-b)²/Σa²), CUDA vs CPU.
mod tol {
    /// legacy quants: both sides quantize activations to Q8_0/Q8_1 alike; only float order differs
    pub const GEMV_LEGACY: f64 = 1e-8;
    /// K quants: CPU pairs with Q8_K (256-value blocks), the GPU with 32-value Q8 blocks
    pub const GEMV_K: f64 = 2e-4;
    /// float weights: CPU rounds F16/BF16 activations to f16/bf16, the GPU keeps f32
    pub const GEMV_FLOAT: f64 = 1e-4;
    /// prefill GEMM: f16 activations on the tensor cores vs Q8 activations on the CPU
    pub const GEMM: f64 = 2e-4;
    /// element-wise ops and gathers (same formulas; libm vs CUDA's expf/cosf)
    pub const ELEMENTWISE: f64 = 1e-10;
    /// embedding rows of types without a GPU kernel (kept as f16 on the device)
    pub const EMBED_F16_COPY: f64 = 1e-6;
    /// attention: GPU in f32 throughout vs the CPU's f16 vector path on f16 caches
    pub const ATTENTION: f64 = 1e-5;
}

fn cuda() -> CudaBackend {
    let gpu = common::cuda();
    // these tests hold the fast kernels to their NMSE bounds: small test weights would otherwise
    // take the ordered GEMV by default (it has its own bit-exact tests in tests/numerics.rs)
    gpu.set_ordered_gemv(false);
    gpu
}

/// [`cuda`] and the CPU backend it is compared with.
fn cuda_and_cpu() -> (CudaBackend, CpuBackend) {
    (cuda(), CpuBackend::new(0).unwrap())
}

const N_IN: usize = 512;
const N_OUT: usize = 70;

const TYPES: &[QuantType] = &[
    QuantType::F32,
    QuantType::F16,
    QuantType::BF16,
    QuantType::Q4_0,
    QuantType::Q4_1,
    QuantType::Q5_0,
    QuantType::Q5_1,
    QuantType::Q8_0,
    QuantType::Q2_K,
    QuantType::Q3_K,
    QuantType::Q4_K,
    QuantType::Q5_K,
    QuantType::Q6_K,
    QuantType::IQ4_NL,
];

/// One GGUF holding an (N_IN, N_OUT) matrix of every type that quantizes, and a norm vector.
fn weights() -> (Arc<Gguf>, Vec<QuantType>) {
    let mut w = GgufWriter::new();
    let mut data = Vec::new();
    let mut types = Vec::new();
    for (i, &ty) in TYPES.iter().enumerate() {
        let v = rnd_scaled(N_IN * N_OUT, 100 + i as u64, 0.5);
        let Ok(bytes) = quarrel_quant::quantize_to_vec(ty, &v) else { continue };
        w.add_tensor(&format!("w.{}", ty.name()), &[N_IN as u64, N_OUT as u64], ty).unwrap();
        data.push(bytes);
        types.push(ty);
    }
    w.add_tensor("norm", &[N_IN as u64], QuantType::F32).unwrap();
    let g: Vec<f32> = rnd(N_IN, 9).iter().map(|x| 1.0 + 0.3 * x).collect();
    data.push(g.iter().flat_map(|v| v.to_le_bytes()).collect());
    let refs: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
    (Arc::new(Gguf::from_bytes(w.to_bytes(&refs).unwrap()).unwrap()), types)
}

fn matmul<B: Backend>(be: &B, g: &Arc<Gguf>, ty: QuantType, n_tok: usize) -> Vec<f32> {
    let w = load(be, g, &format!("w.{}", ty.name()));
    let x = be.upload(&rnd(n_tok * N_IN, n_tok as u64)).unwrap();
    matmul_out(be, &w, &x, n_tok, N_OUT)
}

#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-test.sh)"]
fn matmul_every_type_gemv_and_gemm() {
    let (gpu, cpu) = cuda_and_cpu();
    let (g, types) = weights();
    assert!(types.len() >= 12, "only {types:?} quantize");
    for &ty in &types {
        for n_tok in [1, 2, 3, 5, 8, 9, 33] {
            let a = matmul(&cpu, &g, ty, n_tok);
            let b = matmul(&gpu, &g, ty, n_tok);
            let e = nmse(&a, &b);
            let bound = if n_tok > 8 {
                tol::GEMM
            } else if matches!(
                ty,
                QuantType::F32 | QuantType::F16 | QuantType::BF16 | QuantType::Q2_K | QuantType::Q3_K | QuantType::IQ4_NL
            ) {
                tol::GEMV_FLOAT
            } else if matches!(ty, QuantType::Q4_K | QuantType::Q5_K | QuantType::Q6_K) {
                tol::GEMV_K
            } else {
                tol::GEMV_LEGACY
            };
            eprintln!("matmul {ty} n_tok {n_tok}: nmse {e:.3e} (bound {bound:.0e})");
            assert!(e <= bound, "matmul {ty} n_tok {n_tok}: nmse {e:.3e} > {bound:.0e}");
        }
    }
}

/// Tall matrices take the GEMV path with one or two warps per row (the 70-row ones take four).
#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-test.sh)"]
fn matmul_row_splits() {
    let (gpu, cpu) = cuda_and_cpu();
    for (n_in, n_out) in [(256usize, 8200usize), (512, 4100)] {
        let mut w = GgufWriter::new();
        let mut data = Vec::new();
        let types = [QuantType::Q4_0, QuantType::Q6_K, QuantType::F16];
        for (i, &ty) in types.iter().enumerate() {
            let v: Vec<f32> = rnd(n_in * n_out, 300 + i as u64);
            w.add_tensor(&format!("w.{}", ty.name()), &[n_in as u64, n_out as u64], ty).unwrap();
            data.push(quarrel_quant::quantize_to_vec(ty, &v).unwrap());
        }
        let refs: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
        let g = Arc::new(Gguf::from_bytes(w.to_bytes(&refs).unwrap()).unwrap());
        for ty in types {
            for n_tok in [1, 3] {
                let a = mm(&cpu, &g, ty, n_in, n_out, n_tok);
                let b = mm(&gpu, &g, ty, n_in, n_out, n_tok);
                let e = nmse(&a, &b);
                let bound = if ty == QuantType::Q6_K {
                    tol::GEMV_K
                } else if ty == QuantType::F16 {
                    tol::GEMV_FLOAT
                } else {
                    tol::GEMV_LEGACY
                };
                eprintln!("matmul {ty} {n_in}x{n_out} n_tok {n_tok}: nmse {e:.3e}");
                assert!(e <= bound, "matmul {ty} {n_in}x{n_out} n_tok {n_tok}: nmse {e:.3e}");
            }
        }
    }
}

fn mm<B: Backend>(be: &B, g: &Arc<Gguf>, ty: QuantType, n_in: usize, n_out: usize, n_tok: usize) -> Vec<f32> {
    let w = load(be, g, &format!("w.{}", ty.name()));
    let x = be.upload(&rnd(n_tok * n_in, 7 + n_tok as u64)).unwrap();
    matmul_out(be, &w, &x, n_tok, n_out)
}

/// Embedding, RMSNorm, RoPE (both styles, with frequency factors), SwiGLU, GeGLU, add, scale, gather.
fn elementwise<B: Backend>(be: &B, g: &Arc<Gguf>, types: &[QuantType]) -> Vec<(String, Vec<f32>)> {
    let mut outs = Vec::new();
    let tokens = [3u32, 0, 69, 17, 17];
    for &ty in types {
        let w = load(be, g, &format!("w.{}", ty.name()));
        let mut e = be.alloc(tokens.len() * N_IN).unwrap();
        be.embed(&w, &tokens, &mut e).unwrap();
        outs.push((format!("embed {ty}"), be.download(&e).unwrap()));
    }
    let n_tok = 5;
    let x = be.upload(&rnd(n_tok * N_IN, 1)).unwrap();
    let norm = load(be, g, "norm");
    let mut h = be.alloc(n_tok * N_IN).unwrap();
    be.rms_norm(&x, &norm, 1e-5, &mut h).unwrap();
    outs.push(("rms_norm".into(), be.download(&h).unwrap()));
    // LayerNorm with the norm vector as its bias too (rows of N_IN: 16-value blocks and no tail)
    let mut ln = be.alloc(n_tok * N_IN).unwrap();
    be.layer_norm(&x, &norm, &norm, 1e-5, &mut ln).unwrap();
    outs.push(("layer_norm".into(), be.download(&ln).unwrap()));
    let positions = [0u32, 1, 7, 300, 4095];
    let yarn = RopeScaling::yarn(64, 4096, 10000.0, 2.0, 32.0, 1.0, 1.1);
    let ffs = rnd(32, 4).iter().map(|v| 1.5 + v).collect::<Vec<f32>>();
    for (style, ff, scaling) in
        [(RopeStyle::Normal, None, RopeScaling::NONE), (RopeStyle::Neox, Some(ffs), RopeScaling::NONE), (RopeStyle::Neox, None, yarn)]
    {
        let mut r = be.upload(&rnd(n_tok * N_IN, 2)).unwrap();
        let p = RopeParams { style, n_rot: 64, freq_base: 10000.0, freq_scale: 0.5, freq_factors: ff, scaling };
        be.rope(&mut r, &positions, 8, 64, &p).unwrap();
        outs.push((format!("rope {style:?} {scaling:?}"), be.download(&r).unwrap()));
    }
    let gate = be.upload(&rnd_scaled(n_tok * N_IN, 5, 8.0)).unwrap();
    let mut s = be.alloc(n_tok * N_IN).unwrap();
    be.swiglu(&gate, &x, &mut s).unwrap();
    outs.push(("swiglu".into(), be.download(&s).unwrap()));
    // GELU gate over the table's whole range and past its ±10 cut-offs (Gemma)
    let wide = be.upload(&rnd_scaled(n_tok * N_IN, 8, 30.0)).unwrap();
    let mut gg = be.alloc(n_tok * N_IN).unwrap();
    be.geglu(&wide, &x, &mut gg).unwrap();
    outs.push(("geglu".into(), be.download(&gg).unwrap()));
    // plain GELU in place (BERT), over the table's range and past its cut-offs
    let mut ge = be.upload(&rnd_scaled(n_tok * N_IN, 8, 30.0)).unwrap();
    be.gelu(&mut ge).unwrap();
    outs.push(("gelu".into(), be.download(&ge).unwrap()));
    // GPT-OSS's clamped SwiGLU, gate and up past the clamp (±7) on both sides
    let wide_up = be.upload(&rnd_scaled(n_tok * N_IN, 9, 12.0)).unwrap();
    let mut so = be.alloc(n_tok * N_IN).unwrap();
    be.swiglu_oai(&wide, &wide_up, &mut so, 1.702, 7.0).unwrap();
    outs.push(("swiglu_oai".into(), be.download(&so).unwrap()));
    // per-expert biases of 6 routes' rows (3 experts of 96-value biases)
    let routes: Vec<Route> =
        [2u32, 0, 1, 2, 0, 0].iter().enumerate().map(|(i, &e)| Route { token: i as u32 / 2, expert: e, weight: 1.0 }).collect();
    let eb = be.upload(&rnd(3 * 96, 14)).unwrap();
    let mut ey = be.upload(&rnd(6 * 96, 15)).unwrap();
    be.moe_add_bias(&mut ey, &eb, &routes).unwrap();
    outs.push(("moe_add_bias".into(), be.download(&ey).unwrap()));
    be.add(&mut s, &x).unwrap();
    be.scale(&mut s, 0.25).unwrap();
    outs.push(("add+scale".into(), be.download(&s).unwrap()));
    // a projection bias on every row (Qwen2's q/k/v), rows narrower than the whole buffer
    let bias = be.upload(&rnd(96, 9)).unwrap();
    let mut bx = be.upload(&rnd(n_tok * 96, 10)).unwrap();
    be.add_bias(&mut bx, &bias).unwrap();
    outs.push(("add_bias".into(), be.download(&bx).unwrap()));
    let mut gsel = be.alloc(3 * N_IN).unwrap();
    be.gather_rows(&s, N_IN, &[4, 0, 2], &mut gsel).unwrap();
    outs.push(("gather_rows".into(), be.download(&gsel).unwrap()));
    // a residual add followed by the norm of its sum (one fused kernel on the GPU)
    be.add(&mut s, &x).unwrap();
    let mut h2 = be.alloc(n_tok * N_IN).unwrap();
    be.rms_norm(&s, &norm, 1e-5, &mut h2).unwrap();
    outs.push(("add+rms_norm: norm".into(), be.download(&h2).unwrap()));
    outs.push(("add+rms_norm: sum".into(), be.download(&s).unwrap()));
    // an add whose sum is not normalized next (the held add runs alone)
    be.add(&mut s, &x).unwrap();
    be.rms_norm(&x, &norm, 1e-5, &mut h2).unwrap();
    outs.push(("add, norm of another: sum".into(), be.download(&s).unwrap()));
    outs.push(("add, norm of another: norm".into(), be.download(&h2).unwrap()));
    // a scaled residual add (Granite's multiplier) followed by the norm of its sum (one kernel on
    // the GPU), then one alone; `y` is not read after (left scaled or not)
    let mut y = be.upload(&rnd(n_tok * N_IN, 6)).unwrap();
    be.add_scaled(&mut s, &mut y, 0.22).unwrap();
    be.rms_norm(&s, &norm, 1e-5, &mut h2).unwrap();
    outs.push(("add_scaled+rms_norm: norm".into(), be.download(&h2).unwrap()));
    outs.push(("add_scaled+rms_norm: sum".into(), be.download(&s).unwrap()));
    let mut y = be.upload(&rnd(n_tok * N_IN, 7)).unwrap();
    be.add_scaled(&mut s, &mut y, -1.7).unwrap();
    be.rms_norm(&x, &norm, 1e-5, &mut h2).unwrap();
    outs.push(("add_scaled, norm of another: sum".into(), be.download(&s).unwrap()));
    outs
}

#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-test.sh)"]
fn elementwise_ops_match_cpu() {
    let (gpu, cpu) = cuda_and_cpu();
    let (g, types) = weights();
    let a = elementwise(&cpu, &g, &types);
    let b = elementwise(&gpu, &g, &types);
    for ((name, x), (_, y)) in a.iter().zip(&b) {
        let e = nmse(x, y);
        let f16_copy = ["q2_K", "q3_K", "iq4_nl"].iter().any(|t| name.ends_with(t));
        let bound = if f16_copy { tol::EMBED_F16_COPY } else { tol::ELEMENTWISE };
        eprintln!("{name}: nmse {e:.3e}");
        assert!(e <= bound, "{name}: nmse {e:.3e} > {bound:.0e}");
    }
}

/// Two sequences in scattered cache blocks: `kv_store` their tokens, then attention.
fn attention<B: Backend>(be: &B, ty: KvType, window: Option<usize>, softcap: Option<f32>) -> Vec<f32> {
    attention_sinks(be, ty, window, softcap, None)
}

/// [`attention`] with per-head sink logits.
fn attention_sinks<B: Backend>(be: &B, ty: KvType, window: Option<usize>, softcap: Option<f32>, sinks: Option<&[f32]>) -> Vec<f32> {
    let (n_head, n_kv_head, hd, bs) = (8, 2, 64, 16);
    let spec = KvSpec { n_layer: 2, n_kv_head, head_dim: hd, block_size: bs, n_blocks: 24, ty };
    let mut kv = be.alloc_kv(&spec).unwrap();
    // sequence 0: 45 prompt tokens; sequence 1: 70 tokens
    let (l0, l1) = (45usize, 70usize);
    let batch = ForwardBatch {
        tokens: vec![0; l0 + l1],
        positions: (0..l0 as u32).chain(0..l1 as u32).collect(),
        seqs: vec![
            SeqBatch { start: 0, len: l0, block_table: vec![5, 2, 9] },
            SeqBatch { start: l0, len: l1, block_table: vec![1, 7, 3, 11, 0] },
        ],
        logits_rows: vec![],
        state_slots: vec![],
    };
    let row = n_kv_head * hd;
    let n = batch.n_tokens();
    let p = AttnParams { n_head, n_kv_head, head_dim: hd, scale: 1.0 / (hd as f32).sqrt(), sliding_window: window, softcap };
    let mut all =
        store_attend(be, &mut kv, 1, &batch, &p, [&rnd(n * row, 11), &rnd(n * row, 12), &rnd_scaled(n * n_head * hd, 13, 3.0)], sinks);
    // then one decode token for sequence 1 (position 70)
    let dec = ForwardBatch {
        tokens: vec![0],
        positions: vec![l1 as u32],
        seqs: vec![SeqBatch { start: 0, len: 1, block_table: vec![1, 7, 3, 11, 0] }],
        logits_rows: vec![0],
        state_slots: vec![],
    };
    all.extend(store_attend(be, &mut kv, 1, &dec, &p, [&rnd(row, 21), &rnd(row, 22), &rnd(n_head * hd, 23)], sinks));
    all
}

/// Attention sinks (GPT-OSS) with and without a sliding window, prefill and decode: the CPU's
/// results.
#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-test.sh)"]
fn attention_sinks_match_cpu() {
    let (gpu, cpu) = cuda_and_cpu();
    // from below to above the scores: the sink's share from none to most of the softmax
    let sinks: Vec<f32> = (0..8).map(|h| h as f32 * 2.0 - 6.0).collect();
    for ty in [KvType::F16, KvType::F32, KvType::Q8_0] {
        for window in [None, Some(20)] {
            let a = attention_sinks(&cpu, ty, window, None, Some(&sinks));
            let b = attention_sinks(&gpu, ty, window, None, Some(&sinks));
            let e = nmse(&a, &b);
            eprintln!("attention with sinks {} window {window:?}: nmse {e:.3e}", ty.name());
            assert!(e <= tol::ATTENTION, "attention with sinks {}: nmse {e:.3e}", ty.name());
            assert!(nmse(&a, &attention(&cpu, ty, window, None)) > 1e-4, "the sinks change the output");
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-test.sh)"]
fn paged_attention_every_kv_type() {
    let (gpu, cpu) = cuda_and_cpu();
    for ty in KvType::ALL {
        for (window, softcap) in [(None, None), (Some(20), None), (None, Some(5.0))] {
            let a = attention(&cpu, ty, window, softcap);
            let b = attention(&gpu, ty, window, softcap);
            let e = nmse(&a, &b);
            eprintln!("attention {} window {window:?} softcap {softcap:?}: nmse {e:.3e}", ty.name());
            assert!(e <= tol::ATTENTION, "attention {}: nmse {e:.3e}", ty.name());
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-test.sh)"]
fn bad_input_is_an_error_not_a_panic() {
    let gpu = cuda();
    let (g, _) = weights();
    let w = load(&gpu, &g, "w.q4_0");
    let x = gpu.upload(&[0.0; N_IN]).unwrap();
    let mut out = gpu.alloc(N_OUT + 1).unwrap();
    assert!(gpu.matmul(&w, &x, 1, &mut out).is_err());
    let mut e = gpu.alloc(N_IN).unwrap();
    assert!(gpu.embed(&w, &[N_OUT as u32], &mut e).is_err());
    assert!(gpu.load_weight(WeightSource { gguf: &g, name: "missing" }).is_err());
}

/// q, k, v (gate, up) style: matmuls over one input, of one type, run as one launch on the
/// GPU; each result must equal the CPU's, whichever matrices join (sizes differ, outputs
/// distinct, then an output reused as the next input).
#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-test.sh)"]
fn grouped_gemvs_match_cpu() {
    let (gpu, cpu) = cuda_and_cpu();
    let n_in = 256;
    let shapes = [700usize, 96, 96, 5000];
    for ty in [QuantType::Q4_0, QuantType::Q4_K, QuantType::Q6_K] {
        let mut w = GgufWriter::new();
        let mut data = Vec::new();
        for (i, &n_out) in shapes.iter().enumerate() {
            w.add_tensor(&format!("w{i}"), &[n_in as u64, n_out as u64], ty).unwrap();
            data.push(quarrel_quant::quantize_to_vec(ty, &rnd(n_in * n_out, 40 + i as u64)).unwrap());
        }
        let refs: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
        let g = Arc::new(Gguf::from_bytes(w.to_bytes(&refs).unwrap()).unwrap());
        fn run<B: Backend>(be: &B, g: &Arc<Gguf>, shapes: &[usize], n_in: usize, n_tok: usize) -> Vec<Vec<f32>> {
            let ws: Vec<B::Weight> = (0..shapes.len()).map(|i| load(be, g, &format!("w{i}"))).collect();
            let x = be.upload(&rnd(n_tok * n_in, 9)).unwrap();
            let mut outs: Vec<B::Buf> = shapes.iter().map(|&n| be.alloc(n_tok * n).unwrap()).collect();
            for (i, o) in outs.iter_mut().enumerate() {
                be.matmul(&ws[i], &x, n_tok, o).unwrap();
            }
            // the first output (700 wide, cut to n_in) feeds another matmul
            let rows: Vec<f32> = be.download(&outs[0]).unwrap();
            let part: Vec<f32> = rows.chunks(shapes[0]).flat_map(|r| r[..n_in].to_vec()).collect();
            let y = be.upload(&part).unwrap();
            let mut o2 = be.alloc(n_tok * shapes[1]).unwrap();
            be.matmul(&ws[1], &y, n_tok, &mut o2).unwrap();
            let mut v: Vec<Vec<f32>> = outs.iter().map(|o| be.download(o).unwrap()).collect();
            v.push(be.download(&o2).unwrap());
            v
        }
        for n_tok in [1, 2] {
            let a = run(&cpu, &g, &shapes, n_in, n_tok);
            let b = run(&gpu, &g, &shapes, n_in, n_tok);
            let bound = if ty == QuantType::Q4_0 { tol::GEMV_LEGACY } else { tol::GEMV_K };
            for (i, (x, y)) in a.iter().zip(&b).enumerate() {
                let e = nmse(x, y);
                eprintln!("grouped {ty} n_tok {n_tok} matrix {i}: nmse {e:.3e}");
                assert!(e <= bound, "grouped {ty} n_tok {n_tok} matrix {i}: nmse {e:.3e}");
            }
        }
    }
}

/// Greedy picks on the device equal the host scan: ties (first wins), NaN, infinities,
/// several rows, rows longer and shorter than a block.
#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-test.sh)"]
fn argmax_rows_matches_host() {
    let gpu = cuda();
    for (dim, rows) in [(1usize, 3usize), (7, 2), (1000, 1), (49152, 2), (32000, 3)] {
        let mut v: Vec<f32> = rnd(dim * rows, dim as u64).iter().map(|x| (x * 8.0).round()).collect();
        if dim > 10 {
            v[5] = f32::NAN;
            if rows > 1 {
                v[dim + 3] = f32::INFINITY;
            }
        }
        let x = gpu.upload(&v).unwrap();
        let got = gpu.argmax_rows(&x, dim).unwrap();
        let want: Vec<u32> = v.chunks(dim).map(quarrel_core::argmax).collect();
        assert_eq!(got, want, "dim {dim} rows {rows}");
    }
    let nan_first = gpu.upload(&[f32::NAN, 1.0, 2.0]).unwrap();
    assert_eq!(gpu.argmax_rows(&nan_first, 3).unwrap(), vec![0]);
    let x = gpu.upload(&[1.0, 2.0, 3.0]).unwrap();
    assert!(gpu.argmax_rows(&x, 2).is_err());
}

/// RoPE of q and k followed by the store of k and v runs as one launch on f32/f16 caches when
/// whole heads rotate (`rope_kv_*`): q, k and the attention over the cache equal the unfused
/// launches bit for bit and the CPU within the attention bound (prefill of two sequences, then
/// a decode token; both RoPE styles; partial rotation and quantized caches stay unfused).
#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-test.sh)"]
fn rope_and_kv_store_fused_match_unfused_and_cpu() {
    let (gpu, cpu) = cuda_and_cpu();
    fn run<B: Backend>(be: &B, ty: KvType, style: RopeStyle, n_rot: usize, fuse: bool) -> Vec<f32> {
        let (n_head, n_kv_head, hd, bs) = (8, 2, 64, 16);
        let spec = KvSpec { n_layer: 1, n_kv_head, head_dim: hd, block_size: bs, n_blocks: 24, ty };
        let mut kv = be.alloc_kv(&spec).unwrap();
        let rp = RopeParams { style, n_rot, freq_base: 10000.0, freq_scale: 1.0, freq_factors: None, scaling: RopeScaling::NONE };
        let p = AttnParams { n_head, n_kv_head, head_dim: hd, scale: 1.0 / (hd as f32).sqrt(), sliding_window: None, softcap: None };
        let (l0, l1) = (21usize, 40usize);
        let pre = ForwardBatch {
            tokens: vec![0; l0 + l1],
            positions: (0..l0 as u32).chain(0..l1 as u32).collect(),
            seqs: vec![
                SeqBatch { start: 0, len: l0, block_table: vec![5, 2] },
                SeqBatch { start: l0, len: l1, block_table: vec![1, 7, 3] },
            ],
            logits_rows: vec![],
            state_slots: vec![],
        };
        let dec = ForwardBatch {
            tokens: vec![0],
            positions: vec![l1 as u32],
            seqs: vec![SeqBatch { start: 0, len: 1, block_table: vec![1, 7, 3] }],
            logits_rows: vec![0],
            state_slots: vec![],
        };
        let mut all = vec![];
        for (i, b) in [pre, dec].iter().enumerate() {
            let n = b.n_tokens();
            let mut q = be.upload(&rnd(n * n_head * hd, 31 + i as u64)).unwrap();
            let mut k = be.upload(&rnd(n * n_kv_head * hd, 41 + i as u64)).unwrap();
            let v = be.upload(&rnd(n * n_kv_head * hd, 51 + i as u64)).unwrap();
            be.rope(&mut q, &b.positions, n_head, hd, &rp).unwrap();
            be.rope(&mut k, &b.positions, n_kv_head, hd, &rp).unwrap();
            if !fuse {
                // a download submits the held RoPE launch: the store runs as its own kernel
                be.download(&q).unwrap();
            }
            be.kv_store(&mut kv, 0, &k, &v, b).unwrap();
            let mut o = be.alloc(n * n_head * hd).unwrap();
            be.attention(&q, &kv, 0, b, &p, None, &mut o).unwrap();
            all.extend(be.download(&q).unwrap());
            all.extend(be.download(&k).unwrap());
            all.extend(be.download(&o).unwrap());
        }
        all
    }
    for ty in KvType::ALL {
        for style in [RopeStyle::Normal, RopeStyle::Neox] {
            for n_rot in [64, 32] {
                let plain = run(&gpu, ty, style, n_rot, false);
                let fused = run(&gpu, ty, style, n_rot, true);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&fused), bits(&plain), "{} {style:?} n_rot {n_rot}: fused RoPE + KV store differs", ty.name());
                let e = nmse(&run(&cpu, ty, style, n_rot, false), &plain);
                eprintln!("rope + kv_store {} {style:?} n_rot {n_rot}: nmse vs CPU {e:.3e}", ty.name());
                assert!(e <= tol::ATTENTION, "rope + kv_store {}: nmse {e:.3e}", ty.name());
            }
        }
    }
}

/// The q/k/v GEMV with RoPE and the KV store in its epilogue (`gemv3r_*`: the model's op
/// sequence matmul q, k, v, rope q, rope k, kv_store with nothing in between) gives the same
/// bits as the separate kernels (a download after the matmuls submits the GEMV alone), for
/// decode batches of 1 to 8 tokens over two sequences' caches, with and without frequency
/// factors, and stays within the CPU's bounds. Neox RoPE and partial rotation keep the
/// separate kernels (checked to agree too).
#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-test.sh)"]
fn qkv_gemv_with_rope_and_kv_store_matches_separate_kernels() {
    let (gpu, cpu) = cuda_and_cpu();
    let (n_in, n_head, n_kv_head, hd, bs) = (256usize, 4usize, 2usize, 64usize, 16usize);
    for ty in [QuantType::Q4_0, QuantType::Q8_0, QuantType::Q4_K] {
        let mut w = GgufWriter::new();
        let mut data = Vec::new();
        for (i, n_out) in [n_head * hd, n_kv_head * hd, n_kv_head * hd].into_iter().enumerate() {
            w.add_tensor(&format!("w{i}"), &[n_in as u64, n_out as u64], ty).unwrap();
            data.push(quarrel_quant::quantize_to_vec(ty, &rnd(n_in * n_out, 70 + i as u64)).unwrap());
        }
        let refs: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
        let g = Arc::new(Gguf::from_bytes(w.to_bytes(&refs).unwrap()).unwrap());
        #[allow(clippy::too_many_arguments)]
        fn run<B: Backend>(
            be: &B,
            g: &Arc<Gguf>,
            dims: (usize, usize, usize, usize, usize),
            rp: &RopeParams,
            n_tok: usize,
            fuse: bool,
        ) -> Vec<f32> {
            let (n_in, n_head, n_kv_head, hd, bs) = dims;
            let ws: Vec<B::Weight> = (0..3).map(|i| load(be, g, &format!("w{i}"))).collect();
            let spec = KvSpec { n_layer: 1, n_kv_head, head_dim: hd, block_size: bs, n_blocks: 16, ty: KvType::F16 };
            let mut kv = be.alloc_kv(&spec).unwrap();
            let p = AttnParams { n_head, n_kv_head, head_dim: hd, scale: 1.0 / (hd as f32).sqrt(), sliding_window: None, softcap: None };
            let mut all = vec![];
            // tokens alternate between two sequences at growing positions
            for step in 0..3u32 {
                let (a, b) = (n_tok.div_ceil(2), n_tok / 2);
                let mut positions: Vec<u32> = (0..a as u32).map(|i| 3 * step + i).collect();
                positions.extend((0..b as u32).map(|i| 20 + 3 * step + i));
                let mut seqs = vec![quarrel_core::SeqBatch { start: 0, len: a, block_table: vec![3, 1] }];
                if b > 0 {
                    seqs.push(quarrel_core::SeqBatch { start: a, len: b, block_table: vec![5, 2, 7] });
                }
                let batch = ForwardBatch { tokens: vec![0; n_tok], positions, seqs, logits_rows: vec![], state_slots: vec![] };
                let x = be.upload(&rnd(n_tok * n_in, 7 + step as u64)).unwrap();
                let mut q = be.alloc(n_tok * n_head * hd).unwrap();
                let mut k = be.alloc(n_tok * n_kv_head * hd).unwrap();
                let mut v = be.alloc(n_tok * n_kv_head * hd).unwrap();
                be.matmul(&ws[0], &x, n_tok, &mut q).unwrap();
                be.matmul(&ws[1], &x, n_tok, &mut k).unwrap();
                be.matmul(&ws[2], &x, n_tok, &mut v).unwrap();
                if !fuse {
                    be.download(&v).unwrap();
                }
                be.rope(&mut q, &batch.positions, n_head, hd, rp).unwrap();
                be.rope(&mut k, &batch.positions, n_kv_head, hd, rp).unwrap();
                be.kv_store(&mut kv, 0, &k, &v, &batch).unwrap();
                let mut o = be.alloc(n_tok * n_head * hd).unwrap();
                be.attention(&q, &kv, 0, &batch, &p, None, &mut o).unwrap();
                for buf in [&q, &k, &v, &o] {
                    all.extend(be.download(buf).unwrap());
                }
            }
            all
        }
        let dims = (n_in, n_head, n_kv_head, hd, bs);
        let ff: Vec<f32> = (0..hd / 2).map(|i| 1.0 + 0.1 * i as f32).collect();
        for (style, n_rot, freq_factors) in
            [(RopeStyle::Normal, hd, None), (RopeStyle::Normal, hd, Some(ff)), (RopeStyle::Neox, hd, None), (RopeStyle::Normal, 32, None)]
        {
            let rp = RopeParams { style, n_rot, freq_base: 10000.0, freq_scale: 0.5, freq_factors, scaling: RopeScaling::NONE };
            for n_tok in [1, 2, 5, 8] {
                let plain = run(&gpu, &g, dims, &rp, n_tok, false);
                let fused = run(&gpu, &g, dims, &rp, n_tok, true);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                let what = format!("{ty} {style:?} n_rot {n_rot} ff {} n_tok {n_tok}", rp.freq_factors.is_some());
                assert!(bits(&fused) == bits(&plain), "{what}: the fused q/k/v GEMV + RoPE + KV store differs from the separate kernels");
                let e = nmse(&run(&cpu, &g, dims, &rp, n_tok, false), &plain);
                eprintln!("qkv + rope + kv_store {what}: nmse vs CPU {e:.3e}");
                // K types: the CPU pairs them with Q8_K activations (tol::GEMV_K per matmul), and
                // the softmax over a few positions amplifies it (up to 2.5e-4 here)
                let bound = if ty == QuantType::Q4_K { 5.0 * tol::GEMV_K } else { tol::ATTENTION };
                assert!(e <= bound, "{what}: nmse {e:.3e} (bound {bound:e})");
            }
        }
    }
}

/// RMSNorm rows of 2,048 to 8,192 values (a model's hidden size): alone, after a residual add
/// and after a scaled one (one fused kernel each) give the CPU's values.
#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-test.sh)"]
fn wide_rms_norm_matches_cpu() {
    let (gpu, cpu) = cuda_and_cpu();
    fn run<B: Backend>(be: &B, d: usize, rows: usize) -> Vec<Vec<f32>> {
        let mut w = GgufWriter::new();
        w.add_tensor("norm", &[d as u64], QuantType::F32).unwrap();
        let g: Vec<u8> = rnd(d, 31).iter().flat_map(|x| (1.0 + 0.3 * x).to_le_bytes()).collect();
        let g = Arc::new(Gguf::from_bytes(w.to_bytes(&[&g]).unwrap()).unwrap());
        let norm = load(be, &g, "norm");
        let n = rows * d;
        let mut x = be.upload(&rnd_scaled(n, d as u64, 4.0)).unwrap();
        let y = be.upload(&rnd(n, 2 + d as u64)).unwrap();
        let mut h = be.alloc(n).unwrap();
        let mut outs = Vec::new();
        be.rms_norm(&x, &norm, 1e-5, &mut h).unwrap();
        outs.push(be.download(&h).unwrap());
        be.add(&mut x, &y).unwrap();
        be.rms_norm(&x, &norm, 1e-6, &mut h).unwrap();
        outs.push(be.download(&h).unwrap());
        outs.push(be.download(&x).unwrap());
        let mut y2 = be.upload(&rnd(n, 3 + d as u64)).unwrap();
        be.add_scaled(&mut x, &mut y2, 0.37).unwrap();
        be.rms_norm(&x, &norm, 1e-5, &mut h).unwrap();
        outs.push(be.download(&h).unwrap());
        outs.push(be.download(&x).unwrap());
        outs
    }
    for d in [2048usize, 4096, 6144, 8192] {
        for rows in [1usize, 3] {
            let want = run(&cpu, d, rows);
            let got = run(&gpu, d, rows);
            for (i, (a, b)) in want.iter().zip(&got).enumerate() {
                let e = nmse(a, b);
                eprintln!("d {d} rows {rows} output {i}: nmse vs CPU {e:.2e}");
                assert!(e <= tol::ELEMENTWISE, "d {d} rows {rows} output {i}: nmse {e:.3e} vs CPU");
            }
        }
    }
}
