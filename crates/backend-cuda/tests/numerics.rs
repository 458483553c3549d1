//! Bit-level agreement of the GPU with the CPU backend (greedy texts equal the CPU's, and
//! through it the fixtures equal llama.cpp's). The CPU backend reproduces ggml's CPU arithmetic, so
//! wherever the GPU can do the same operations in the same order it must give the same bits:
//! element-wise ops (RMSNorm, residual add, SwiGLU with ggml's polynomial exp), embedding rows,
//! the Q8 activation quantization (seen through the matmul: the same integer block sums, only
//! the float order of the block scales differs) and attention over an f16 cache in llama.cpp's
//! CPU numerics. RoPE's cos / sin are rounded from f64 on the GPU and come from glibc on the CPU:
//! equal for all but about 1% of angles, 1 ulp apart there. Needs a CUDA device: ignored
//! unless asked for (scripts/gpu-test.sh).

mod common;
use common::{cuda, cuda_and_cpu, load, matmul_out, rnd, rnd_scaled, store, store_attend};
use quarrel_core::{
    AttnParams, Backend, ForwardBatch, KvSpec, KvType, QuantType, RopeParams, RopeScaling, RopeStyle, SeqBatch, WeightSource,
};
use quarrel_gguf::{Gguf, GgufWriter};
use std::sync::Arc;

/// Model-like shapes (multiples of 256 for the K types).
const EMBD: usize = 768;
const FF: usize = 2048;

/// (values that differ in any bit, largest difference in units of the CPU value's ulp)
fn bit_diff(a: &[f32], b: &[f32]) -> (usize, f64) {
    assert_eq!(a.len(), b.len());
    let mut n = 0;
    let mut worst = 0f64;
    for (&x, &y) in a.iter().zip(b) {
        if x.to_bits() != y.to_bits() {
            n += 1;
            let ulp = (f32::from_bits(x.abs().to_bits() + 1) - x.abs()) as f64;
            worst = worst.max(((x - y) as f64).abs() / ulp);
        }
    }
    (n, worst)
}

/// Weights of every type at SmolLM2's shapes, and norm vectors.
fn weights() -> Arc<Gguf> {
    let mut w = GgufWriter::new();
    let mut data = Vec::new();
    for (i, ty) in quarrel_cuda::mmq::MMQ_TYPES.into_iter().enumerate() {
        for (name, n_in, n_out) in [("up", EMBD, FF), ("down", FF, EMBD)] {
            let v = rnd_scaled(n_in * n_out, 500 + 2 * i as u64 + (name == "down") as u64, 0.1);
            w.add_tensor(&format!("{name}.{}", ty.name()), &[n_in as u64, n_out as u64], ty).unwrap();
            data.push(quarrel_quant::quantize_to_vec(ty, &v).unwrap());
        }
    }
    w.add_tensor("norm", &[EMBD as u64], QuantType::F32).unwrap();
    data.push(rnd(EMBD, 9).iter().flat_map(|x| (1.0 + 0.3 * x).to_le_bytes()).collect());
    let refs: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
    Arc::new(Gguf::from_bytes(w.to_bytes(&refs).unwrap()).unwrap())
}

/// Residual stream-like input: values of mixed magnitude (a few large channels).
fn hidden(n: usize, seed: u64) -> Vec<f32> {
    rnd(n, seed).iter().enumerate().map(|(i, v)| if i % 97 == 5 { v * 20.0 } else { v * 1.5 }).collect()
}

