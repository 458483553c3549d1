//! The GEMM path of the matmul (several tokens) against the one-row kernels: every output
//! must have the same bits as `simd::dot_fn(ty)` of its (weight row, quantized token), for
//! random shapes (ragged row and token tails), weight types and thread counts.

mod common;
use common::rnd;
use proptest::prelude::*;
use quarrel_core::{Backend, QuantType, WeightSource};
use quarrel_cpu::simd::{self, GEMM_ROWS, GEMM_TOKENS};
use quarrel_cpu::CpuBackend;
use quarrel_gguf::{Gguf, GgufWriter};
use std::sync::Arc;

/// The types with GEMM kernels, then a couple without (their matmul must stay as it was).
const TYPES: &[QuantType] = &[
    QuantType::Q4_0,
    QuantType::Q4_1,
    QuantType::Q8_0,
    QuantType::Q4_K,
    QuantType::Q5_K,
    QuantType::Q6_K,
    QuantType::Q5_0,
    QuantType::Q5_1,
    QuantType::Q2_K,
    QuantType::IQ4_NL,
];
/// How many of `TYPES` (from the front) have GEMM kernels.
const N_GEMM: usize = 8;

/// Weight bytes: quantized random values, or (`raw`) random codes with finite random
/// scales (Q8_0 then has -128 codes too).
fn weight_bytes(ty: QuantType, n_in: usize, n_out: usize, seed: u64, raw: bool) -> Vec<u8> {
    let mut bytes = vec![0u8; ty.row_bytes(n_in).unwrap() * n_out];
    if raw && matches!(ty, QuantType::Q4_0 | QuantType::Q4_1 | QuantType::Q8_0 | QuantType::Q5_0 | QuantType::Q5_1) {
        let bs = ty.type_size();
        let noise = rnd(seed, bytes.len(), 512.0);
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = (noise[i] as i32 & 0xff) as u8;
        }
        let scales = rnd(seed + 1, bytes.len() / bs * 2, 0.1);
        for (k, blk) in bytes.chunks_exact_mut(bs).enumerate() {
            blk[0..2].copy_from_slice(&half::f16::from_f32(scales[2 * k]).to_bits().to_le_bytes());
            if matches!(ty, QuantType::Q4_1 | QuantType::Q5_1) {
                blk[2..4].copy_from_slice(&half::f16::from_f32(scales[2 * k + 1]).to_bits().to_le_bytes());
            }
        }
    } else {
        let w = rnd(seed, n_in * n_out, 1.0);
        quarrel_quant::quantize(ty, &w, &mut bytes).unwrap();
    }
    bytes
}

fn weight_file(ty: QuantType, n_in: usize, n_out: usize, bytes: &[u8]) -> Arc<Gguf> {
    let mut g = GgufWriter::new();
    g.add_tensor("w", &[n_in as u64, n_out as u64], ty).unwrap();
    Arc::new(Gguf::from_bytes(g.to_bytes(&[bytes]).unwrap()).unwrap())
}

/// The rows of `x` quantized to `ty`'s activation type as ggml's x86 build does, and their
/// row bytes.
fn ggml_x86_acts(ty: QuantType, n_in: usize, x: &[f32]) -> (Vec<u8>, usize) {
    let act = ty.vec_dot_type();
    let arb = act.row_bytes(n_in).unwrap();
    let mut xq = vec![0u8; arb * (x.len() / n_in)];
    for (xr, qr) in x.chunks(n_in).zip(xq.chunks_mut(arb)) {
        match simd::quantize_row_fn_ggml_x86(act) {
            Some(f) => f(xr, qr),
            None => quarrel_cpu::actquant::quantize_row(act, xr, qr).unwrap(),
        }
    }
    (xq, arb)
}

/// What every output of the matmul must be: for types with a repacked form in use
/// (`simd::repack::enabled`), its scalar reference per (row, token); else [`per_output_dot`].
fn per_output(ty: QuantType, n_in: usize, n_out: usize, w: &[u8], x: &[f32], n_tok: usize) -> Vec<f32> {
    let Some(rt) = simd::repack::enabled(ty) else {
        return per_output_dot(ty, n_in, n_out, w, x, n_tok);
    };
    let (xq, arb) = ggml_x86_acts(ty, n_in, x);
    let packed = simd::repack::repack(rt, n_in, n_out, w);
    let gb = rt.group_bytes(n_in);
    let mut out = vec![0f32; n_tok * n_out];
    for t in 0..n_tok {
        for r in 0..n_out {
            let group = &packed[r / simd::repack::R * gb..(r / simd::repack::R + 1) * gb];
            out[t * n_out + r] = simd::repack::reference_dot(rt, n_in, group, r % simd::repack::R, &xq[t * arb..(t + 1) * arb]);
        }
    }
    out
}

