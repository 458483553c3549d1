//! Backend ops against plain reference computations: matmul (vs dequantized f32 math),
//! attention (vs a naive softmax over the cache), paged layout independence.

mod common;
use quarrel_core::{AttnParams, Backend, KvSpec, KvType, QuantType, WeightSource};
use quarrel_cpu::CpuBackend;
use quarrel_gguf::{Gguf, GgufWriter};
use std::sync::Arc;

fn rnd(seed: u64, n: usize, scale: f32) -> Vec<f32> {
    common::rnd_from_state(seed, n, scale)
}

use common::nmse;

fn weight_file(ty: QuantType, n_in: usize, n_out: usize, w: &[f32]) -> Arc<Gguf> {
    let mut g = GgufWriter::new();
    g.add_tensor("w", &[n_in as u64, n_out as u64], ty).unwrap();
    let mut bytes = vec![0u8; ty.row_bytes(n_in).unwrap() * n_out];
    quarrel_quant::quantize(ty, w, &mut bytes).unwrap();
    Arc::new(Gguf::from_bytes(g.to_bytes(&[&bytes]).unwrap()).unwrap())
}

#[test]
fn matmul_matches_dequantized_reference_for_every_type() {
    let be = CpuBackend::new(3).unwrap();
    for &ty in QuantType::ALL {
        if ty == QuantType::Q8_1 || ty == QuantType::Q8_K {
            continue; // activation-only formats
        }
        let (n_in, n_out, n_tok) = (512, 37, 5);
        let w = rnd(ty.ggml_id() as u64 + 3, n_in * n_out, 1.0);
        let g = weight_file(ty, n_in, n_out, &w);
        let Ok(wt) = be.load_weight(WeightSource { gguf: &g, name: "w" }) else { continue };
        let (_, bytes) = g.tensor("w").unwrap();
        let mut wd = vec![0f32; n_in * n_out];
        quarrel_quant::dequantize(ty, bytes, &mut wd).unwrap();
        let x = rnd(99, n_in * n_tok, 2.0);
        let mut out = vec![0f32; n_tok * n_out];
        be.matmul(&wt, &x, n_tok, &mut out).unwrap();
        let mut want = vec![0f32; n_tok * n_out];
        for t in 0..n_tok {
            for r in 0..n_out {
                want[t * n_out + r] = (0..n_in).map(|i| wd[r * n_in + i] * x[t * n_in + i]).sum();
            }
        }
        let e = nmse(&want, &out);
        // activations are quantized to 8 bits: a small, bounded error
        assert!(e < 1e-3, "{}: nmse {e}", ty.name());
    }
}

#[test]
fn paged_attention_matches_naive_softmax() {
    let be = CpuBackend::new(2).unwrap();
    let (nh, nkv, hd, bs) = (4, 2, 16, 4);
    let spec = KvSpec { n_layer: 1, n_kv_head: nkv, head_dim: hd, block_size: bs, n_blocks: 8, ty: KvType::F32 };
    let mut kv = be.alloc_kv(&spec).unwrap();
    let n = 11;
    // scattered, non-contiguous blocks
    let table = vec![5, 2, 7];
    let batch = common::seq_batch(0, n, table);
    let k = rnd(1, n * nkv * hd, 2.0);
    let v = rnd(2, n * nkv * hd, 2.0);
    let q = rnd(3, n * nh * hd, 2.0);
    be.kv_store(&mut kv, 0, &k, &v, &batch).unwrap();
    for window in [None, Some(3)] {
        let p = AttnParams { n_head: nh, n_kv_head: nkv, head_dim: hd, scale: 0.25, sliding_window: window, softcap: None };
        let mut out = vec![0f32; q.len()];
        be.attention(&q, &kv, 0, &batch, &p, None, &mut out).unwrap();
        let mut want = vec![0f32; q.len()];
        for t in 0..n {
            for h in 0..nh {
                let kh = h / (nh / nkv);
                let lo = window.map_or(0, |w: usize| (t + 1).saturating_sub(w));
                let scores: Vec<f32> =
                    (lo..=t).map(|j| (0..hd).map(|d| q[(t * nh + h) * hd + d] * k[(j * nkv + kh) * hd + d]).sum::<f32>() * 0.25).collect();
                let m = scores.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                let e: Vec<f32> = scores.iter().map(|s| (s - m).exp()).collect();
                let z: f32 = e.iter().sum();
                for d in 0..hd {
                    want[(t * nh + h) * hd + d] = (lo..=t).map(|j| e[j - lo] / z * v[(j * nkv + kh) * hd + d]).sum();
                }
            }
        }
        let err = nmse(&want, &out);
        assert!(err < 1e-10, "window {window:?}: nmse {err}");
    }
}