fn elementwise<B: Backend>(be: &B, g: &Arc<Gguf>) -> Vec<(&'static str, Vec<f32>)> {
    let n_tok = 7;
    let mut outs = Vec::new();
    let norm = load(be, g, "norm");
    let mut x = be.upload(&hidden(n_tok * EMBD, 1)).unwrap();
    let y = be.upload(&hidden(n_tok * EMBD, 2)).unwrap();
    let mut h = be.alloc(n_tok * EMBD).unwrap();
    be.rms_norm(&x, &norm, 1e-5, &mut h).unwrap();
    outs.push(("rms_norm", be.download(&h).unwrap()));
    be.add(&mut x, &y).unwrap();
    be.rms_norm(&x, &norm, 1e-5, &mut h).unwrap();
    outs.push(("add+rms_norm: norm", be.download(&h).unwrap()));
    outs.push(("add+rms_norm: sum", be.download(&x).unwrap()));
    // SwiGLU over whole rows of FF, and over a length with a tail past the last 16
    for n in [n_tok * FF, 1000] {
        let gate = be.upload(&rnd_scaled(n, 3, 9.0)).unwrap();
        let up = be.upload(&rnd_scaled(n, 4, 3.0)).unwrap();
        let mut s = be.alloc(n).unwrap();
        be.swiglu(&gate, &up, &mut s).unwrap();
        outs.push((if n == 1000 { "swiglu (tail)" } else { "swiglu" }, be.download(&s).unwrap()));
    }
    for ty in ["q8_0", "q4_1", "q4_K"] {
        let w = load(be, g, &format!("up.{ty}"));
        let mut e = be.alloc(3 * EMBD).unwrap();
        be.embed(&w, &[5, 0, FF as u32 - 1], &mut e).unwrap();
        outs.push((
            if ty == "q8_0" {
                "embed q8_0"
            } else if ty == "q4_1" {
                "embed q4_1"
            } else {
                "embed q4_K"
            },
            be.download(&e).unwrap(),
        ));
    }
    outs
}

#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-test.sh)"]
fn elementwise_ops_bit_exact() {
    let (gpu, cpu) = cuda_and_cpu();
    let g = weights();
    let (a, b) = (elementwise(&cpu, &g), elementwise(&gpu, &g));
    let mut bad = vec![];
    for ((name, x), (_, y)) in a.iter().zip(&b) {
        let (n, ulp) = bit_diff(x, y);
        eprintln!("{name}: {n} of {} values differ (worst {ulp:.1} ulp)", x.len());
        if n > 0 {
            bad.push(*name);
            // where: per row of EMBD values (embeddings: one row per token), the first differences
            for (r, (xr, yr)) in x.chunks(EMBD).zip(y.chunks(EMBD)).enumerate() {
                let d: Vec<usize> = (0..xr.len()).filter(|&i| xr[i].to_bits() != yr[i].to_bits()).collect();
                if let Some(&i) = d.first() {
                    let show = |v: &[f32]| v[i..(i + 4).min(v.len())].iter().map(|f| format!("{f:e}")).collect::<Vec<_>>().join(" ");
                    eprintln!("  row {r}: {} differ, first at {i}: cpu [{}] gpu [{}]", d.len(), show(xr), show(yr));
                }
            }
        }
    }
    assert!(bad.is_empty(), "not bit-exact: {bad:?}");
}

fn rope<B: Backend>(be: &B, style: RopeStyle, ff: Option<Vec<f32>>) -> Vec<f32> {
    let positions: Vec<u32> = (0..64).map(|i| i * 67 + (i % 5)).collect();
    let (n_head, hd) = (3, 64);
    let mut x = be.upload(&rnd(positions.len() * n_head * hd, 8)).unwrap();
    let p = RopeParams { style, n_rot: hd, freq_base: 100000.0, freq_scale: 1.0, freq_factors: ff, scaling: RopeScaling::NONE };
    be.rope(&mut x, &positions, n_head, hd, &p).unwrap();
    be.download(&x).unwrap()
}

#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-test.sh)"]
fn rope_within_one_ulp_of_cpu() {
    let (gpu, cpu) = cuda_and_cpu();
    for (style, ff) in [(RopeStyle::Normal, None), (RopeStyle::Neox, Some(rnd(32, 4).iter().map(|v| 1.5 + v).collect::<Vec<f32>>()))] {
        let (a, b) = (rope(&cpu, style, ff.clone()), rope(&gpu, style, ff));
        let (n, _) = bit_diff(&a, &b);
        // a 1-ulp cos/sin difference moves the rotated value by about an ulp of the larger term
        let worst = a.iter().zip(&b).map(|(x, y)| ((x - y).abs() / x.abs().max(1.0)) as f64).fold(0f64, f64::max);
        eprintln!("rope {style:?}: {n} of {} values differ, worst |diff| / max(|x|, 1) {worst:.2e}", a.len());
        assert!(n * 20 <= a.len(), "rope {style:?}: {n} of {} values differ", a.len());
        assert!(worst < 1e-6, "rope {style:?}: worst difference {worst:.2e}");
    }
}