/// What the matmul computed before the GEMM path: the activation quantizer of ggml's x86
/// build, then the one-row kernel per (row, token).
fn per_output_dot(ty: QuantType, n_in: usize, n_out: usize, w: &[u8], x: &[f32], n_tok: usize) -> Vec<f32> {
    let (xq, arb) = ggml_x86_acts(ty, n_in, x);
    let wrb = ty.row_bytes(n_in).unwrap();
    let mut out = vec![0f32; n_tok * n_out];
    for t in 0..n_tok {
        for r in 0..n_out {
            let (wr, a) = (&w[r * wrb..(r + 1) * wrb], &xq[t * arb..(t + 1) * arb]);
            out[t * n_out + r] = match simd::dot_fn(ty) {
                Some(f) => f(n_in, wr, a),
                None => simd::reference_dot(ty, n_in, wr, a),
            };
        }
    }
    out
}

fn check(ty: QuantType, n_blocks: usize, n_out: usize, n_tok: usize, threads: usize, seed: u64, raw: bool) -> Result<(), TestCaseError> {
    let n_in = n_blocks * ty.block_size();
    let w = weight_bytes(ty, n_in, n_out, seed, raw);
    let g = weight_file(ty, n_in, n_out, &w);
    let be = CpuBackend::new(threads).unwrap();
    let wt = be.load_weight(WeightSource { gguf: &g, name: "w" }).unwrap();
    // a few large activations per row make the quantization scales differ between tokens
    let mut x = rnd(seed ^ 0x55, n_in * n_tok, 2.0);
    for (t, row) in x.chunks_mut(n_in).enumerate() {
        row[(t * 7) % n_in] *= 1.0 + t as f32;
    }
    let mut got = vec![0f32; n_tok * n_out];
    be.matmul(&wt, &x, n_tok, &mut got).unwrap();
    let want = per_output(ty, n_in, n_out, &w, &x, n_tok);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        prop_assert_eq!(
            g.to_bits(),
            w.to_bits(),
            "{} n_in {} n_out {} n_tok {} threads {}: token {} row {}: gemm {} vs dot {}",
            ty.name(),
            n_in,
            n_out,
            n_tok,
            threads,
            i / n_out,
            i % n_out,
            g,
            w
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(160))]

    #[test]
    fn gemm_matmul_is_bit_identical_to_per_output_kernels(
        ti in 0..TYPES.len(),
        n_blocks in 1usize..21,
        n_out in 1usize..41,
        n_tok in 1usize..71,
        threads in 1usize..4,
        seed in any::<u64>(),
        raw in any::<bool>(),
    ) {
        let ty = TYPES[ti];
        // K-quants have 256-element blocks: keep their rows short
        let n_blocks = if ty.block_size() > 32 { (n_blocks - 1) % 3 + 1 } else { n_blocks };
        check(ty, n_blocks, n_out, n_tok, threads, seed, raw)?;
    }
}

/// Many row panels and token groups (the task split over rows and tokens), every type.
#[test]
fn gemm_matmul_large_shapes() {
    for &ty in &TYPES[..N_GEMM] {
        for (n_blocks, n_out, n_tok, threads) in [
            (24, 301, 67, 3),
            (18, 1000, 9, 2),
            (48, 20, 130, 2),
            (2, 4 * 33, 16, 1),
            (18, 1003, 1, 3),
            (176, 77, 1, 2),
            (176, 45, 21, 2),
            (64, 8 * 37, 1, 1),
        ] {
            // the same row length in elements where the blocks are larger
            let n_blocks = (n_blocks * 32 / ty.block_size()).max(1);
            check(ty, n_blocks, n_out, n_tok, threads, 7 + n_out as u64, false).unwrap();
        }
    }
}

/// The tile kernel directly, against the one-row kernel, with all tile sizes (and rows long
/// enough for the Q6_K tile's several chunks of super-blocks, a short last chunk included).
/// The rows of `x` quantized to `ty`'s activation type (and their row bytes), and the weight
/// rows `w` packed into one panel.
fn quantized_and_packed(g: simd::Gemm, ty: QuantType, n_in: usize, w: &[u8], x: &[f32]) -> (Vec<u8>, usize, Vec<u8>) {
    let act = ty.vec_dot_type();
    let (arb, wrb) = (act.row_bytes(n_in).unwrap(), ty.row_bytes(n_in).unwrap());
    let mut xq = vec![0u8; arb * (x.len() / n_in)];
    for (xr, qr) in x.chunks(n_in).zip(xq.chunks_mut(arb)) {
        quarrel_cpu::actquant::quantize_row(act, xr, qr).unwrap();
    }
    let wrows: Vec<&[u8]> = w.chunks(wrb).collect();
    let mut wp = vec![0u8; g.weight_panel_bytes(n_in)];
    g.pack_weights(n_in, &wrows, &mut wp);
    (xq, arb, wp)
}

