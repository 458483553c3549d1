//! The MMQ kernels (quantized GEMM on the int8 tensor cores) against their plain-Rust twin
//! (`quarrel_cuda::mmq::reference`, the same exact-integer formula) and against the CPU
//! backend, for every quant type with a kernel, ragged shapes (row, token and unit tails) and
//! the split-K path; plus MMQ == GEMV for the same tokens. Needs a CUDA device.

mod common;
use common::{cuda, cuda_and_cpu, nmse, rnd, rnd_scaled};
use quarrel_core::{Backend, QuantType, Route, WeightSource};
use quarrel_cuda::mmq::MMQ_TYPES;
use quarrel_cuda::repack;
use quarrel_gguf::{Gguf, GgufWriter};
use std::sync::Arc;

/// NMSE bounds (Σ(a-b)²/Σa²).
mod tol {
    /// kernel vs twin: same integer sums and scale products, f32 vs f64 summation order
    pub const TWIN: f64 = 1e-10;
    /// vs the CPU backend, legacy types: both quantize activations to Q8_0 / Q8_1 alike
    pub const CPU_LEGACY: f64 = 1e-8;
    /// vs the CPU backend, K types: the CPU pairs them with Q8_K (256-value blocks)
    pub const CPU_K: f64 = 2e-4;
    /// MMQ vs the dp4a GEMV on the same Q8 activations
    pub const GEMV: f64 = 1e-10;
}

fn is_k(ty: QuantType) -> bool {
    matches!(ty, QuantType::Q4_K | QuantType::Q5_K | QuantType::Q6_K)
}

/// A weight "w" of type `ty` and shape `dims` (innermost first) quantized from values in
/// [-0.5, 0.5) (`rnd` from `seed`): its bytes and the file holding it.
fn quantized(ty: QuantType, dims: &[usize], seed: u64) -> (Vec<u8>, Arc<Gguf>) {
    let v = rnd_scaled(dims.iter().product(), seed, 0.5);
    let bytes = quarrel_quant::quantize_to_vec(ty, &v).unwrap();
    let mut wr = GgufWriter::new();
    wr.add_tensor("w", &dims.iter().map(|&d| d as u64).collect::<Vec<u64>>(), ty).unwrap();
    let g = Arc::new(Gguf::from_bytes(wr.to_bytes(&[bytes.as_slice()]).unwrap()).unwrap());
    (bytes, g)
}

/// The twin's rows of an expert matmul: per route, its input row (the token's with
/// `per_token`, else the route's own) times its expert, of the `ne` experts of `bytes`.
fn twin_per_route(
    ty: QuantType,
    bytes: &[u8],
    ne: usize,
    (n_in, n_out): (usize, usize),
    x: &[f32],
    routes: &[Route],
    per_token: bool,
) -> Vec<f32> {
    let eb = bytes.len() / ne;
    let mut want = Vec::with_capacity(routes.len() * n_out);
    for (i, r) in routes.iter().enumerate() {
        let row = if per_token { r.token as usize } else { i };
        let e = r.expert as usize;
        let (t, p, m) = repack(ty, &bytes[e * eb..(e + 1) * eb]).unwrap();
        want.extend(quarrel_cuda::mmq::reference(t, &p, &m.unwrap_or_default(), n_in, n_out, &x[row * n_in..(row + 1) * n_in], 1));
    }
    want
}