/// x, then optionally through RMSNorm (the GPU then quantizes inside the norm kernel) or
/// SwiGLU (quantized inside SwiGLU), times W.
fn mm<B: Backend>(be: &B, g: &Arc<Gguf>, ty: &str, n_tok: usize, via: &str) -> Vec<f32> {
    let (name, n_in, n_out) = if via == "swiglu" { ("down", FF, EMBD) } else { ("up", EMBD, FF) };
    let w = load(be, g, &format!("{name}.{ty}"));
    let mut x = be.upload(&hidden(n_tok * n_in, 30 + n_tok as u64)).unwrap();
    if via == "norm" {
        let norm = load(be, g, "norm");
        let raw = be.upload(&hidden(n_tok * n_in, 40 + n_tok as u64)).unwrap();
        be.rms_norm(&raw, &norm, 1e-5, &mut x).unwrap();
    } else if via == "swiglu" {
        let gate = be.upload(&rnd_scaled(n_tok * n_in, 50, 6.0)).unwrap();
        let up = be.upload(&rnd_scaled(n_tok * n_in, 51, 2.0)).unwrap();
        be.swiglu(&gate, &up, &mut x).unwrap();
    }
    matmul_out(be, &w, &x, n_tok, n_out)
}

/// Legacy-quant matmuls (default mode): both sides quantize the activations alike (same d,
/// int8 values and f16 sums) and sum each block exactly in integers, so outputs differ only by
/// the float order of the per-block terms: here within 5e-6 of the output's rms (about half
/// of that seen, inputs with outlier channels). K-quant weights are left out: the
/// CPU pairs them with Q8_K activations (one f32 scale per 256 values), the GPU with 32-value
/// Q8 blocks, which differ by up to ~10% of the rms on such inputs (tests/ops.rs bounds them).
#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-test.sh)"]
fn quantized_matmul_equals_cpu_to_float_order() {
    let (gpu, cpu) = cuda_and_cpu();
    // the fast GEMV (the default; the ordered one: ordered_gemv_bit_exact)
    gpu.set_ordered_gemv(false);
    let g = weights();
    let mut bad = vec![];
    for ty in ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0"] {
        for via in ["raw", "norm", "swiglu"] {
            for n_tok in [1, 3, 8, 16, 32] {
                let (a, b) = (mm(&cpu, &g, ty, n_tok, via), mm(&gpu, &g, ty, n_tok, via));
                let rms = (a.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / a.len() as f64).sqrt();
                let worst = a.iter().zip(&b).map(|(x, y)| ((x - y) as f64).abs()).fold(0f64, f64::max) / rms;
                let (n, _) = bit_diff(&a, &b);
                eprintln!("matmul {ty} via {via} n_tok {n_tok}: {n} of {} differ, worst |diff| / rms {worst:.2e}", a.len());
                if worst > 5e-6 {
                    bad.push(format!("{ty} {via} {n_tok}: {worst:.2e}"));
                }
            }
        }
    }
    assert!(bad.is_empty(), "quantized matmuls beyond float order: {bad:?}");
}

/// Exact numerics (`Numerics::Exact`): Q4_0, Q4_1 and Q8_0 matmuls give the CPU's bits at
/// every token count (the CPU's float order, kernels/exact.cu; rows of 24 units: one partial step).
#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-test.sh)"]
fn exact_matmul_bit_exact() {
    let (gpu, cpu) = cuda_and_cpu();
    gpu.set_numerics(quarrel_core::Numerics::Exact);
    let g = weights();
    let mut bad = vec![];
    for ty in ["q4_0", "q4_1", "q8_0"] {
        for via in ["raw", "norm", "swiglu"] {
            for n_tok in [1, 3, 8, 9, 33, 100] {
                let (a, b) = (mm(&cpu, &g, ty, n_tok, via), mm(&gpu, &g, ty, n_tok, via));
                let (n, ulp) = bit_diff(&a, &b);
                eprintln!("exact matmul {ty} via {via} n_tok {n_tok}: {n} of {} differ (worst {ulp:.1} ulp)", a.len());
                if n > 0 {
                    bad.push(format!("{ty} {via} {n_tok}: {n} values"));
                }
            }
        }
    }
    assert!(bad.is_empty(), "exact matmuls not bit-exact: {bad:?}");
}

