//! Attention runs (`simd::attn`): the dispatched kernels against their reference twins, bit
//! for bit, on random head sizes (with tails past the 64-element steps), strides, run lengths,
//! softcaps and run splits; and a whole decode over an f16 cache on an odd thread count
//! against a naive softmax.

mod common;
use half::f16;
use proptest::prelude::*;
use quarrel_core::{AttnParams, Backend, ForwardBatch, KvSpec, KvType, SeqBatch};
use quarrel_cpu::simd::attn::{self, KvRows, Online, Run, Scoring};
use quarrel_cpu::CpuBackend;

fn rnd(seed: u64, n: usize, scale: f32) -> Vec<f32> {
    common::rnd_from_state(seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407), n, scale)
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

struct Case {
    hd: usize,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    run: Run,
    sc: Scoring,
    split: usize,
}

fn case(hd8: usize, len: usize, pad: usize, offset: usize, cap: bool, split: usize, seed: u64) -> Case {
    let hd = hd8 * 8;
    let stride = hd + pad;
    let n = offset + len * stride + hd;
    // large values now and then so the running max moves often
    let scale = if seed.is_multiple_of(3) { 12.0 } else { 3.0 };
    Case {
        hd,
        q: rnd(seed, hd, scale),
        k: rnd(seed ^ 1, n, 2.0),
        v: rnd(seed ^ 2, n, 2.0),
        run: Run { start: offset, stride, len },
        sc: Scoring { scale: 1.0 / (hd as f32).sqrt(), softcap: cap.then_some(5.0) },
        split: split.min(len),
    }
}

impl Case {
    /// The run split in two at `split`.
    fn halves(&self) -> [Run; 2] {
        let (r, s) = (self.run, self.split);
        [Run { len: s, ..r }, Run { start: r.start + s * r.stride, len: r.len - s, ..r }]
    }
}

type RunFn<'a> = &'a dyn Fn(Run, &mut Online, &mut [f32]);

