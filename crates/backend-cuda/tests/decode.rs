//! The decode step's fused launches and sampling on the device, against the CPU backend and the
//! host reference: the gate/up GEMV that finishes SwiGLU (`gemvglu_*`) and the GEMV that
//! finishes add + RMSNorm (`gemvn_*`) give what the separate kernels give (and the CPU within
//! the GEMV bounds); `sample_rows` picks the token `quarrel_core::sample_row_ref` picks for the
//! same uniform draw. Needs a CUDA device: without one each test prints a skip and returns.

mod common;
use common::{nmse, rnd};
use quarrel_core::sample::{nucleus, penalized, softmax_seq, top_k_sorted};
use quarrel_core::{sample_row_ref, Backend, QuantType, SampleRow, WeightSource};
use quarrel_cpu::CpuBackend;
use quarrel_cuda::CudaBackend;
use quarrel_gguf::{Gguf, GgufWriter};
use std::sync::Arc;

fn cuda() -> Option<CudaBackend> {
    if quarrel_cuda::device_count() == 0 {
        eprintln!("no CUDA device: skipping (scripts/gpu-test.sh runs this on a GPU machine)");
        return None;
    }
    Some(CudaBackend::new(0).expect("CUDA backend"))
}

const N_EMBD: usize = 512;
const N_FF: usize = 1408;

/// gate, up (N_EMBD -> N_FF), down (N_FF -> N_EMBD) of one type and a norm vector.
fn mlp_weights(ty: QuantType) -> Arc<Gguf> {
    let mut w = GgufWriter::new();
    let mut data = Vec::new();
    for (i, (name, n_in, n_out)) in [("gate", N_EMBD, N_FF), ("up", N_EMBD, N_FF), ("down", N_FF, N_EMBD)].into_iter().enumerate() {
        w.add_tensor(name, &[n_in as u64, n_out as u64], ty).unwrap();
        let v: Vec<f32> = rnd(n_in * n_out, 70 + i as u64).iter().map(|x| x * 0.3).collect();
        data.push(quarrel_quant::quantize_to_vec(ty, &v).unwrap());
    }
    w.add_tensor("norm", &[N_EMBD as u64], QuantType::F32).unwrap();
    data.push(rnd(N_EMBD, 5).iter().flat_map(|x| (1.0 + 0.3 * x).to_le_bytes()).collect());
    let refs: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
    Arc::new(Gguf::from_bytes(w.to_bytes(&refs).unwrap()).unwrap())
}

/// One MLP block of a decode step over `n_tok` tokens: norm -> gate/up -> SwiGLU -> down ->
/// residual add -> the next norm. `split`: a download between the ops that the GPU fuses, so
/// that they run as separate kernels. Returns (SwiGLU output, residual, next norm's output).
fn mlp_step<B: Backend>(be: &B, g: &Arc<Gguf>, n_tok: usize, split: bool) -> [Vec<f32>; 3] {
    let ld = |name: &str| be.load_weight(WeightSource { gguf: g, name }).unwrap();
    let (gate, up, down, norm) = (ld("gate"), ld("up"), ld("down"), ld("norm"));
    let mut x = be.upload(&rnd(n_tok * N_EMBD, 11 + n_tok as u64).iter().map(|v| v * 2.0).collect::<Vec<_>>()).unwrap();
    let mut h = be.alloc(n_tok * N_EMBD).unwrap();
    be.rms_norm(&x, &norm, 1e-5, &mut h).unwrap();
    let (mut gb, mut ub, mut hb) = (be.alloc(n_tok * N_FF).unwrap(), be.alloc(n_tok * N_FF).unwrap(), be.alloc(n_tok * N_FF).unwrap());
    be.matmul(&gate, &h, n_tok, &mut gb).unwrap();
    be.matmul(&up, &h, n_tok, &mut ub).unwrap();
    if split {
        be.download(&ub).unwrap();
    }
    be.swiglu(&gb, &ub, &mut hb).unwrap();
    let mut f = be.alloc(n_tok * N_EMBD).unwrap();
    be.matmul(&down, &hb, n_tok, &mut f).unwrap();
    if split {
        be.download(&f).unwrap();
    }
    be.add(&mut x, &f).unwrap();
    let mut h2 = be.alloc(n_tok * N_EMBD).unwrap();
    be.rms_norm(&x, &norm, 1e-5, &mut h2).unwrap();
    [be.download(&hb).unwrap(), be.download(&x).unwrap(), be.download(&h2).unwrap()]
}

/// The fused tails equal the separate kernels (SwiGLU bit for bit; the norm's double sum may
/// only change its order) and the CPU within the GEMV bounds, for 1, 2, 3 (no fusion) and 8
/// tokens and legacy and K weight types.
#[test]
fn fused_gemv_tails_match_unfused_and_cpu() {
    let Some(gpu) = cuda() else { return };
    let cpu = CpuBackend::new(0).unwrap();
    for ty in [QuantType::Q4_0, QuantType::Q8_0, QuantType::Q4_K, QuantType::Q6_K] {
        let g = mlp_weights(ty);
        let bound = if matches!(ty, QuantType::Q4_0 | QuantType::Q8_0) { 1e-7 } else { 1e-3 };
        for n_tok in [1usize, 2, 3, 8] {
            let fused = mlp_step(&gpu, &g, n_tok, false);
            let split = mlp_step(&gpu, &g, n_tok, true);
            let host = mlp_step(&cpu, &g, n_tok, false);
            assert_eq!(fused[0], split[0], "{ty} n_tok {n_tok}: SwiGLU in the GEMV tail differs from the swiglu kernel");
            assert_eq!(fused[1], split[1], "{ty} n_tok {n_tok}: the residual differs");
            let same = nmse(&split[2], &fused[2]);
            assert!(same <= 1e-12, "{ty} n_tok {n_tok}: fused norm vs unfused nmse {same:.3e}");
            for (i, what) in ["swiglu", "residual", "norm"].iter().enumerate() {
                let e = nmse(&host[i], &fused[i]);
                eprintln!("{ty} n_tok {n_tok} {what}: nmse vs CPU {e:.3e} (fused vs unfused norm {same:.1e})");
                assert!(e <= bound, "{ty} n_tok {n_tok} {what}: nmse vs CPU {e:.3e}");
            }
        }
    }
}