/// `n_tok` rows of x times three matrices of one type over the same input (the GPU joins them
/// into one `gemvo3_*` launch for 1, 2, 4 and 8 tokens, as it does q/k/v).
fn mm3<B: Backend>(be: &B, g: &Arc<Gguf>, ty: QuantType, x: &[f32], n_tok: usize, outs: &[usize]) -> Vec<Vec<f32>> {
    let xb = be.upload(x).unwrap();
    // the weights outlive the (possibly held) launches
    let ws: Vec<_> = (0..outs.len()).map(|i| load(be, g, &format!("m{i}.{}", ty.name()))).collect();
    let mut bufs = vec![];
    for (w, &n_out) in ws.iter().zip(outs) {
        let mut o = be.alloc(n_tok * n_out).unwrap();
        be.matmul(w, &xb, n_tok, &mut o).unwrap();
        bufs.push(o);
    }
    bufs.iter().map(|o| be.download(o).unwrap()).collect()
}

/// `set_ordered_gemv`: decode and short prompts over Q4_0 / Q4_1 / Q8_0 take the GEMV in the
/// CPU's float order: the CPU's bits, also with three matrices over one input in one launch,
/// rows of 176 units (a second batch of steps and a partial step of 16 units) and row counts
/// that are no multiple of a block's rows.
#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-test.sh)"]
fn ordered_gemv_bit_exact() {
    let (gpu, cpu) = cuda_and_cpu();
    gpu.set_ordered_gemv(true);
    let (n_in, outs) = (5632usize, [100usize, 36, 7]);
    let mut bad = vec![];
    for (s, ty) in [QuantType::Q4_0, QuantType::Q4_1, QuantType::Q8_0].into_iter().enumerate() {
        let mut w = GgufWriter::new();
        let mut data = vec![];
        for (i, &n_out) in outs.iter().enumerate() {
            let v = rnd_scaled(n_in * n_out, 800 + 10 * s as u64 + i as u64, 0.1);
            w.add_tensor(&format!("m{i}.{}", ty.name()), &[n_in as u64, n_out as u64], ty).unwrap();
            data.push(quarrel_quant::quantize_to_vec(ty, &v).unwrap());
        }
        let refs: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
        let g = Arc::new(Gguf::from_bytes(w.to_bytes(&refs).unwrap()).unwrap());
        for n_tok in [1, 2, 3, 4, 8, 13, 32] {
            let x = hidden(n_tok * n_in, 70 + n_tok as u64);
            let (a, b) = (mm3(&cpu, &g, ty, &x, n_tok, &outs), mm3(&gpu, &g, ty, &x, n_tok, &outs));
            for (i, (a, b)) in a.iter().zip(&b).enumerate() {
                let (n, ulp) = bit_diff(a, b);
                eprintln!("ordered GEMV {ty} matrix {i} ({} rows) n_tok {n_tok}: {n} of {} differ (worst {ulp:.1} ulp)", outs[i], a.len());
                if n > 0 {
                    bad.push(format!("{ty} m{i} {n_tok}: {n} values"));
                }
            }
        }
    }
    assert!(bad.is_empty(), "ordered GEMVs not bit-exact: {bad:?}");
}