#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-test.sh)"]
fn mmq_matches_twin_cpu_and_gemv() {
    let (gpu, cpu) = cuda_and_cpu();
    // (n_in, n_out, n_tok): tails of rows (70, 200), of tokens (9, 17, 33, 100), of units
    // (544 = 17 units, legacy only), split-K (few blocks, long rows), a full-size tile
    let shapes = [
        (512usize, 70usize, 9usize),
        (544, 70, 17),
        (2048, 70, 33),
        (256, 200, 100),
        (4096, 130, 64),
        (1024, 512, 300),
        (768, 130, 40),
        (2304, 260, 129),
        (4096, 200, 32),
        (768, 64, 24),
        (256, 40, 1),
    ];
    eprintln!("| type | n_in | n_out | n_tok | nmse vs twin | vs CPU | vs GEMV |\n|---|---:|---:|---:|---:|---:|---:|");
    for (si, &(n_in, n_out, n_tok)) in shapes.iter().enumerate() {
        for (ti, &ty) in MMQ_TYPES.iter().enumerate() {
            if is_k(ty) && n_in % 256 != 0 {
                continue;
            }
            let (bytes, g) = quantized(ty, &[n_in, n_out], 1000 + 10 * si as u64 + ti as u64);
            let x = rnd(n_tok * n_in, 77 + si as u64);

            let (t, p, m) = repack(ty, &bytes).unwrap();
            let twin = quarrel_cuda::mmq::reference(t, &p, &m.unwrap_or_default(), n_in, n_out, &x, n_tok);

            let w = gpu.load_weight(WeightSource { gguf: &g, name: "w" }).unwrap();
            let xb = gpu.upload(&x).unwrap();
            let mut ob = gpu.alloc(n_tok * n_out).unwrap();
            gpu.matmul_mmq(&w, &xb, n_tok, &mut ob).unwrap();
            let got = gpu.download(&ob).unwrap();
            // the GEMV path, 8 tokens at a time
            let mut gemv = Vec::with_capacity(n_tok * n_out);
            for c in x.chunks(8 * n_in) {
                let nt = c.len() / n_in;
                let xb = gpu.upload(c).unwrap();
                let mut ob = gpu.alloc(nt * n_out).unwrap();
                gpu.matmul(&w, &xb, nt, &mut ob).unwrap();
                gemv.extend(gpu.download(&ob).unwrap());
            }

            let wc = cpu.load_weight(WeightSource { gguf: &g, name: "w" }).unwrap();
            let xc = cpu.upload(&x).unwrap();
            let mut oc = cpu.alloc(n_tok * n_out).unwrap();
            cpu.matmul(&wc, &xc, n_tok, &mut oc).unwrap();
            let want = cpu.download(&oc).unwrap();

            let (e_twin, e_cpu, e_gemv) = (nmse(&twin, &got), nmse(&want, &got), nmse(&gemv, &got));
            eprintln!("| {ty} | {n_in} | {n_out} | {n_tok} | {e_twin:.2e} | {e_cpu:.2e} | {e_gemv:.2e} |");
            assert!(e_twin <= tol::TWIN, "{ty} {n_in}x{n_out} n_tok {n_tok}: nmse vs twin {e_twin:.3e}");
            let cb = if is_k(ty) { tol::CPU_K } else { tol::CPU_LEGACY };
            assert!(e_cpu <= cb, "{ty} {n_in}x{n_out} n_tok {n_tok}: nmse vs CPU {e_cpu:.3e} > {cb:.0e}");
            assert!(e_gemv <= tol::GEMV, "{ty} {n_in}x{n_out} n_tok {n_tok}: nmse vs GEMV {e_gemv:.3e}");
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-test.sh)"]
fn mmq_rejects_float_weights() {
    let gpu = cuda();
    let mut wr = GgufWriter::new();
    wr.add_tensor("w", &[64, 4], QuantType::F32).unwrap();
    let bytes: Vec<u8> = rnd(256, 3).iter().flat_map(|v| v.to_le_bytes()).collect();
    let g = Arc::new(Gguf::from_bytes(wr.to_bytes(&[bytes.as_slice()]).unwrap()).unwrap());
    let w = gpu.load_weight(WeightSource { gguf: &g, name: "w" }).unwrap();
    let x = gpu.upload(&rnd(64 * 10, 4)).unwrap();
    let mut o = gpu.alloc(40).unwrap();
    assert!(gpu.matmul_mmq(&w, &x, 10, &mut o).is_err());
}

/// The grouped expert MMQ (`mmq_id`, one launch over every expert's routes: prefill steps'
/// `moe_matmul`) against the twin per route on that route's expert, for every type: skewed
/// routings (one expert takes most routes: several work items of one expert; experts with
/// none), per-token and per-route inputs, row tails, and every token tile (16 to 128 routes
/// per expert on average).
#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-test.sh)"]
fn grouped_expert_mmq_matches_twin_per_route() {
    let gpu = cuda();
    // (n_in, n_out per expert, experts, tokens, used per token, skew)
    let shapes = [
        (256usize, 70usize, 8usize, 40usize, 2usize, false),
        (512, 130, 16, 100, 4, true),
        (768, 64, 4, 200, 2, false),
        (256, 200, 32, 300, 6, true),
        (1024, 96, 8, 64, 8, false),
    ];
    eprintln!("| type | n_in | n_out | experts | tokens x used | nmse vs twin |\n|---|---:|---:|---:|---:|---:|");
    for (si, &(n_in, n_out, ne, n_tok, used, skew)) in shapes.iter().enumerate() {
        for (ti, &ty) in MMQ_TYPES.iter().enumerate() {
            if is_k(ty) && n_in % 256 != 0 {
                continue;
            }
            let (bytes, g) = quantized(ty, &[n_in, n_out, ne], 5000 + 10 * si as u64 + ti as u64);
            let w = gpu.load_weight(WeightSource { gguf: &g, name: "w" }).unwrap();
            // routes: `used` distinct experts per token; skewed: expert 1 on every token
            let mut s = 0x9e37_79b9u64 + si as u64;
            let mut next = || {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                s
            };
            let mut routes = Vec::new();
            for t in 0..n_tok {
                let mut chosen: Vec<u32> = if skew { vec![1] } else { vec![] };
                while chosen.len() < used {
                    let e = (next() % ne as u64) as u32;
                    if !chosen.contains(&e) {
                        chosen.push(e);
                    }
                }
                routes.extend(chosen.into_iter().map(|e| Route { token: t as u32, expert: e, weight: 1.0 }));
            }
            for per_token in [true, false] {
                let n_src = if per_token { n_tok } else { routes.len() };
                let x = rnd(n_src * n_in, 91 + si as u64 + per_token as u64);
                let xb = gpu.upload(&x).unwrap();
                let mut ob = gpu.alloc(routes.len() * n_out).unwrap();
                gpu.moe_matmul(&w, ne, &xb, &routes, per_token, &mut ob).unwrap();
                let got = gpu.download(&ob).unwrap();
                let want = twin_per_route(ty, &bytes, ne, (n_in, n_out), &x, &routes, per_token);
                let e = nmse(&want, &got);
                eprintln!("| {ty} | {n_in} | {n_out} | {ne} | {n_tok} x {used}{} | {e:.2e} |", if per_token { "" } else { " (per route)" });
                assert!(got.iter().all(|v| v.is_finite()), "{ty} shape {si}: non-finite output");
                assert!(e <= tol::TWIN, "{ty} {n_in}x{n_out}x{ne} {n_tok} tokens: grouped expert MMQ nmse vs twin {e:.3e}");
            }
        }
    }
}

/// Prefill steps routed on the device (`moe_route` placeholders, `moe_plan` grouping the routes
/// and cutting work items on the device) give the same bits as the host-planned grouped MMQ
/// over the same routes downloaded, for every type, per-token and per-route inputs, skewed and
/// even routings; and the device combine equals the host combine. Also holds the result to
/// the twin.
#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-test.sh)"]
fn device_planned_expert_mmq_equals_host_planned() {
    use quarrel_core::{Gating, MoeRouting};
    let gpu = cuda();
    // (n_in, n_out per expert, experts, used, tokens, logit bias toward expert 0: skew)
    let shapes = [
        (256usize, 70usize, 8usize, 2usize, 40usize, 0.0f32),
        (512, 130, 64, 6, 300, 4.0),
        (256, 64, 128, 6, 200, 0.0),
        (1024, 96, 4, 2, 700, 3.0),
    ];
    for (si, &(n_in, n_out, ne, used, n_tok, skew)) in shapes.iter().enumerate() {
        for (ti, &ty) in MMQ_TYPES.iter().enumerate() {
            if is_k(ty) && n_in % 256 != 0 {
                continue;
            }
            let (bytes, g) = quantized(ty, &[n_in, n_out, ne], 7000 + 10 * si as u64 + ti as u64);
            let w = gpu.load_weight(WeightSource { gguf: &g, name: "w" }).unwrap();
            let mut logits = rnd(n_tok * ne, 300 + si as u64);
            logits.iter_mut().step_by(ne).for_each(|l| *l += skew);
            let lb = gpu.upload(&logits).unwrap();
            let p = MoeRouting { n_expert: ne, n_used: used, gating: Gating::Softmax, norm_weights: true, scale: 0.0 };
            let placeholders = gpu.moe_route(0, &lb, None, &p).unwrap();
            let real = gpu.moe_route_on_device(&lb, None, &p).unwrap();
            assert_eq!(placeholders.len(), real.len());
            for per_token in [true, false] {
                let n_src = if per_token { n_tok } else { real.len() };
                let x = rnd(n_src * n_in, 41 + si as u64 + per_token as u64);
                let xb = gpu.upload(&x).unwrap();
                // the device routing again (moe_route_on_device replaced the router's last one)
                let ph = gpu.moe_route(0, &lb, None, &p).unwrap();
                let mut od = gpu.alloc(real.len() * n_out).unwrap();
                gpu.moe_matmul(&w, ne, &xb, &ph, per_token, &mut od).unwrap();
                let dev_planned = gpu.download(&od).unwrap();
                let mut oh = gpu.alloc(real.len() * n_out).unwrap();
                gpu.moe_matmul(&w, ne, &xb, &real, per_token, &mut oh).unwrap();
                let host_planned = gpu.download(&oh).unwrap();
                assert!(
                    dev_planned.iter().zip(&host_planned).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{ty} shape {si} per_token {per_token}: device-planned != host-planned"
                );
                let want = twin_per_route(ty, &bytes, ne, (n_in, n_out), &x, &real, per_token);
                let e = nmse(&want, &dev_planned);
                assert!(e <= tol::TWIN, "{ty} shape {si}: device-planned expert MMQ nmse vs twin {e:.3e}");
                if !per_token {
                    // the combine over device routes equals the host combine over the same routes
                    let yb = gpu.upload(&host_planned).unwrap();
                    let mut cd = gpu.alloc(n_tok * n_out).unwrap();
                    gpu.moe_combine(&yb, &ph, &mut cd).unwrap();
                    let mut ch = gpu.alloc(n_tok * n_out).unwrap();
                    gpu.moe_combine(&yb, &real, &mut ch).unwrap();
                    let (a, b) = (gpu.download(&cd).unwrap(), gpu.download(&ch).unwrap());
                    assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()), "{ty} shape {si}: device combine != host combine");
                }
            }
            eprintln!("device-planned == host-planned: {ty} {n_in}x{n_out}x{ne}, {n_tok} tokens x {used}");
        }
    }
}

