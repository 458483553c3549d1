//! F16 matmuls on the matrix units (`CpuBackend::set_matrix_units`, `simd::amx`) against the
//! plain twin `simd::amx::matmul_reference` (f64 sums of the F16-rounded operands), for random
//! shapes (ragged inputs, rows and tokens), value ranges and thread counts; and every token's
//! outputs bit-identical whatever tokens share its matmul. Skipped on CPUs without AMX.

mod common;
use common::rnd;
use proptest::prelude::*;
use quarrel_core::{Backend, QuantType, WeightSource};
use quarrel_cpu::simd::amx;
use quarrel_cpu::CpuBackend;
use quarrel_gguf::{Gguf, GgufWriter};
use std::sync::Arc;

fn f16_weight(n_in: usize, n_out: usize, seed: u64, scale: f32) -> (Arc<Gguf>, Vec<u8>) {
    let w = rnd(seed, n_in * n_out, scale);
    let mut bytes = vec![0u8; n_in * n_out * 2];
    quarrel_quant::quantize(QuantType::F16, &w, &mut bytes).unwrap();
    let mut g = GgufWriter::new();
    g.add_tensor("w", &[n_in as u64, n_out as u64], QuantType::F16).unwrap();
    (Arc::new(Gguf::from_bytes(g.to_bytes(&[&bytes]).unwrap()).unwrap()), bytes)
}

fn matrix_backend(threads: usize) -> CpuBackend {
    let be = CpuBackend::new(threads).unwrap();
    be.set_matrix_units(true);
    be
}