/// Attention over an f16 cache with llama.cpp's CPU numerics (exact numerics): a prompt
/// of 20 tokens and one of 70 (ggml's tiled f32 path from 64 query rows), then decode steps.
fn attention<B: Backend>(be: &B) -> Vec<Vec<f32>> {
    let (n_head, n_kv_head, hd, bs) = (9, 3, 64, 16);
    let spec = KvSpec { n_layer: 1, n_kv_head, head_dim: hd, block_size: bs, n_blocks: 16, ty: KvType::F16 };
    let mut kv = be.alloc_kv(&spec).unwrap();
    let p = AttnParams { n_head, n_kv_head, head_dim: hd, scale: 0.125, sliding_window: None, softcap: None };
    let row = n_kv_head * hd;
    let mut outs = vec![];
    for (seq, len, table) in [(0usize, 20usize, vec![3u32, 1]), (1, 70, vec![0, 2, 4, 5, 6, 7])] {
        let batch = ForwardBatch {
            tokens: vec![0; len],
            positions: (0..len as u32).collect(),
            seqs: vec![SeqBatch { start: 0, len, block_table: table.clone() }],
            logits_rows: vec![],
            state_slots: vec![],
        };
        let k = rnd_scaled(len * row, 60 + seq as u64, 4.0);
        let q = rnd_scaled(len * n_head * hd, 80 + seq as u64, 3.0);
        outs.push(store_attend(be, &mut kv, 0, &batch, &p, [&k, &rnd(len * row, 70 + seq as u64), &q], None));
        for step in 0..3 {
            let pos = (len + step) as u32;
            let dec = ForwardBatch {
                tokens: vec![0],
                positions: vec![pos],
                seqs: vec![SeqBatch { start: 0, len: 1, block_table: table.clone() }],
                logits_rows: vec![0],
                state_slots: vec![],
            };
            let k1 = rnd_scaled(row, 90 + pos as u64, 4.0);
            let q1 = rnd_scaled(n_head * hd, 290 + pos as u64, 3.0);
            outs.push(store_attend(be, &mut kv, 0, &dec, &p, [&k1, &rnd(row, 190 + pos as u64), &q1], None));
        }
    }
    outs
}

/// Sequences under 64 query tokens over an f16 cache (every decode step, short prompts) take
/// ggml's vector path on the CPU: bit-exact on the GPU, with exact and with default numerics
/// (contexts within `vec_max_positions`). A 70-token prompt: with default numerics, ggml's
/// tiled f32 path on the CPU under llama.cpp's rule (`set_batch_invariant_attention(false)`)
/// against the GPU's f32 kernel (the default tensor-core prefill kernel, f16 q and
/// probabilities, is off here: tests/attn_batch.rs bounds it); with exact numerics, the vector
/// path at every length on both sides (the CPU's default). Float order only (1e-5 of the rms)
/// for that prompt; the decode steps after it bit for bit.
#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-test.sh)"]
fn exact_attention_matches_cpu() {
    let (gpu, cpu) = cuda_and_cpu();
    gpu.set_attn_mma_min(None);
    for exact in [false, true] {
        // default numerics follow llama.cpp's rule (the tiled f32 path for the 70-token
        // prompt, tensor cores off above), exact ones the CPU backend's default (the vector
        // path at every length)
        cpu.set_batch_invariant_attention(exact);
        let a = attention(&cpu);
        gpu.set_numerics(if exact { quarrel_core::Numerics::Exact } else { quarrel_core::Numerics::Fast });
        eprintln!("exact numerics: {exact}");
        check_attention(&a, &attention(&gpu));
    }
}

fn check_attention(a: &[Vec<f32>], b: &[Vec<f32>]) {
    let names = ["prompt 20", "decode 21", "decode 22", "decode 23", "prompt 70", "decode 71", "decode 72", "decode 73"];
    let mut bad = vec![];
    for ((name, x), y) in names.iter().zip(a).zip(b) {
        let (n, ulp) = bit_diff(x, y);
        let rms = (x.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / x.len() as f64).sqrt();
        let worst = x.iter().zip(y).map(|(u, v)| ((u - v) as f64).abs()).fold(0f64, f64::max) / rms;
        eprintln!("attention {name}: {n} of {} differ (worst {ulp:.1} ulp, |diff| / rms {worst:.2e})", x.len());
        if (*name == "prompt 70" && worst > 1e-5) || (*name != "prompt 70" && n > 0) {
            bad.push(*name);
        }
    }
    assert!(bad.is_empty(), "attention differs from the CPU's: {bad:?}");
}