/// Invariant numerics (`Numerics::Invariant`): a matmul's rows do not depend on the token
/// count. The same tokens multiplied as one batch of 9+ (MMQ, unsplit) and in chunks of 1, 2,
/// 4 and 8 (the GEMV in MMQ's order, `gemvm_*`) give identical bits, for every type, with row
/// tails (not a multiple of the 64 rows of a GEMVM block) and unit tails (17 and 21 units:
/// MMQ's last stage half empty) and long rows (448 units, split over K in fast numerics).
#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-test.sh)"]
fn invariant_gemvm_equals_unsplit_mmq_bit_for_bit() {
    let gpu = cuda();
    gpu.set_numerics(quarrel_core::Numerics::Invariant);
    let shapes = [(512usize, 70usize), (544, 130), (672, 33), (4096, 200), (14336, 96), (256, 1)];
    let n_tok = 23;
    let mut checked = 0;
    for (si, &(n_in, n_out)) in shapes.iter().enumerate() {
        for (ti, &ty) in MMQ_TYPES.iter().enumerate() {
            if is_k(ty) && n_in % 256 != 0 {
                continue;
            }
            let (_, g) = quantized(ty, &[n_in, n_out], 5000 + 10 * si as u64 + ti as u64);
            let w = gpu.load_weight(WeightSource { gguf: &g, name: "w" }).unwrap();
            // activations with outliers and an all-zero token
            let mut x = rnd(n_tok * n_in, 91 + si as u64);
            x[3] = 40.0;
            x[n_in..2 * n_in].iter_mut().for_each(|v| *v = 0.0);
            let whole = {
                let xb = gpu.upload(&x).unwrap();
                let mut ob = gpu.alloc(n_tok * n_out).unwrap();
                gpu.matmul(&w, &xb, n_tok, &mut ob).unwrap();
                gpu.download(&ob).unwrap()
            };
            for chunk in [1usize, 2, 3, 4, 8] {
                let mut t0 = 0;
                while t0 < n_tok {
                    let nt = chunk.min(n_tok - t0);
                    let xb = gpu.upload(&x[t0 * n_in..(t0 + nt) * n_in]).unwrap();
                    let mut ob = gpu.alloc(nt * n_out).unwrap();
                    gpu.matmul(&w, &xb, nt, &mut ob).unwrap();
                    let got = gpu.download(&ob).unwrap();
                    let want = &whole[t0 * n_out..(t0 + nt) * n_out];
                    let differ = got.iter().zip(want).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
                    assert_eq!(
                        differ,
                        0,
                        "{ty:?} {n_in}x{n_out}: tokens {t0}..{} in chunks of {chunk}: {differ} of {} outputs differ from MMQ",
                        t0 + nt,
                        got.len()
                    );
                    t0 += nt;
                }
            }
            checked += 1;
        }
    }
    eprintln!("gemvm == unsplit MMQ bit for bit: {checked} (type, shape) pairs, chunks of 1, 2, 3, 4, 8 tokens");
}
