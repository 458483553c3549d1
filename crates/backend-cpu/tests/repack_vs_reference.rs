//! The repacked (16-row interleaved) Q4_0 / Q4_K / IQ4_NL kernels (AVX-512 VNNI and AVX2)
//! against their scalar twin
//! `simd::repack::reference_dot` (bit for bit), the twin against `quarrel_quant::vec_dot`
//! (same integer sums, different float order: close), and the backend's repacked matmul:
//! a token's outputs have the same bits whichever tokens share the call.

mod common;
use common::rnd;
use proptest::prelude::*;
use quarrel_core::{Backend, QuantType, Route, WeightSource};
use quarrel_cpu::simd::repack::{self, ActAux, RepackTy, R, TILE_TOKENS};
use quarrel_cpu::CpuBackend;
use quarrel_gguf::{Gguf, GgufWriter};
use std::sync::Arc;

const TYPES: [(RepackTy, QuantType); 3] =
    [(RepackTy::Q4_0, QuantType::Q4_0), (RepackTy::Q4_K, QuantType::Q4_K), (RepackTy::IQ4_NL, QuantType::IQ4_NL)];

/// Random codes (every byte value) with random finite scales.
fn raw_weights(ty: QuantType, n_in: usize, n_out: usize, seed: u64) -> Vec<u8> {
    let bs = ty.type_size();
    let mut bytes: Vec<u8> = rnd(seed, ty.row_bytes(n_in).unwrap() * n_out, 512.0).iter().map(|&v| (v as i32 & 0xff) as u8).collect();
    let scales = rnd(seed + 1, bytes.len() / bs * 2, 0.1);
    for (k, blk) in bytes.chunks_exact_mut(bs).enumerate() {
        blk[0..2].copy_from_slice(&half::f16::from_f32(scales[2 * k]).to_bits().to_le_bytes());
        if ty == QuantType::Q4_K {
            blk[2..4].copy_from_slice(&half::f16::from_f32(scales[2 * k + 1]).to_bits().to_le_bytes());
        }
    }
    bytes
}

fn quantized_acts(ty: QuantType, n_in: usize, n_tok: usize, seed: u64) -> Vec<u8> {
    let act = ty.vec_dot_type();
    let mut x = rnd(seed, n_in * n_tok, 2.0);
    for (t, row) in x.chunks_mut(n_in).enumerate() {
        row[(t * 5) % n_in] *= 3.0 + t as f32;
    }
    let arb = act.row_bytes(n_in).unwrap();
    let mut xq = vec![0u8; arb * n_tok];
    for (xr, qr) in x.chunks(n_in).zip(xq.chunks_mut(arb)) {
        quarrel_cpu::actquant::quantize_row(act, xr, qr).unwrap();
    }
    xq
}

fn check_tile(ti: usize, nb: usize, n_tok: usize, seed: u64) -> Result<(), TestCaseError> {
    let (rt, ty) = TYPES[ti];
    let nb = if rt == RepackTy::Q4_K { (nb - 1) % 5 + 1 } else { nb };
    let n_in = nb * rt.qk();
    let w = raw_weights(ty, n_in, R, seed);
    let packed = repack::repack(rt, n_in, R, &w);
    let xq = quantized_acts(ty, n_in, n_tok, seed ^ 9);
    let arb = ty.vec_dot_type().row_bytes(n_in).unwrap();
    let aux = repack::act_aux_rows(rt, n_in, &xq, arb);
    let acts: Vec<(&[u8], &[ActAux])> = xq.chunks(arb).zip(&aux).map(|(a, x)| (a, x.as_slice())).collect();
    let mut out = [[f32::NAN; R]; TILE_TOKENS];
    repack::tile(rt, n_in, &packed, &acts, &mut out);
    // every SIMD level this CPU has gives the same bits
    for level in quarrel_cpu::simd::available_levels() {
        let mut o = [[f32::NAN; R]; TILE_TOKENS];
        repack::tile_for(level, rt, n_in, &packed, &acts, &mut o);
        for t in 0..n_tok {
            for i in 0..R {
                prop_assert_eq!(o[t][i].to_bits(), out[t][i].to_bits(), "{:?} level {:?} token {} row {}", rt, level, t, i);
            }
        }
    }
    for t in 0..n_tok {
        let a = &xq[t * arb..(t + 1) * arb];
        for i in 0..R {
            let want = repack::reference_dot(rt, n_in, &packed, i, a);
            prop_assert_eq!(out[t][i].to_bits(), want.to_bits(), "{:?} nb {} token {} row {}: {} vs {}", rt, nb, t, i, out[t][i], want);
            // the same integer sums as the plain vec_dot, in another float order
            let rb = ty.row_bytes(n_in).unwrap();
            let plain = quarrel_quant::vec_dot(ty, &w[i * rb..(i + 1) * rb], a, n_in).unwrap();
            let (mut wf, mut af) = (vec![0f32; n_in], vec![0f32; n_in]);
            quarrel_quant::dequantize(ty, &w[i * rb..(i + 1) * rb], &mut wf).unwrap();
            quarrel_quant::dequantize(ty.vec_dot_type(), a, &mut af).unwrap();
            let mag: f64 = wf.iter().zip(&af).map(|(p, q)| (*p as f64 * *q as f64).abs()).sum();
            prop_assert!(
                ((plain - want).abs() as f64) <= 1e-5 * mag + 1e-6,
                "{:?}: repacked {} vs vec_dot {} (magnitude {})",
                rt,
                want,
                plain,
                mag
            );
        }
    }
    for row in &out[n_tok..] {
        prop_assert!(row.iter().all(|v| v.is_nan()), "rows past n_tok written");
    }
    Ok(())
}