/// Decode steps over long contexts (several chunks of the one-pass kernel), with a sliding
/// window and two sequences of different lengths in one batch, cache blocks in shuffled order:
/// the CPU's bits with default numerics within `vec_max_positions`, and past it with exact
/// numerics; past it with default numerics (f32 split-K) within 2% of the output's rms.
#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-test.sh)"]
fn decode_attention_long_contexts_match_cpu() {
    let (gpu, cpu) = cuda_and_cpu();
    let limit = 2048;
    gpu.set_attn_vec_max(limit);
    let mut bad = vec![];
    for (lens, window) in [([300usize, 41usize], None), ([1500, 1100], None), ([1500, 700], Some(500)), ([limit + 700, 90], None)] {
        let a = long_decode(&cpu, lens, window);
        for exact in [false, true] {
            gpu.set_numerics(if exact { quarrel_core::Numerics::Exact } else { quarrel_core::Numerics::Fast });
            let b = long_decode(&gpu, lens, window);
            let bit_exact = exact || lens[0] + 3 <= limit;
            for (step, (x, y)) in a.iter().zip(&b).enumerate() {
                let (n, ulp) = bit_diff(x, y);
                let rms = (x.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / x.len() as f64).sqrt();
                let worst = x.iter().zip(y).map(|(u, v)| ((u - v) as f64).abs()).fold(0f64, f64::max) / rms;
                eprintln!(
                    "lens {lens:?} window {window:?} exact {exact} step {step}: {n} of {} differ ({ulp:.1} ulp, |diff| / rms {worst:.2e})",
                    x.len()
                );
                if (bit_exact && n > 0) || worst > 2e-2 {
                    bad.push(format!("{lens:?} {window:?} exact {exact} step {step}"));
                }
            }
        }
    }
    gpu.set_numerics(quarrel_core::Numerics::Fast);
    assert!(bad.is_empty(), "decode attention differs from the CPU's: {bad:?}");
}

/// Two sequences of `lens` positions stored (block tables interleaved and reversed), then 3
/// decode steps of both in one batch: the attention outputs of each step.
fn long_decode<B: Backend>(be: &B, lens: [usize; 2], window: Option<usize>) -> Vec<Vec<f32>> {
    let (n_head, n_kv_head, hd, bs) = (8, 2, 128, 16);
    let nb: Vec<usize> = lens.iter().map(|l| (l + 3).div_ceil(bs)).collect();
    let spec = KvSpec { n_layer: 1, n_kv_head, head_dim: hd, block_size: bs, n_blocks: nb[0] + nb[1], ty: KvType::F16 };
    let mut kv = be.alloc_kv(&spec).unwrap();
    let p = AttnParams { n_head, n_kv_head, head_dim: hd, scale: 1.0 / (hd as f32).sqrt(), sliding_window: window, softcap: None };
    let row = n_kv_head * hd;
    // sequence 0 takes the even blocks from the top down, sequence 1 the rest
    let mut free: Vec<u32> = (0..spec.n_blocks as u32).rev().collect();
    let tables: Vec<Vec<u32>> = nb.iter().map(|&n| free.drain(..n).collect()).collect();
    for (s, &len) in lens.iter().enumerate() {
        let batch = ForwardBatch {
            tokens: vec![0; len],
            positions: (0..len as u32).collect(),
            seqs: vec![SeqBatch { start: 0, len, block_table: tables[s].clone() }],
            logits_rows: vec![],
            state_slots: vec![],
        };
        store(be, &mut kv, 0, &batch, &rnd_scaled(len * row, 400 + s as u64, 4.0), &rnd(len * row, 500 + s as u64));
    }
    let mut outs = vec![];
    for step in 0..3 {
        let dec = ForwardBatch {
            tokens: vec![0, 0],
            positions: lens.iter().map(|&l| (l + step) as u32).collect(),
            seqs: (0..2).map(|s| SeqBatch { start: s, len: 1, block_table: tables[s].clone() }).collect(),
            logits_rows: vec![0, 1],
            state_slots: vec![],
        };
        let k1 = rnd_scaled(2 * row, 600 + step as u64, 4.0);
        let q1 = rnd_scaled(2 * n_head * hd, 800 + step as u64, 3.0);
        outs.push(store_attend(be, &mut kv, 0, &dec, &p, [&k1, &rnd(2 * row, 700 + step as u64), &q1], None));
    }
    outs
}

