//! Quantized KV caches (Q8_0, Q4_0): attention over a quantized cache equals attention over
//! an f32 cache holding the same values rounded through that quantization (Hadamard-rotated
//! per head in power-of-two blocks, as the cache stores them), for random
//! shapes, block sizes, scattered block tables and thread counts. Keys are stored less the
//! layer's key offset (the mean key of the first store), added back when read.

mod common;
use proptest::prelude::*;
use quarrel_core::{AttnParams, Backend, KvSpec, KvType};
use quarrel_cpu::CpuBackend;

fn rnd(seed: u64, n: usize) -> Vec<f32> {
    common::rnd(seed, n, 4.0)
}

/// What the cache should hold: each 32-block rotated, quantized, dequantized, rotated back.
fn roundtrip(ty: KvType, x: &[f32], hd: usize) -> Vec<f32> {
    use quarrel_quant::rotate::{hadamard_blocks, rotation_size};
    let rot = rotation_size(hd).unwrap();
    x.chunks(hd)
        .flat_map(|h| {
            let mut r = h.to_vec();
            hadamard_blocks(&mut r, rot);
            let q = match ty {
                KvType::Q4_0 => {
                    let mut q = vec![0u8; ty.row_bytes(hd).unwrap()];
                    quarrel_quant::q4_0::quantize_row_mse(&r, &mut q);
                    q
                }
                _ => quarrel_quant::quantize_to_vec(ty.quant_type(), &r).unwrap(),
            };
            let mut d = quarrel_quant::dequantize_to_vec(ty.quant_type(), &q, hd).unwrap();
            hadamard_blocks(&mut d, rot);
            d
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
    #[test]
    fn quantized_cache_equals_f32_cache_of_rounded_values(
        seed in any::<u64>(), n in 1usize..40, hd_blocks in 1usize..4, nkv in 1usize..3, group in 1usize..3,
        bs in 1usize..9, threads in 1usize..4, q4 in any::<bool>(),
    ) {
        let ty = if q4 { KvType::Q4_0 } else { KvType::Q8_0 };
        let hd = 32 * hd_blocks;
        let nh = nkv * group;
        let be = CpuBackend::new(threads).unwrap();
        let n_blocks = n.div_ceil(bs) * 2 + 1;
        // a scattered block table
        let table: Vec<u32> = (0..n.div_ceil(bs) as u32).map(|i| (i * 2 + 1) % n_blocks as u32).collect();
        let batch = common::seq_batch(0, n, table);
        let (k, v, q) = (rnd(seed, n * nkv * hd), rnd(seed ^ 1, n * nkv * hd), rnd(seed ^ 2, n * nh * hd));
        let p = AttnParams { n_head: nh, n_kv_head: nkv, head_dim: hd, scale: 0.125, sliding_window: None, softcap: None };
        let run = |ty: KvType, k: &[f32], v: &[f32]| {
            let spec = KvSpec { n_layer: 1, n_kv_head: nkv, head_dim: hd, block_size: bs, n_blocks, ty };
            let mut kv = be.alloc_kv(&spec).unwrap();
            be.kv_store(&mut kv, 0, &k.to_vec(), &v.to_vec(), &batch).unwrap();
            let mut out = vec![0f32; q.len()];
            be.attention(&q, &kv, 0, &batch, &p, None, &mut out).unwrap();
            out
        };
        let got = run(ty, &k, &v);
        // keys: the per-channel mean of this (first) store is taken out and added back
        let row = nkv * hd;
        let mean: Vec<f32> = (0..row).map(|c| (k.iter().skip(c).step_by(row).map(|&x| x as f64).sum::<f64>() / n as f64) as f32).collect();
        let shifted: Vec<f32> = k.iter().enumerate().map(|(i, x)| x - mean[i % row]).collect();
        let k_back: Vec<f32> = roundtrip(ty, &shifted, hd).iter().enumerate().map(|(i, x)| x + mean[i % row]).collect();
        let want = run(KvType::F32, &k_back, &roundtrip(ty, &v, hd));
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            prop_assert!((a - b).abs() <= 2e-5 * (1.0 + b.abs()), "{}: element {} {} vs {}", ty.name(), i, a, b);
        }
    }
}

#[test]
fn quantized_cache_needs_head_dim_multiple_of_32() {
    let be = CpuBackend::new(1).unwrap();
    let spec = KvSpec { n_layer: 1, n_kv_head: 1, head_dim: 48, block_size: 4, n_blocks: 2, ty: KvType::Q8_0 };
    assert!(be.alloc_kv(&spec).is_err());
}