/// `|got - want|` within the dropped `xl wl` terms (at most 2^-16 of each product) and f32
/// summation error (a few ulps of the sum of the products' sizes).
fn check(n_in: usize, n_out: usize, n_tok: usize, threads: usize, seed: u64, scale: f32) -> Result<(), TestCaseError> {
    let (g, w) = f16_weight(n_in, n_out, seed, scale);
    let be = matrix_backend(threads);
    let wt = be.load_weight(WeightSource { gguf: &g, name: "w" }).unwrap();
    let mut x = rnd(seed ^ 0x55, n_in * n_tok, 2.0);
    for (t, row) in x.chunks_mut(n_in).enumerate() {
        row[(t * 7) % n_in] *= 1.0 + t as f32;
    }
    let mut got = vec![0f32; n_tok * n_out];
    be.matmul(&wt, &x, n_tok, &mut got).unwrap();
    let mut want = vec![0f32; n_tok * n_out];
    amx::matmul_reference(&x, n_in, &w, n_out, n_tok, &mut want);
    let mut abs = vec![0f32; n_tok * n_out];
    let xa: Vec<f32> = x.iter().map(|v| v.abs()).collect();
    let wa: Vec<u8> = w.chunks_exact(2).flat_map(|h| [h[0], h[1] & 0x7f]).collect();
    amx::matmul_reference(&xa, n_in, &wa, n_out, n_tok, &mut abs);
    for i in 0..n_tok * n_out {
        let tol = abs[i] * (1.6e-5 + 2e-6 * (n_in as f32).sqrt()) + 1e-30;
        prop_assert!(
            (got[i] - want[i]).abs() <= tol,
            "n_in {} n_out {} n_tok {} threads {}: token {} row {}: amx {} vs reference {} (tolerance {})",
            n_in,
            n_out,
            n_tok,
            threads,
            i / n_out,
            i % n_out,
            got[i],
            want[i],
            tol
        );
    }
    // each token alone: the same bits
    for t in [0, n_tok / 2, n_tok - 1] {
        let mut one = vec![0f32; n_out];
        be.matmul(&wt, &x[t * n_in..(t + 1) * n_in].to_vec(), 1, &mut one).unwrap();
        prop_assert!(
            one.iter().zip(&got[t * n_out..(t + 1) * n_out]).all(|(a, b)| a.to_bits() == b.to_bits()),
            "token {} alone differs",
            t
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn amx_f16_matmul_matches_the_reference(
        n_in in 1usize..200,
        n_out in 1usize..80,
        n_tok in 1usize..70,
        threads in 1usize..4,
        seed in any::<u64>(),
        scale_exp in -12i32..12,
    ) {
        if !amx::available() {
            return Ok(());
        }
        check(n_in, n_out, n_tok, threads, seed, 2f32.powi(scale_exp))?;
    }
}

#[test]
fn amx_f16_matmul_on_model_shapes() {
    if !amx::available() {
        eprintln!("no AMX on this CPU: skipped");
        return;
    }
    // nomic-embed / BERT-base: attention in, feed-forward in and out
    for (n_in, n_out, n_tok) in [(768, 768, 100), (768, 3072, 33), (3072, 768, 64)] {
        check(n_in, n_out, n_tok, 2, n_in as u64 + n_tok as u64, 0.05).unwrap();
    }
}

#[test]
fn the_backend_says_whether_it_uses_matrix_units() {
    let be = CpuBackend::new(1).unwrap();
    assert!(!be.matrix_units(), "off unless asked for");
    be.set_matrix_units(true);
    assert_eq!(be.matrix_units(), amx::available());
}

/// Attention on the matrix units (f16 cache) against a naive f64 softmax over the same keys
/// and values, for sequences whose tokens are causal (position = index) or all at the last
/// position (an encoder's text), several at once; each sequence alone gives the same bits.
fn check_attention(
    nkv: usize,
    group: usize,
    hd: usize,
    lens: &[usize],
    causal: bool,
    threads: usize,
    seed: u64,
) -> Result<(), TestCaseError> {
    use quarrel_core::{AttnParams, ForwardBatch, KvSpec, KvType, SeqBatch};
    let be = matrix_backend(threads);
    let nh = nkv * group;
    let bs = 16;
    let n_blocks: usize = lens.iter().map(|l| l.div_ceil(bs)).sum();
    let spec = KvSpec { n_layer: 1, n_kv_head: nkv, head_dim: hd, block_size: bs, n_blocks, ty: KvType::F16 };
    let mut kv = be.alloc_kv(&spec).unwrap();
    // blocks handed out back to front, so that a sequence's blocks are not in order in the pool
    let mut next = n_blocks;
    let tables: Vec<Vec<u32>> = lens
        .iter()
        .map(|l| {
            (0..l.div_ceil(bs))
                .map(|_| {
                    next -= 1;
                    next as u32
                })
                .collect()
        })
        .collect();
    let row = nkv * hd;
    let (mut ks, mut vs) = (vec![], vec![]);
    let mut start = 0;
    let mut seqs = vec![];
    let mut positions = vec![];
    for (s, &l) in lens.iter().enumerate() {
        let (k, v) = (rnd(seed + 10 + s as u64, l * row, 2.0), rnd(seed + 50 + s as u64, l * row, 2.0));
        let store = ForwardBatch {
            tokens: vec![0; l],
            positions: (0..l as u32).collect(),
            seqs: vec![SeqBatch { start: 0, len: l, block_table: tables[s].clone() }],
            logits_rows: vec![],
            state_slots: vec![],
        };
        be.kv_store(&mut kv, 0, &k, &v, &store).unwrap();
        ks.push(k);
        vs.push(v);
        seqs.push(SeqBatch { start, len: l, block_table: tables[s].clone() });
        positions.extend((0..l as u32).map(|i| if causal { i } else { l as u32 - 1 }));
        start += l;
    }
    let n_tok = start;
    let batch =
        ForwardBatch { tokens: vec![0; n_tok], positions: positions.clone(), seqs: seqs.clone(), logits_rows: vec![], state_slots: vec![] };
    let p = AttnParams { n_head: nh, n_kv_head: nkv, head_dim: hd, scale: 1.0 / (hd as f32).sqrt(), sliding_window: None, softcap: None };
    let q = rnd(seed ^ 7, n_tok * nh * hd, 2.0);
    let mut out = vec![0f32; q.len()];
    be.attention(&q, &kv, 0, &batch, &p, None, &mut out).unwrap();
    let r16 = |x: f32| half::f16::from_f32(x).to_f32() as f64;
    for (s, seq) in seqs.iter().enumerate() {
        for i in 0..seq.len {
            let t = seq.start + i;
            let seen = positions[t] as usize + 1;
            for h in 0..nh {
                let kh = h / group;
                let qv = &q[(t * nh + h) * hd..][..hd];
                let sc: Vec<f64> = (0..seen)
                    .map(|j| (0..hd).map(|d| qv[d] as f64 * r16(ks[s][(j * nkv + kh) * hd + d])).sum::<f64>() * p.scale as f64)
                    .collect();
                let m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = sc.iter().map(|x| (x - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for d in 0..hd {
                    let want: f64 = (0..seen).map(|j| e[j] / z * r16(vs[s][(j * nkv + kh) * hd + d])).sum();
                    let got = out[(t * nh + h) * hd + d] as f64;
                    // values in [-2, 2]; queries and probabilities keep 16 significant bits
                    prop_assert!((got - want).abs() <= 2e-5, "seq {} token {} head {} dim {}: {} vs {}", s, i, h, d, got, want);
                }
            }
        }
        // alone: the same bits
        let one = ForwardBatch {
            tokens: vec![0; seq.len],
            positions: positions[seq.start..seq.start + seq.len].to_vec(),
            seqs: vec![SeqBatch { start: 0, ..seq.clone() }],
            logits_rows: vec![],
            state_slots: vec![],
        };
        let qs = q[seq.start * nh * hd..(seq.start + seq.len) * nh * hd].to_vec();
        let mut o = vec![0f32; qs.len()];
        be.attention(&qs, &kv, 0, &one, &p, None, &mut o).unwrap();
        prop_assert!(o.iter().zip(&out[seq.start * nh * hd..]).all(|(a, b)| a.to_bits() == b.to_bits()), "sequence {} alone differs", s);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn amx_attention_matches_a_naive_softmax(
        nkv in 1usize..3,
        group in 1usize..3,
        hd8 in 1usize..17,
        lens in proptest::collection::vec(1usize..90, 1..4),
        causal in any::<bool>(),
        threads in 1usize..4,
        seed in any::<u64>(),
    ) {
        if !amx::available() {
            return Ok(());
        }
        check_attention(nkv, group, hd8 * 8, &lens, causal, threads, seed)?;
    }
}