/// Whether the reference's pick for `row` hangs on a comparison within `eps` (top-p's
/// cumulative sum, min-p's threshold, the draw): where CUDA's expf may differ from libm's.
fn near_boundary(logits: &[f32], row: &SampleRow, eps: f32) -> bool {
    if row.temperature <= 0.0 {
        return false;
    }
    let l = penalized(logits, row);
    let mut cand = top_k_sorted(&l, row.top_k);
    let probs = softmax_seq(&cand.iter().map(|c| c.1).collect::<Vec<_>>());
    let mut cum = 0.0f32;
    for &p in &probs {
        cum += p;
        if row.top_p < 1.0 && (cum - row.top_p).abs() < eps {
            return true;
        }
        if row.min_p > 0.0 && (p - row.min_p * probs[0]).abs() < eps {
            return true;
        }
    }
    cand.truncate(nucleus(&probs, row.top_p, row.min_p));
    let probs = softmax_seq(&cand.iter().map(|c| c.1 / row.temperature).collect::<Vec<_>>());
    let mut cum = 0.0f32;
    probs.iter().any(|&p| {
        cum += p;
        (cum - row.r).abs() < eps
    })
}

/// Device sampling picks the reference's token for the same draw on many random rows: several
/// vocabulary sizes, rows with many ties (rounded logits), penalties, greedy rows with penalties,
/// every k up to the bound; a row with top-k 0 sends the call to the host (same picks).
#[test]
fn sample_rows_match_the_reference() {
    let Some(gpu) = cuda() else { return };
    let mut s = 0x9e3779b97f4a7c15u64;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 11) as f64 / (1u64 << 53) as f64
    };
    let (mut trials, mut differ, mut ambiguous) = (0, 0, 0);
    for (case, &(dim, n_rows)) in [(1000usize, 1usize), (32000, 3), (49157, 2), (151936, 1), (300, 4)].iter().cycle().take(60).enumerate() {
        let ties = case % 3 == 0;
        let scale = [2.0f32, 6.0, 12.0][case % 3];
        let logits: Vec<f32> =
            rnd(dim * n_rows, 500 + case as u64).iter().map(|v| if ties { (v * 6.0).round() } else { v * scale }).collect();
        let rows: Vec<SampleRow> = (0..n_rows)
            .map(|i| {
                let penalties: Vec<(u32, u32)> = if (case + i) % 2 == 0 {
                    let mut p: Vec<(u32, u32)> = (0..20).map(|_| ((next() * dim as f64 * 1.01) as u32, 1 + (next() * 3.0) as u32)).collect();
                    p.sort_unstable();
                    p.dedup_by_key(|e| e.0);
                    p
                } else {
                    vec![]
                };
                SampleRow {
                    temperature: if (case + i) % 7 == 3 { 0.0 } else { [0.3f32, 0.8, 1.5][(case + i) % 3] },
                    top_k: [1usize, 5, 40, 256, 100][(case + 2 * i) % 5],
                    top_p: [1.0f32, 0.9, 0.5][(case / 2 + i) % 3],
                    min_p: [0.0f32, 0.05][(case / 3 + i) % 2],
                    repeat_penalty: if penalties.is_empty() { 1.0 } else { 1.3 },
                    presence_penalty: if penalties.is_empty() { 0.0 } else { 0.4 },
                    frequency_penalty: if penalties.is_empty() { 0.0 } else { 0.1 },
                    penalties,
                    r: next() as f32,
                }
            })
            .collect();
        let x = gpu.upload(&logits).unwrap();
        let got = gpu.sample_rows(&x, dim, &rows).unwrap();
        for (i, (l, row)) in logits.chunks(dim).zip(&rows).enumerate() {
            let want = sample_row_ref(l, row);
            trials += 1;
            if got[i] != want {
                differ += 1;
                let near = near_boundary(l, row, 1e-5);
                ambiguous += near as usize;
                assert!(near, "case {case} row {i} (dim {dim}, {row:?}): device {} vs reference {want}", got[i]);
            }
        }
    }
    eprintln!("sample_rows: {trials} rows, {differ} picks differ (all within 1e-5 of a boundary: {ambiguous})");
    assert!(differ * 50 <= trials, "{differ} of {trials} picks differ");
    // top-k 0 (all tokens) runs on the host: same picks
    let l = rnd(5000, 3);
    let row = SampleRow { temperature: 0.9, top_k: 0, top_p: 0.95, min_p: 0.0, repeat_penalty: 1.0, presence_penalty: 0.0, frequency_penalty: 0.0, penalties: vec![], r: 0.37 };
    let x = gpu.upload(&l).unwrap();
    assert_eq!(gpu.sample_rows(&x, 5000, std::slice::from_ref(&row)).unwrap(), vec![sample_row_ref(&l, &row)]);
    // a shape mismatch is an error
    assert!(gpu.sample_rows(&x, 4999, std::slice::from_ref(&row)).is_err());
}