/// Embedding rows of every shape / position kind, GPU vs CPU: first, last and middle rows, alone
/// and mixed, of tables of 1 and 3 K super-blocks per row and of few rows. Q8_0 / Q4_1 / Q4_K
/// rows bit for bit (the CPU's dequantization arithmetic); Q4_0 / Q6_K rows differ in the last
/// bit (another product order) and are held to NMSE 1e-10 per row,
/// so a wrong or stale row (values of another row or of other memory) fails either way.
#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-test.sh)"]
fn embed_rows_bit_exact_at_every_position() {
    let (gpu, cpu) = cuda_and_cpu();
    let shapes = [(768usize, 2048usize), (256, 2048), (768, 64), (512, 70)];
    let types = [QuantType::Q4_K, QuantType::Q4_0, QuantType::Q8_0, QuantType::Q6_K, QuantType::Q4_1];
    let exact = |ty: QuantType| matches!(ty, QuantType::Q8_0 | QuantType::Q4_1 | QuantType::Q4_K);
    let mut w = GgufWriter::new();
    let mut data = Vec::new();
    for (i, ty) in types.iter().enumerate() {
        for (j, &(n_in, n_out)) in shapes.iter().enumerate() {
            let v = rnd_scaled(n_in * n_out, 900 + (10 * i + j) as u64, 0.1);
            w.add_tensor(&format!("t{i}_{j}"), &[n_in as u64, n_out as u64], *ty).unwrap();
            data.push(quarrel_quant::quantize_to_vec(*ty, &v).unwrap());
        }
    }
    let refs: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
    let g = Arc::new(Gguf::from_bytes(w.to_bytes(&refs).unwrap()).unwrap());
    let mut bad = vec![];
    for (i, ty) in types.iter().enumerate() {
        for (j, &(n_in, n_out)) in shapes.iter().enumerate() {
            let last = n_out as u32 - 1;
            for toks in [vec![last], vec![0, last, 5], vec![last - 1, last], vec![5, 0, last]] {
                let name = format!("t{i}_{j}");
                let run = |be: &dyn Fn(&[u32]) -> Vec<f32>| be(&toks);
                let c = run(&|t| {
                    let wt = cpu.load_weight(WeightSource { gguf: &g, name: &name }).unwrap();
                    let mut e = cpu.alloc(t.len() * n_in).unwrap();
                    cpu.embed(&wt, t, &mut e).unwrap();
                    cpu.download(&e).unwrap()
                });
                let d = run(&|t| {
                    let wt = gpu.load_weight(WeightSource { gguf: &g, name: &name }).unwrap();
                    let mut e = gpu.alloc(t.len() * n_in).unwrap();
                    gpu.embed(&wt, t, &mut e).unwrap();
                    gpu.download(&e).unwrap()
                });
                let row_bad = |r: usize| {
                    let (a, b) = (&c[r * n_in..(r + 1) * n_in], &d[r * n_in..(r + 1) * n_in]);
                    if exact(*ty) {
                        a.iter().zip(b).any(|(x, y)| x.to_bits() != y.to_bits())
                    } else {
                        common::nmse(a, b) > 1e-10
                    }
                };
                let rows: Vec<usize> = (0..toks.len()).filter(|&r| row_bad(r)).collect();
                if !rows.is_empty() {
                    let wrong: Vec<u32> = rows.iter().map(|&r| toks[r]).collect();
                    eprintln!("embed {ty} {n_out} x {n_in}, tokens {toks:?}: rows of tokens {wrong:?} differ");
                    bad.push(format!("{ty} {n_out}x{n_in} {toks:?}"));
                }
            }
        }
    }
    assert!(bad.is_empty(), "embeddings differ: {bad:?}");
}