fn weight_file(ty: QuantType, n_in: usize, n_out: usize, bytes: &[u8]) -> Arc<Gguf> {
    let mut g = GgufWriter::new();
    g.add_tensor("w", &[n_in as u64, n_out as u64], ty).unwrap();
    Arc::new(Gguf::from_bytes(g.to_bytes(&[bytes]).unwrap()).unwrap())
}

/// The backend's matmul (Q4_0 takes the repacked path where the kernels run): all tokens
/// at once == each token alone, bit for bit, and == the scalar twin.
fn check_batched(ti: usize, nb: usize, n_out: usize, n_tok: usize, threads: usize, seed: u64) -> Result<(), TestCaseError> {
    let (rt, ty) = TYPES[ti];
    let nb = if rt == RepackTy::Q4_K { (nb - 1) % 3 + 1 } else { nb };
    let n_in = nb * rt.qk();
    let w = raw_weights(ty, n_in, n_out, seed);
    let g = weight_file(ty, n_in, n_out, &w);
    let be = CpuBackend::new(threads).unwrap();
    let wt = be.load_weight(WeightSource { gguf: &g, name: "w" }).unwrap();
    let x = rnd(seed ^ 3, n_in * n_tok, 2.0);
    let mut all = vec![0f32; n_tok * n_out];
    be.matmul(&wt, &x, n_tok, &mut all).unwrap();
    let packed = repack::repack(rt, n_in, n_out, &w);
    let gb = rt.group_bytes(n_in);
    let act = ty.vec_dot_type();
    for t in 0..n_tok {
        let mut one = vec![0f32; n_out];
        be.matmul(&wt, &x[t * n_in..(t + 1) * n_in].to_vec(), 1, &mut one).unwrap();
        let mut xq = vec![0u8; act.row_bytes(n_in).unwrap()];
        quarrel_cpu::actquant::quantize_row(act, &x[t * n_in..(t + 1) * n_in], &mut xq).unwrap();
        for r in 0..n_out {
            prop_assert_eq!(
                all[t * n_out + r].to_bits(),
                one[r].to_bits(),
                "token {} row {}: batched {} vs alone {}",
                t,
                r,
                all[t * n_out + r],
                one[r]
            );
            if repack::enabled(ty).is_some() {
                let want = repack::reference_dot(rt, n_in, &packed[r / R * gb..(r / R + 1) * gb], r % R, &xq);
                prop_assert_eq!(one[r].to_bits(), want.to_bits(), "token {} row {}: {} vs twin {}", t, r, one[r], want);
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn tiles_match_the_scalar_twin(ti in 0usize..TYPES.len(), nb in 1usize..40, n_tok in 1usize..=TILE_TOKENS, seed in any::<u64>()) {
        check_tile(ti, nb, n_tok, seed)?;
    }

    #[test]
    fn batched_equals_alone(ti in 0usize..TYPES.len(), nb in 1usize..12, n_out in 1usize..70, n_tok in 1usize..21, threads in 1usize..4, seed in any::<u64>()) {
        check_batched(ti, nb, n_out, n_tok, threads, seed)?;
    }
}

#[test]
fn large_shapes_batched_equals_alone() {
    for ti in 0..TYPES.len() {
        for (nb, n_out, n_tok, threads) in [(64, 256, 19, 3), (176, 48, 9, 2), (64, 16 * 67, 3, 1)] {
            check_batched(ti, nb, n_out, n_tok, threads, nb as u64).unwrap();
        }
    }
}

#[test]
fn repack_layout_round_trips() {
    // every code and scale of the source appears where the layout says
    for (rt, ty) in [TYPES[0], TYPES[2]] {
        let (n_in, n_out) = (96, 21);
        let w = raw_weights(ty, n_in, n_out, 5);
        let p = repack::repack(rt, n_in, n_out, &w);
        assert_eq!(p.len(), n_out.div_ceil(R) * rt.group_bytes(n_in));
        let (wb, gb) = (rt.wb(), rt.group_block());
        for r in 0..n_out {
            for b in 0..3 {
                let src = &w[(r * 3 + b) * wb..(r * 3 + b + 1) * wb];
                let blk = &p[((r / R) * 3 + b) * gb..((r / R) * 3 + b + 1) * gb];
                let i = r % R;
                assert_eq!(&blk[rt.codes() + 2 * i..rt.codes() + 2 * i + 2], &src[0..2]);
                let q = &src[wb - rt.codes() / R..];
                for (j, &c) in q.iter().enumerate() {
                    let got = blk[(j / 4) * 4 * R + 4 * i + j % 4];
                    assert_eq!(got, c, "{rt:?} row {r} block {b} byte {j}");
                }
            }
        }
    }
}

/// MoE: expert views share their 3-D tensor's repacked copy (experts of 32 rows, on group
/// boundaries) or take the vec_dot path (24 rows); either way a route's outputs have the same
/// bits batched and alone, and on the repacked path they equal the scalar twin.
#[test]
fn moe_experts_use_the_shared_repacked_copy() {
    for (rt, ty) in [TYPES[0], TYPES[1]] {
        for n_out in [32usize, 24] {
            let (n_in, n_exp, n_tok) = (2 * rt.qk(), 4usize, 6usize);
            let w = raw_weights(ty, n_in, n_out * n_exp, 11);
            let mut g = GgufWriter::new();
            g.add_tensor("w", &[n_in as u64, n_out as u64, n_exp as u64], ty).unwrap();
            let gg = Arc::new(Gguf::from_bytes(g.to_bytes(&[&w]).unwrap()).unwrap());
            let be = CpuBackend::new(2).unwrap();
            let wt = be.load_weight(WeightSource { gguf: &gg, name: "w" }).unwrap();
            let x = rnd(5, n_in * n_tok, 2.0);
            let routes: Vec<Route> = (0..n_tok)
                .flat_map(|t| [(t % n_exp) as u32, ((t + 1) % n_exp) as u32].map(|e| Route { token: t as u32, expert: e, weight: 0.5 }))
                .collect();
            let mut all = vec![0f32; routes.len() * n_out];
            be.moe_matmul(&wt, n_exp, &x, &routes, true, &mut all).unwrap();
            let packed = repack::repack(rt, n_in, n_out * n_exp, &w);
            let act = ty.vec_dot_type();
            for (i, r) in routes.iter().enumerate() {
                let mut one = vec![0f32; n_out];
                be.moe_matmul(&wt, n_exp, &x, std::slice::from_ref(r), true, &mut one).unwrap();
                let t = r.token as usize;
                let mut xq = vec![0u8; act.row_bytes(n_in).unwrap()];
                quarrel_cpu::actquant::quantize_row(act, &x[t * n_in..(t + 1) * n_in], &mut xq).unwrap();
                let gb = rt.group_bytes(n_in);
                for o in 0..n_out {
                    assert_eq!(all[i * n_out + o].to_bits(), one[o].to_bits(), "{rt:?} n_out {n_out}: route {i} row {o}: batched vs alone");
                    if n_out % R == 0 && repack::enabled(ty).is_some() {
                        let row = r.expert as usize * n_out + o;
                        let want = repack::reference_dot(rt, n_in, &packed[row / R * gb..(row / R + 1) * gb], row % R, &xq);
                        assert_eq!(one[o].to_bits(), want.to_bits(), "{rt:?}: route {i} row {o}: {} vs twin {want}", one[o]);
                    }
                }
            }
        }
    }
}