/// `f` over the case's run split in two at `split` (the state carries across), from a fresh
/// state: the final (m, s) and accumulator bits.
fn drive(c: &Case, f: RunFn<'_>) -> (u32, u32, Vec<u32>) {
    let mut st = Online::START;
    let mut acc = vec![0f32; c.hd];
    for r in c.halves() {
        f(r, &mut st, &mut acc);
    }
    (st.m.to_bits(), st.s.to_bits(), bits(&acc))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn vec_f16_run_matches_reference(hd8 in 1usize..34, len in 0usize..40, pad in 0usize..20, offset in 0usize..50,
                                     cap in any::<bool>(), split in 0usize..40, seed in any::<u64>()) {
        let c = case(hd8, len, pad, offset, cap, split, seed);
        let q16: Vec<f32> = c.q.iter().map(|&x| f16::from_f32(x).to_f32()).collect();
        let k: Vec<f16> = c.k.iter().map(|&x| f16::from_f32(x)).collect();
        let v: Vec<f16> = c.v.iter().map(|&x| f16::from_f32(x)).collect();
        let fast = drive(&c, &|r, st, acc| attn::vec_f16_run(&q16, &k, &v, r, c.sc, st, acc));
        let slow = drive(&c, &|r, st, acc| attn::vec_f16_run_ref(&q16, &k, &v, r, c.sc, st, acc));
        prop_assert_eq!(fast, slow);
    }

    #[test]
    fn f32_run_matches_reference(hd8 in 1usize..34, len in 0usize..40, pad in 0usize..20, offset in 0usize..50,
                                 cap in any::<bool>(), split in 0usize..40, seed in any::<u64>()) {
        let c = case(hd8, len, pad, offset, cap, split, seed);
        let k16: Vec<f16> = c.k.iter().map(|&x| f16::from_f32(x)).collect();
        let v16: Vec<f16> = c.v.iter().map(|&x| f16::from_f32(x)).collect();
        for (k, v) in [(KvRows::F32(&c.k), KvRows::F32(&c.v)), (KvRows::F16(&k16), KvRows::F16(&v16))] {
            let fast = drive(&c, &|r, st, acc| attn::f32_run(&c.q, k, v, r, c.sc, st, acc));
            let slow = drive(&c, &|r, st, acc| attn::f32_run_ref(&c.q, k, v, r, c.sc, st, acc));
            prop_assert_eq!(fast, slow);
        }
    }

    /// The f16 vector path, several heads in lock step: each gets exactly the bits
    /// `vec_f16_run_ref` gives it alone.
    #[test]
    fn vec_f16_run_multi_matches_single_runs(hd8 in 1usize..34, len in 0usize..40, pad in 0usize..20, offset in 0usize..50,
                                             cap in any::<bool>(), split in 0usize..40, nq in 1usize..=attn::MULTI_MAX,
                                             seed in any::<u64>()) {
        let c = case(hd8, len, pad, offset, cap, split, seed);
        let qs: Vec<Vec<f32>> = (0..nq as u64)
            .map(|g| rnd(seed ^ (g + 7) << 8, c.hd, if g % 2 == 0 { 12.0 } else { 3.0 }).iter().map(|&x| f16::from_f32(x).to_f32()).collect())
            .collect();
        let k16: Vec<f16> = c.k.iter().map(|&x| f16::from_f32(x)).collect();
        let v16: Vec<f16> = c.v.iter().map(|&x| f16::from_f32(x)).collect();
        let q: Vec<&[f32]> = qs.iter().map(|x| &x[..]).collect();
        let mut st = vec![Online::START; nq];
        let mut accs = vec![vec![0f32; c.hd]; nq];
        for r in c.halves() {
            let mut acc: Vec<&mut [f32]> = accs.iter_mut().map(|x| &mut x[..]).collect();
            attn::vec_f16_run_multi(&q, &k16, &v16, r, c.sc, &mut st, &mut acc);
        }
        for g in 0..nq {
            let want = drive(&c, &|r, st, acc| attn::vec_f16_run_ref(&qs[g], &k16, &v16, r, c.sc, st, acc));
            prop_assert_eq!((st[g].m.to_bits(), st[g].s.to_bits(), bits(&accs[g])), want, "query {}", g);
        }
    }

    /// Several heads in lock step: each gets exactly the bits `f32_run` gives it alone.
    #[test]
    fn f32_run_multi_matches_single_runs(hd8 in 1usize..34, len in 0usize..40, pad in 0usize..20, offset in 0usize..50,
                                         cap in any::<bool>(), split in 0usize..40, nq in 1usize..=attn::MULTI_MAX,
                                         seed in any::<u64>()) {
        let c = case(hd8, len, pad, offset, cap, split, seed);
        let qs: Vec<Vec<f32>> = (0..nq as u64).map(|g| rnd(seed ^ (g + 7) << 8, c.hd, if g % 2 == 0 { 12.0 } else { 3.0 })).collect();
        let k16: Vec<f16> = c.k.iter().map(|&x| f16::from_f32(x)).collect();
        let v16: Vec<f16> = c.v.iter().map(|&x| f16::from_f32(x)).collect();
        for (k, v) in [(KvRows::F32(&c.k), KvRows::F32(&c.v)), (KvRows::F16(&k16), KvRows::F16(&v16))] {
            let q: Vec<&[f32]> = qs.iter().map(|x| &x[..]).collect();
            let mut st = vec![Online::START; nq];
            let mut accs = vec![vec![0f32; c.hd]; nq];
            for r in c.halves() {
                let mut acc: Vec<&mut [f32]> = accs.iter_mut().map(|x| &mut x[..]).collect();
                attn::f32_run_multi(&q, k, v, r, c.sc, &mut st, &mut acc);
            }
            for g in 0..nq {
                let one = Case { q: qs[g].clone(), k: c.k.clone(), v: c.v.clone(), ..c };
                let want = drive(&one, &|r, st, acc| attn::f32_run_ref(&qs[g], k, v, r, c.sc, st, acc));
                prop_assert_eq!((st[g].m.to_bits(), st[g].s.to_bits(), bits(&accs[g])), want, "query {}", g);
            }
        }
    }
}

#[test]
#[should_panic(expected = "attention run")]
fn a_run_past_the_cache_panics() {
    let (q, k) = (vec![0f32; 8], vec![f16::ZERO; 20]);
    let (mut acc, mut st) = (vec![0f32; 8], Online::START);
    attn::vec_f16_run(&q, &k, &k, Run { start: 0, stride: 8, len: 3 }, Scoring { scale: 1.0, softcap: None }, &mut st, &mut acc);
}