/// The first `nt` of the quantized activation rows `xq` (`arb` bytes each) packed by `pack`
/// into a panel of `bytes` bytes from byte 1 of the buffer returned (deliberately unaligned).
fn unaligned_panel(xq: &[u8], arb: usize, nt: usize, bytes: usize, pack: impl FnOnce(&[&[u8]], &mut [u8])) -> Vec<u8> {
    let arows: Vec<&[u8]> = xq.chunks(arb).take(nt).collect();
    let mut ap = vec![0u8; bytes + 1];
    pack(&arows, &mut ap[1..]);
    ap
}

#[test]
fn gemm_tiles_match_dot() {
    for (&ty, n_blocks) in TYPES[..N_GEMM].iter().flat_map(|ty| [(ty, 3), (ty, 11), (ty, 19)]) {
        let Some(g) = simd::gemm_fn(ty) else {
            eprintln!("no GEMM kernel for {} on this CPU / level: skipped", ty.name());
            continue;
        };
        let n_in = ty.block_size() * n_blocks;
        let w = weight_bytes(ty, n_in, GEMM_ROWS, 3, true);
        let x = rnd(4, n_in * GEMM_TOKENS, 3.0);
        let want = per_output_dot(ty, n_in, GEMM_ROWS, &w, &x, GEMM_TOKENS);
        let (xq, arb, wp) = quantized_and_packed(g, ty, n_in, &w, &x);
        for nt in 1..=GEMM_TOKENS {
            let ap = unaligned_panel(&xq, arb, nt, g.act_panel_bytes(n_in), |rows, p| g.pack_act(n_in, rows, p));
            let mut out = [[f32::NAN; GEMM_TOKENS]; GEMM_ROWS];
            g.tile(n_in, &wp, &ap[1..], nt, &mut out);
            for (r, row) in out.iter().enumerate() {
                for (t, v) in row.iter().enumerate() {
                    if t < nt {
                        assert_eq!(v.to_bits(), want[t * GEMM_ROWS + r].to_bits(), "{} nt {nt} row {r} token {t}", ty.name());
                    } else {
                        assert!(v.is_nan(), "entry past n_tok written");
                    }
                }
            }
        }
    }
}

/// The wide tile kernel (16 tokens) directly, against the one-row kernel, for every token
/// count, where the type has one.
#[test]
fn wide_tiles_match_dot() {
    use simd::GEMM_WIDE_TOKENS as WT;
    let mut checked = 0;
    for (&ty, n_blocks) in TYPES[..N_GEMM].iter().flat_map(|ty| [(ty, 1), (ty, 3), (ty, 18), (ty, 48)]) {
        let Some(g) = simd::gemm_fn(ty).filter(|g| g.has_wide()) else {
            continue;
        };
        checked += 1;
        let n_in = ty.block_size() * n_blocks;
        for raw in [false, true] {
            let w = weight_bytes(ty, n_in, GEMM_ROWS, 5 + n_blocks as u64, raw);
            let mut x = rnd(6 + n_blocks as u64, n_in * WT, 3.0);
            for (t, row) in x.chunks_mut(n_in).enumerate() {
                row[(t * 5) % n_in] *= 1.0 + 3.0 * t as f32;
            }
            let want = per_output_dot(ty, n_in, GEMM_ROWS, &w, &x, WT);
            let (xq, arb, wp) = quantized_and_packed(g, ty, n_in, &w, &x);
            for nt in 1..=WT {
                let ap = unaligned_panel(&xq, arb, nt, g.wide_act_panel_bytes(n_in), |rows, p| g.pack_act_wide(n_in, rows, p));
                // token-major rows of ld floats, the first GEMM_ROWS written
                let ld = GEMM_ROWS + 3;
                let mut out = vec![f32::NAN; WT * ld];
                g.tile_wide(n_in, &wp, &ap[1..], nt, &mut out, ld);
                for t in 0..WT {
                    for c in 0..ld {
                        let v = out[t * ld + c];
                        if t < nt && c < GEMM_ROWS {
                            assert_eq!(v.to_bits(), want[t * GEMM_ROWS + c].to_bits(), "{} raw {raw} nt {nt} row {c} token {t}", ty.name());
                        } else {
                            assert!(v.is_nan(), "entry past n_tok / GEMM_ROWS written");
                        }
                    }
                }
            }
        }
    }
    // the 32-element types in llama.cpp's order (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) have wide tiles
    // wherever their GEMM kernels exist
    let legacy = [QuantType::Q4_0, QuantType::Q4_1, QuantType::Q5_0, QuantType::Q5_1, QuantType::Q8_0];
    let expect = legacy.iter().filter(|&&t| TYPES[..N_GEMM].contains(&t) && simd::gemm_fn(t).is_some()).count() * 4;
    assert_eq!(checked, expect);
}