#[test]
fn bad_shapes_are_errors_not_panics() {
    let be = CpuBackend::new(1).unwrap();
    let g = weight_file(QuantType::F32, 32, 2, &rnd(1, 64, 1.0));
    let w = be.load_weight(WeightSource { gguf: &g, name: "w" }).unwrap();
    let mut out = vec![0f32; 2];
    assert!(be.matmul(&w, &vec![0.0; 31], 1, &mut out).is_err());
    assert!(be.load_weight(WeightSource { gguf: &g, name: "missing" }).is_err());
    let mut e = vec![0f32; 32];
    // embedding of an out-of-vocabulary id
    assert!(be.embed(&w, &[5], &mut e).is_err());
}

/// RMSNorm, RoPE and SwiGLU on one thread and on a pool (which runs them in parallel from 8
/// rows on): the same bits for every row count.
#[test]
fn row_ops_are_bit_identical_on_any_thread_count() {
    use quarrel_core::{RopeParams, RopeScaling, RopeStyle};
    let (one, pool) = (CpuBackend::new(1).unwrap(), CpuBackend::new(3).unwrap());
    let d = 576;
    let mut g = GgufWriter::new();
    g.add_tensor("g", &[d as u64], QuantType::F32).unwrap();
    let gw: Vec<u8> = rnd(5, d, 2.0).iter().flat_map(|v| v.to_le_bytes()).collect();
    let gg = Arc::new(Gguf::from_bytes(g.to_bytes(&[&gw]).unwrap()).unwrap());
    let (w1, w3) =
        (one.load_weight(WeightSource { gguf: &gg, name: "g" }).unwrap(), pool.load_weight(WeightSource { gguf: &gg, name: "g" }).unwrap());
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for rows in [1usize, 3, 7, 8, 9, 16, 37] {
        let x = rnd(rows as u64, rows * d, 3.0);
        let (mut a, mut b) = (vec![0f32; x.len()], vec![0f32; x.len()]);
        one.rms_norm(&x, &w1, 1e-5, &mut a).unwrap();
        pool.rms_norm(&x, &w3, 1e-5, &mut b).unwrap();
        assert_eq!(bits(&a), bits(&b), "rms_norm, {rows} rows");
        let positions: Vec<u32> = (0..rows as u32).map(|i| i * 7 + 3).collect();
        for style in [RopeStyle::Normal, RopeStyle::Neox] {
            let p = RopeParams { style, n_rot: 64, freq_base: 10000.0, freq_scale: 1.0, freq_factors: None, scaling: RopeScaling::NONE };
            let (mut a, mut b) = (x.clone(), x.clone());
            one.rope(&mut a, &positions, 9, 64, &p).unwrap();
            pool.rope(&mut b, &positions, 9, 64, &p).unwrap();
            assert_eq!(bits(&a), bits(&b), "rope {style:?}, {rows} rows");
        }
        // SwiGLU over rows of 1536 (and a ragged length: the scalar tail)
        for n in [rows * 1536, rows * 1536 + 5] {
            let (gt, up) = (rnd(11, n, 8.0), rnd(12, n, 2.0));
            let (mut a, mut b) = (vec![0f32; n], vec![0f32; n]);
            one.swiglu(&gt, &up, &mut a).unwrap();
            pool.swiglu(&gt, &up, &mut b).unwrap();
            assert_eq!(bits(&a), bits(&b), "swiglu, {n} values");
        }
    }
}

/// alloc zeroes and upload / download copy exactly, also where large buffers are filled in
/// parallel pieces.
#[test]
fn buffers_are_zeroed_and_copied_on_any_thread_count() {
    for threads in [1, 2, 3] {
        let be = CpuBackend::new(threads).unwrap();
        for n in [0usize, 1, 100, (1 << 14) - 1, 1 << 14, (1 << 14) + 8191, 3 * (1 << 13) + 5, 200_000] {
            let z = be.alloc(n).unwrap();
            assert!(z.len() == n && z.iter().all(|v| v.to_bits() == 0), "alloc {n}, {threads} threads");
            let x = rnd(n as u64, n, 4.0);
            let up = be.upload(&x).unwrap();
            let down = be.download(&up).unwrap();
            assert!(down.len() == n && down.iter().zip(&x).all(|(a, b)| a.to_bits() == b.to_bits()), "copy {n}, {threads} threads");
        }
    }
}