/// Decode steps (the f16 vector path) over scattered cache blocks, 3 threads, GQA, a sliding
/// window, attention sinks: close to a naive f64 softmax over the f16-rounded cache.
#[test]
fn f16_decode_attention_matches_naive_softmax() {
    let be = CpuBackend::new(3).unwrap();
    let (nh, nkv, hd, bs) = (6, 2, 72, 4);
    let spec = KvSpec { n_layer: 1, n_kv_head: nkv, head_dim: hd, block_size: bs, n_blocks: 8, ty: KvType::F16 };
    let mut kv = be.alloc_kv(&spec).unwrap();
    let n = 23;
    let table = vec![5, 2, 7, 0, 3, 6];
    let k = rnd(1, n * nkv * hd, 2.0);
    let v = rnd(2, n * nkv * hd, 2.0);
    let r16 = |x: f32| f16::from_f32(x).to_f32() as f64;
    for t in 0..n {
        let batch = common::seq_batch(t, 1, table.clone());
        let row = nkv * hd;
        be.kv_store(&mut kv, 0, &k[t * row..(t + 1) * row].to_vec(), &v[t * row..(t + 1) * row].to_vec(), &batch).unwrap();
        let q = rnd(100 + t as u64, nh * hd, 2.0);
        // sinks from far below to far above the scores: the sink's share from none to most
        let sink_logits: Vec<f32> = (0..nh).map(|h| h as f32 * 3.0 - 6.0).collect();
        for (window, sinks) in [(None, None), (Some(5), None), (None, Some(&sink_logits)), (Some(5), Some(&sink_logits))] {
            let p = AttnParams { n_head: nh, n_kv_head: nkv, head_dim: hd, scale: 0.125, sliding_window: window, softcap: None };
            let mut out = vec![0f32; q.len()];
            be.attention(&q, &kv, 0, &batch, &p, sinks, &mut out).unwrap();
            for h in 0..nh {
                let kh = h / (nh / nkv);
                let lo = window.map_or(0, |w: usize| (t + 1).saturating_sub(w));
                let scores: Vec<f64> =
                    (lo..=t).map(|j| (0..hd).map(|d| r16(q[h * hd + d]) * r16(k[(j * nkv + kh) * hd + d])).sum::<f64>() * 0.125).collect();
                let sink = sinks.map(|s| s[h] as f64);
                let m = scores.iter().cloned().chain(sink).fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                // a sink adds to the denominator only
                let z: f64 = e.iter().sum::<f64>() + sink.map_or(0.0, |s| (s - m).exp());
                for d in 0..hd {
                    let want: f64 = (lo..=t).map(|j| e[j - lo] / z * r16(v[(j * nkv + kh) * hd + d])).sum();
                    let got = out[h * hd + d] as f64;
                    // the accumulator is rounded to f16 after every update
                    assert!((got - want).abs() < 4e-3 * (1.0 + want.abs()) * (t - lo + 1) as f64, "t {t} h {h} d {d}: {got} vs {want}");
                }
            }
        }
    }
}