/// `matmul_many` (weights sharing their input: one quantization and one parallel job where the
/// kernels allow) against the per-output kernels of each weight, and against `matmul` of each
/// weight alone; a second type in the list must take the per-weight path and be right too.
fn check_many(tys: &[QuantType], n_blocks: usize, n_outs: &[usize], n_tok: usize, threads: usize, seed: u64) -> Result<(), TestCaseError> {
    let n_in = n_blocks * tys[0].block_size();
    let be = CpuBackend::new(threads).unwrap();
    let mut x = rnd(seed ^ 0x77, n_in * n_tok, 2.0);
    for (t, row) in x.chunks_mut(n_in).enumerate() {
        row[(t * 5) % n_in] *= 1.0 + t as f32;
    }
    let parts: Vec<(QuantType, usize, Vec<u8>, Arc<Gguf>)> = n_outs
        .iter()
        .enumerate()
        .map(|(i, &n_out)| {
            let ty = tys[i % tys.len()];
            let w = weight_bytes(ty, n_in, n_out, seed + i as u64, i % 2 == 1);
            let g = weight_file(ty, n_in, n_out, &w);
            (ty, n_out, w, g)
        })
        .collect();
    let ws: Vec<_> = parts.iter().map(|(_, _, _, g)| be.load_weight(WeightSource { gguf: g, name: "w" }).unwrap()).collect();
    let mut outs: Vec<Vec<f32>> = n_outs.iter().map(|&n| vec![f32::NAN; n * n_tok]).collect();
    {
        let wr: Vec<&_> = ws.iter().collect();
        let mut or: Vec<&mut Vec<f32>> = outs.iter_mut().collect();
        be.matmul_many(&wr, &x, n_tok, &mut or).unwrap();
    }
    for (i, ((ty, n_out, w, _), got)) in parts.iter().zip(&outs).enumerate() {
        let want = per_output(*ty, n_in, *n_out, w, &x, n_tok);
        let mut alone = vec![0f32; n_out * n_tok];
        be.matmul(&ws[i], &x, n_tok, &mut alone).unwrap();
        for (k, ((g, w), a)) in got.iter().zip(&want).zip(&alone).enumerate() {
            prop_assert_eq!(
                g.to_bits(),
                w.to_bits(),
                "{} weight {} n_in {} n_out {} n_tok {} threads {}: token {} row {}",
                ty.name(),
                i,
                n_in,
                n_out,
                n_tok,
                threads,
                k / n_out,
                k % n_out
            );
            prop_assert_eq!(g.to_bits(), a.to_bits(), "matmul_many vs matmul: weight {} output {}", i, k);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn matmul_many_is_bit_identical_to_each_weight_alone(
        ti in 0..N_GEMM,
        mixed in any::<bool>(),
        n_blocks in 1usize..21,
        n_outs in proptest::collection::vec(1usize..70, 1..4),
        n_tok in 1usize..40,
        threads in 1usize..4,
        seed in any::<u64>(),
    ) {
        let ty = TYPES[ti];
        let n_blocks = if ty.block_size() > 32 { (n_blocks - 1) % 3 + 1 } else { n_blocks };
        // a second type with the same block size where asked (the per-weight path)
        let other = if ty.block_size() == 32 { QuantType::Q8_0 } else { QuantType::Q6_K };
        let tys: Vec<QuantType> = if mixed && other != ty { vec![ty, other] } else { vec![ty] };
        check_many(&tys, n_blocks, &n_outs, n_tok, threads, seed)?;
    }
}

/// The decode-step shapes of a SmolLM2-size layer (Q/K/V, gate/up) at 16 and 33 tokens.
#[test]
fn matmul_many_layer_shapes() {
    for ty in [QuantType::Q4_1, QuantType::Q8_0, QuantType::Q4_0] {
        check_many(&[ty], 18, &[576, 192, 192], 16, 2, 11).unwrap();
        check_many(&[ty], 18, &[1536, 1536], 33, 3, 12).unwrap();
    }
}