/// Tables read by the first kernel after their load, and token ids changing between embed calls
/// queued back to back. A weight's upload once ran on the legacy default stream, which the
/// backend's (non-blocking) stream does not wait for, and returned before the DMA of a pageable
/// source had landed: the first embedding of a table's last rows (copied last) read whatever the
/// fresh allocation held (the Q4_K garbage row of `elementwise_ops_bit_exact`, 5 failures in a
/// row on one binary). Large F32 tables (16 MiB: the DMA takes milliseconds) with different
/// values each, reused allocations in between; every row compared to the table's own values.
#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-test.sh)"]
fn fresh_tables_read_right_after_load() {
    let gpu = cuda();
    let (n_in, n_out, n_tab) = (1024usize, 4096usize, 6usize);
    let mut w = GgufWriter::new();
    let mut vals = Vec::new();
    for i in 0..n_tab {
        w.add_tensor(&format!("tab{i}"), &[n_in as u64, n_out as u64], QuantType::F32).unwrap();
        vals.push(rnd(n_in * n_out, 1000 + i as u64));
    }
    let data: Vec<Vec<u8>> = vals.iter().map(|v| v.iter().flat_map(|x| x.to_le_bytes()).collect()).collect();
    let refs: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
    let g = Arc::new(Gguf::from_bytes(w.to_bytes(&refs).unwrap()).unwrap());
    let last = n_out as u32 - 1;
    let mut bad = vec![];
    for round in 0..3 {
        for (i, v) in vals.iter().enumerate() {
            // a fresh load (the previous table's memory freed: likely this one's allocation)
            let wt = gpu.load_weight(WeightSource { gguf: &g, name: &format!("tab{i}") }).unwrap();
            // several embed calls queued back to back, ids changing each time, one download
            let ids: Vec<Vec<u32>> = vec![vec![last], vec![0, last, 5], vec![last - 1, last - 2 - round as u32], vec![7 * i as u32, last]];
            let mut outs = vec![];
            for t in &ids {
                let mut e = gpu.alloc(t.len() * n_in).unwrap();
                gpu.embed(&wt, t, &mut e).unwrap();
                outs.push((t, e));
            }
            for (t, e) in outs {
                let got = gpu.download(&e).unwrap();
                for (r, &tok) in t.iter().enumerate() {
                    let want = &v[tok as usize * n_in..][..n_in];
                    if got[r * n_in..(r + 1) * n_in].iter().zip(want).any(|(a, b)| a.to_bits() != b.to_bits()) {
                        bad.push(format!("round {round} table {i} tokens {t:?}: row of token {tok}"));
                    }
                }
            }
        }
    }
    assert!(bad.is_empty(), "embedding rows differ from the table: {bad:?}");
}

/// Small float matrices (MoE routers) take the GEMV at every token count (`gemv_float_tiled`:
/// chunks of 8 tokens along the grid's y, then 4 / 2 / 1): a prefill's outputs have the bits of
/// the same tokens multiplied one at a time (a decode step's router logits), for f32, f16 and
/// bf16 weights and token counts that leave every tail.
#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-test.sh)"]
fn small_float_matmul_prefill_equals_token_steps() {
    let be = cuda();
    for (ty, n_in, n_out) in
        [(QuantType::F32, 1536usize, 64usize), (QuantType::F32, 2688, 128), (QuantType::F16, 4096, 8), (QuantType::BF16, 512, 40)]
    {
        let mut w = GgufWriter::new();
        w.add_tensor("router", &[n_in as u64, n_out as u64], ty).unwrap();
        let v = rnd(n_in * n_out, 77);
        let bytes = quarrel_quant::quantize_to_vec(ty, &v).unwrap();
        let g = Arc::new(Gguf::from_bytes(w.to_bytes(&[bytes.as_slice()]).unwrap()).unwrap());
        let wt = load(&be, &g, "router");
        for n_tok in [9usize, 16, 37, 512] {
            let x = hidden(n_tok * n_in, 60 + n_tok as u64);
            let mut out = be.alloc(n_tok * n_out).unwrap();
            be.matmul(&wt, &be.upload(&x).unwrap(), n_tok, &mut out).unwrap();
            let all = be.download(&out).unwrap();
            for t in 0..n_tok {
                let mut one = be.alloc(n_out).unwrap();
                be.matmul(&wt, &be.upload(&x[t * n_in..(t + 1) * n_in]).unwrap(), 1, &mut one).unwrap();
                let one = be.download(&one).unwrap();
                let (n, _) = bit_diff(&one, &all[t * n_out..(t + 1) * n_out]);
                assert_eq!(n, 0, "{} {n_in}x{n_out}, {n_tok} tokens: token {t} differs from its one-token matmul in {n} values", ty.name());
            }
        }
    }
}