/// Many decode tokens in one batch (one per sequence: the task-per-token path of the f16
/// vector attention) against each token alone in its own batch (the task-per-KV-head path):
/// the same bits, for GQA groups 1..=4, sliding windows, scattered block tables.
#[test]
fn many_decode_tokens_equal_each_alone() {
    for (threads, nh, nkv, window) in [(2, 9, 3, None), (3, 8, 2, Some(7)), (2, 4, 4, None), (1, 12, 3, None), (2, 8, 2, Some(40))] {
        let be = CpuBackend::new(threads).unwrap();
        let (hd, bs, n_seq) = (64, 16, 13);
        let n_blocks = 64;
        let spec = KvSpec { n_layer: 1, n_kv_head: nkv, head_dim: hd, block_size: bs, n_blocks, ty: KvType::F16 };
        let mut kv = be.alloc_kv(&spec).unwrap();
        // sequence s has `len` cached positions before its decode token; blocks scattered
        let lens: Vec<usize> = (0..n_seq).map(|s| 1 + (s * 37 + 11) % 60).collect();
        let mut next_block = 0u32;
        let tables: Vec<Vec<u32>> = lens
            .iter()
            .map(|&l| {
                (0..(l + 1).div_ceil(bs))
                    .map(|_| {
                        next_block = (next_block + 23) % n_blocks as u32;
                        next_block
                    })
                    .collect()
            })
            .collect();
        let row = nkv * hd;
        for (s, &l) in lens.iter().enumerate() {
            let batch = common::seq_batch(0, l + 1, tables[s].clone());
            let (k, v) = (rnd(10 + s as u64, (l + 1) * row, 2.0), rnd(50 + s as u64, (l + 1) * row, 2.0));
            be.kv_store(&mut kv, 0, &k, &v, &batch).unwrap();
        }
        let p = AttnParams { n_head: nh, n_kv_head: nkv, head_dim: hd, scale: 0.125, sliding_window: window, softcap: None };
        let q = rnd(7, n_seq * nh * hd, 2.0);
        let all = ForwardBatch {
            tokens: vec![0; n_seq],
            positions: lens.iter().map(|&l| l as u32).collect(),
            seqs: (0..n_seq).map(|s| SeqBatch { start: s, len: 1, block_table: tables[s].clone() }).collect(),
            logits_rows: vec![],
            state_slots: vec![],
        };
        let mut out = vec![0f32; q.len()];
        be.attention(&q, &kv, 0, &all, &p, None, &mut out).unwrap();
        for s in 0..n_seq {
            let one = common::seq_batch(lens[s], 1, tables[s].clone());
            let qs = q[s * nh * hd..(s + 1) * nh * hd].to_vec();
            let mut o = vec![0f32; qs.len()];
            be.attention(&qs, &kv, 0, &one, &p, None, &mut o).unwrap();
            assert_eq!(
                bits(&o),
                bits(&out[s * nh * hd..(s + 1) * nh * hd]),
                "threads {threads} heads {nh}/{nkv} window {window:?}: sequence {s}"
            );
        }
    }
}

/// kv_store of many tokens of several sequences, written in parallel on a pool, leaves the
/// same cache as one thread's store (read back through attention, bit for bit).
#[test]
fn parallel_kv_store_equals_sequential() {
    let (one, pool) = (CpuBackend::new(1).unwrap(), CpuBackend::new(3).unwrap());
    let (nh, nkv, hd, bs) = (6, 3, 64, 16);
    let spec = KvSpec { n_layer: 2, n_kv_head: nkv, head_dim: hd, block_size: bs, n_blocks: 16, ty: KvType::F16 };
    let (mut a, mut b) = (one.alloc_kv(&spec).unwrap(), pool.alloc_kv(&spec).unwrap());
    // three sequences of 9, 20 and 1 tokens, scattered blocks
    let tables = [vec![7u32], vec![3, 12], vec![0]];
    let lens = [9usize, 20, 1];
    let mut batch = ForwardBatch::default();
    for (s, &l) in lens.iter().enumerate() {
        let start = batch.tokens.len();
        for p in 0..l {
            batch.tokens.push(0);
            batch.positions.push(p as u32);
        }
        batch.seqs.push(SeqBatch { start, len: l, block_table: tables[s].clone() });
    }
    let n = batch.n_tokens();
    let (k, v) = (rnd(31, n * nkv * hd, 3.0), rnd(32, n * nkv * hd, 3.0));
    one.kv_store(&mut a, 1, &k, &v, &batch).unwrap();
    pool.kv_store(&mut b, 1, &k, &v, &batch).unwrap();
    let q = rnd(33, n * nh * hd, 2.0);
    let p = AttnParams { n_head: nh, n_kv_head: nkv, head_dim: hd, scale: 0.125, sliding_window: None, softcap: None };
    let (mut oa, mut ob) = (vec![0f32; q.len()], vec![0f32; q.len()]);
    one.attention(&q, &a, 1, &batch, &p, None, &mut oa).unwrap();
    one.attention(&q, &b, 1, &batch, &p, None, &mut ob).unwrap();
    assert_eq!(bits(&oa), bits(&ob));
    // a position without a block is still an error, not a panic
    let mut bad = batch.clone();
    bad.positions[3] = 40;
    assert!(pool.kv_store(&mut b, 1, &k, &v, &bad).is_err());
}
