//! Prefill attention on the tensor cores (`kernels/attn_mma.cu`, at the end) and decode
//! attention for a batch of many sequences (one token each) through the grouped-query
//! kernel (`kernels/attn_batch.cu`): against the CPU backend and against the per-head kernel
//! (`set_gqa_decode(false)`), for f32 / f16 caches (q8_0 takes the per-head kernel either
//! way), 2, 3 and 4 query heads per KV head, head_dim 64 and 128, sequences of 1 to 300
//! positions in scattered cache blocks, with a sliding window and a soft cap. Skips without
//! a CUDA device.

mod common;
use common::{cuda_and_cpu, nmse, rnd, rnd_scaled, store, store_attend};
use quarrel_core::{AttnParams, Backend, ForwardBatch, KvSpec, KvType, SeqBatch};
use quarrel_cpu::CpuBackend;

/// NMSE bounds (Σ(a-b)²/Σa²).
mod tol {
    /// vs the CPU backend (ops.rs's attention bound)
    pub const CPU: f64 = 1e-5;
    /// vs the per-head GPU kernel: the same arithmetic per head, splits merged in another
    /// grouping
    pub const PER_HEAD: f64 = 1e-10;
    /// prefill on the tensor cores (attn_mma.cu: f16 q and probabilities, f32 scores and
    /// accumulator) vs the CPU (f32 tiles for 64+ token sequences, ggml's f16 vector path below)
    /// (about 1e-7 seen)
    pub const MMA_CPU: f64 = 1e-6;
    /// the same vs its plain twin, the f32 tiled kernel (`set_attn_mma_min(None)`)
    /// (about 5e-8 seen)
    pub const MMA_TWIN: f64 = 1e-6;
    /// the one-pass kernel vs the CPU's vector path: the same order, the bits but for the soft
    /// cap's tanh (up to 4e-10 with soft caps)
    pub const ONE_PASS_CPU: f64 = 1e-9;
}

struct Case {
    n_head: usize,
    n_kv_head: usize,
    hd: usize,
    ty: KvType,
    window: Option<usize>,
    softcap: Option<f32>,
}

impl Case {
    /// The attention parameters of the case (scale 1/√hd).
    fn params(&self) -> AttnParams {
        AttnParams {
            n_head: self.n_head,
            n_kv_head: self.n_kv_head,
            head_dim: self.hd,
            scale: 1.0 / (self.hd as f32).sqrt(),
            sliding_window: self.window,
            softcap: self.softcap,
        }
    }
}

/// Prompts of `lens` tokens stored for every sequence, then one decode token each; returns
/// the decode step's attention output.
fn decode<B: Backend>(be: &B, c: &Case, lens: &[usize]) -> Vec<f32> {
    let bs = 16;
    let tables: Vec<Vec<u32>> = {
        // blocks handed out round-robin over the sequences: every table is scattered
        let need: Vec<usize> = lens.iter().map(|l| (l + 1).div_ceil(bs)).collect();
        let mut t = vec![Vec::new(); lens.len()];
        let mut next = 0u32;
        for round in 0..*need.iter().max().unwrap() {
            for (s, &n) in need.iter().enumerate() {
                if round < n {
                    t[s].push(next);
                    next += 1;
                }
            }
        }
        t
    };
    let n_blocks = tables.iter().map(|t| t.len()).sum::<usize>() + 3;
    let spec = KvSpec { n_layer: 1, n_kv_head: c.n_kv_head, head_dim: c.hd, block_size: bs, n_blocks, ty: c.ty };
    let mut kv = be.alloc_kv(&spec).unwrap();
    let row = c.n_kv_head * c.hd;
    let mut pre = ForwardBatch::default();
    for (s, &l) in lens.iter().enumerate() {
        let start = pre.tokens.len();
        pre.tokens.extend(std::iter::repeat_n(0, l));
        pre.positions.extend(0..l as u32);
        pre.seqs.push(SeqBatch { start, len: l, block_table: tables[s].clone() });
    }
    let n = pre.n_tokens();
    store(be, &mut kv, 0, &pre, &rnd(n * row, 11), &rnd(n * row, 12));
    let dec = ForwardBatch {
        tokens: vec![0; lens.len()],
        positions: lens.iter().map(|&l| l as u32).collect(),
        seqs: (0..lens.len()).map(|s| SeqBatch { start: s, len: 1, block_table: tables[s].clone() }).collect(),
        logits_rows: (0..lens.len()).collect(),
        state_slots: vec![],
    };
    let n = lens.len();
    store_attend(be, &mut kv, 0, &dec, &c.params(), [&rnd(n * row, 21), &rnd(n * row, 22), &rnd_scaled(n * c.n_head * c.hd, 23, 3.0)], None)
}

#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-test.sh)"]
fn batched_decode_attention_matches_cpu_and_per_head_kernel() {
    let (gpu, cpu) = cuda_and_cpu();
    // f16 caches: the grouped and per-head kernels (split-K, f32) here, not the default
    // one-pass kernel with the CPU's numerics (checked below and in numerics.rs)
    gpu.set_attn_vec_max(0);
    let lens = [1usize, 33, 70, 300, 9, 128, 64, 17];
    let mut cases = Vec::new();
    for ty in [KvType::F16, KvType::F32, KvType::Q8_0] {
        for (n_head, n_kv_head, hd) in [(8, 2, 128), (4, 2, 64), (6, 2, 64), (32, 8, 128)] {
            cases.push(Case { n_head, n_kv_head, hd, ty, window: None, softcap: None });
        }
        cases.push(Case { n_head: 8, n_kv_head: 2, hd: 128, ty, window: Some(40), softcap: None });
        cases.push(Case { n_head: 8, n_kv_head: 2, hd: 64, ty, window: None, softcap: Some(5.0) });
    }
    for c in &cases {
        let want = decode(&cpu, c, &lens);
        let got = decode(&gpu, c, &lens);
        gpu.set_gqa_decode(false);
        let per_head = decode(&gpu, c, &lens);
        gpu.set_gqa_decode(true);
        let (e_cpu, e_ph) = (nmse(&want, &got), nmse(&per_head, &got));
        let what = format!("{} heads {}/{} hd {} window {:?} softcap {:?}", c.ty.name(), c.n_head, c.n_kv_head, c.hd, c.window, c.softcap);
        eprintln!("{what}: nmse vs CPU {e_cpu:.2e}, vs per-head kernel {e_ph:.2e}");
        assert!(e_cpu <= tol::CPU, "{what}: nmse vs CPU {e_cpu:.3e}");
        assert!(e_ph <= tol::PER_HEAD, "{what}: nmse vs per-head kernel {e_ph:.3e}");
        if c.ty == KvType::F16 {
            // the one-pass kernel (exact attention: at any batch size): the CPU's bits (tanhf of a
            // soft cap aside: libm's and CUDA's may differ in the last place)
            gpu.set_numerics(quarrel_core::Numerics::Exact);
            let vec = decode(&gpu, c, &lens);
            gpu.set_numerics(quarrel_core::Numerics::Fast);
            let differ = want.iter().zip(&vec).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
            eprintln!("{what}: one-pass kernel, {differ} of {} values differ from the CPU's", want.len());
            assert!(nmse(&want, &vec) <= tol::CPU && (c.softcap.is_some() || differ == 0), "{what}: one-pass kernel vs CPU");
        }
    }
}

/// A prefill batch: per sequence, `cached` positions stored first, then `lens` new tokens
/// attending to them and to each other (causal); returns the prefill's attention output.
fn prefill<B: Backend>(be: &B, c: &Case, cached: &[usize], lens: &[usize]) -> Vec<f32> {
    let bs = 16;
    // blocks dealt in reverse, interleaved over the sequences: scattered tables
    let need: Vec<usize> = cached.iter().zip(lens).map(|(c, l)| (c + l).div_ceil(bs)).collect();
    let n_blocks = need.iter().sum::<usize>() + 2;
    let mut next = n_blocks as u32;
    let mut tables = vec![Vec::new(); lens.len()];
    for round in 0..*need.iter().max().unwrap() {
        for (s, &n) in need.iter().enumerate() {
            if round < n {
                next -= 1;
                tables[s].push(next);
            }
        }
    }
    let spec = KvSpec { n_layer: 1, n_kv_head: c.n_kv_head, head_dim: c.hd, block_size: bs, n_blocks, ty: c.ty };
    let mut kv = be.alloc_kv(&spec).unwrap();
    let row = c.n_kv_head * c.hd;
    let batch = |from: &[usize], n: &[usize]| {
        let mut b = ForwardBatch::default();
        for s in 0..n.len() {
            let start = b.tokens.len();
            b.tokens.extend(std::iter::repeat_n(0, n[s]));
            b.positions.extend(from[s] as u32..(from[s] + n[s]) as u32);
            b.seqs.push(SeqBatch { start, len: n[s], block_table: tables[s].clone() });
        }
        b
    };
    let pre = batch(&vec![0; lens.len()], cached);
    if pre.n_tokens() > 0 {
        store(be, &mut kv, 0, &pre, &rnd(pre.n_tokens() * row, 31), &rnd(pre.n_tokens() * row, 32));
    }
    let b = batch(cached, lens);
    let n = b.n_tokens();
    store_attend(be, &mut kv, 0, &b, &c.params(), [&rnd(n * row, 11), &rnd(n * row, 12), &rnd_scaled(n * c.n_head * c.hd, 23, 3.0)], None)
}

/// Prefill attention over an f16 cache on the tensor cores (kernels/attn_mma.cu) against the
/// CPU and against its plain twin, the f32 tiled kernel: head_dim 64 / 128 / 256, 1 to 8 query
/// heads per KV head (odd groups leave padding rows), sequences of 1 to 300 tokens after 0 to
/// 100 cached positions (tiles shorter than 8, chunks continuing a sequence), a sliding window
/// and a soft cap. Exact attention takes the vector path at every length, as the CPU backend's
/// default does (the comparisons above hold the CPU to llama.cpp's rule,
/// `set_batch_invariant_attention(false)`: the tiled f32 path for sequences of 64+ tokens).
#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-test.sh)"]
fn prefill_attention_on_tensor_cores_matches_cpu_and_f32_kernel() {
    let (gpu, cpu) = cuda_and_cpu();
    gpu.set_attn_mma_min(Some(64));
    cpu.set_batch_invariant_attention(false);
    let cpu_vec = CpuBackend::new(0).unwrap();
    let (cached, lens) = ([0usize, 37, 100, 0], [300usize, 70, 13, 1]);
    let mut cases = Vec::new();
    for (n_head, n_kv_head, hd) in [(8, 2, 128), (4, 4, 64), (6, 2, 64), (32, 8, 128), (8, 1, 128), (4, 2, 256), (3, 1, 64)] {
        cases.push(Case { n_head, n_kv_head, hd, ty: KvType::F16, window: None, softcap: None });
    }
    cases.push(Case { n_head: 8, n_kv_head: 2, hd: 128, ty: KvType::F16, window: Some(40), softcap: None });
    cases.push(Case { n_head: 8, n_kv_head: 4, hd: 256, ty: KvType::F16, window: Some(50), softcap: Some(30.0) });
    cases.push(Case { n_head: 8, n_kv_head: 2, hd: 64, ty: KvType::F16, window: None, softcap: Some(5.0) });
    for c in &cases {
        let what = format!("heads {}/{} hd {} window {:?} softcap {:?}", c.n_head, c.n_kv_head, c.hd, c.window, c.softcap);
        let want = prefill(&cpu, c, &cached, &lens);
        let got = prefill(&gpu, c, &cached, &lens);
        gpu.set_attn_mma_min(None);
        let twin = prefill(&gpu, c, &cached, &lens);
        gpu.set_numerics(quarrel_core::Numerics::Exact);
        let exact = prefill(&gpu, c, &cached, &lens);
        gpu.set_numerics(quarrel_core::Numerics::Fast);
        gpu.set_attn_mma_min(Some(64));
        let (e_cpu, e_twin, e_f32) = (nmse(&want, &got), nmse(&twin, &got), nmse(&want, &twin));
        eprintln!("prefill {what}: mma nmse vs CPU {e_cpu:.2e}, vs f32 kernel {e_twin:.2e} (f32 kernel vs CPU {e_f32:.2e})");
        assert!(e_cpu <= tol::MMA_CPU, "prefill {what}: mma vs CPU {e_cpu:.3e}");
        assert!(e_twin <= tol::MMA_TWIN, "prefill {what}: mma vs f32 kernel {e_twin:.3e}");
        assert!(e_f32 <= tol::CPU, "prefill {what}: f32 kernel vs CPU {e_f32:.3e}");
        // exact attention never takes the tensor cores: the vector path at every length, as
        // the CPU's default (float order only: the CPU sums q·k in other groups)
        let vec_want = prefill(&cpu_vec, c, &cached, &lens);
        let differ = vec_want.iter().zip(&exact).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
        let e_exact = nmse(&vec_want, &exact);
        eprintln!("prefill {what}: exact vs the CPU's vector path: {differ} of {} differ, nmse {e_exact:.2e}", exact.len());
        assert!(e_exact <= tol::CPU, "prefill {what}: exact attention vs the CPU's vector path {e_exact:.3e}");
    }
}

/// The one-pass kernel with the CPU's numerics (`attn_vec2_f16`, 8 lanes per position's q·k)
/// at any batch size (exact attention): the CPU's bits for head_dim 32 to 256 (whole 64-value steps of the dot,
/// and tails of 16 / 32 values), 1 to 4 query heads per KV head, contexts of 1 to 2,100
/// positions (across the 1,024-position chunk), 256- and 128-thread blocks, a sliding window
/// (with a soft cap within the tolerance: tanhf may differ from libm's).
#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-test.sh)"]
fn one_pass_kernel_matches_cpu_bits() {
    let (gpu, cpu) = cuda_and_cpu();
    gpu.set_numerics(quarrel_core::Numerics::Exact);
    let lens = [1usize, 40, 130, 1030, 2100, 17];
    // 18 sequences x 32 heads: >= 512 blocks, so 128-thread blocks (hd 128) / (hd 32: 4 warps)
    let many: Vec<usize> = (0..18).map(|i| 1 + 37 * i).collect();
    let mut cases: Vec<(Case, &[usize])> = Vec::new();
    for (n_head, n_kv_head, hd) in [(4, 4, 32), (8, 2, 80), (6, 2, 96), (4, 1, 128), (4, 2, 256), (32, 8, 128)] {
        cases.push((Case { n_head, n_kv_head, hd, ty: KvType::F16, window: None, softcap: None }, &lens));
    }
    cases.push((Case { n_head: 8, n_kv_head: 2, hd: 128, ty: KvType::F16, window: Some(300), softcap: None }, &lens));
    cases.push((Case { n_head: 8, n_kv_head: 2, hd: 96, ty: KvType::F16, window: None, softcap: Some(5.0) }, &lens));
    cases.push((Case { n_head: 32, n_kv_head: 8, hd: 128, ty: KvType::F16, window: None, softcap: None }, &many));
    cases.push((Case { n_head: 32, n_kv_head: 8, hd: 32, ty: KvType::F16, window: None, softcap: None }, &many));
    for (c, lens) in &cases {
        let what = format!(
            "heads {}/{} hd {} window {:?} softcap {:?}, {} sequences",
            c.n_head,
            c.n_kv_head,
            c.hd,
            c.window,
            c.softcap,
            lens.len()
        );
        let want = decode(&cpu, c, lens);
        let new = decode(&gpu, c, lens);
        let d_cpu = want.iter().zip(&new).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
        eprintln!("{what}: {d_cpu} of {} values differ from the CPU's", want.len());
        assert!(nmse(&want, &new) <= tol::CPU && (c.softcap.is_some() || d_cpu == 0), "{what}: one-pass kernel vs CPU");
    }
}

/// One sequence of `total` tokens (random q, k, v per token, the same whatever the chunking)
/// fed in chunks of `chunks` tokens (the last repeated until `total`) over one scattered cache
/// of `n_blocks` blocks; returns every token's attention output in order.
fn chunked<B: Backend>(be: &B, c: &Case, total: usize, chunks: &[usize], n_blocks: usize) -> Vec<f32> {
    let bs = 16;
    // the sequence's blocks: every third one, backwards
    let table: Vec<u32> = (0..total.div_ceil(bs) as u32).map(|i| n_blocks as u32 - 1 - 3 * i).collect();
    assert!(3 * total.div_ceil(bs) <= n_blocks, "blocks overlap");
    let spec = KvSpec { n_layer: 1, n_kv_head: c.n_kv_head, head_dim: c.hd, block_size: bs, n_blocks, ty: c.ty };
    let mut kv = be.alloc_kv(&spec).unwrap();
    let (row, qrow) = (c.n_kv_head * c.hd, c.n_head * c.hd);
    let (ks, vs) = (rnd(total * row, 41), rnd(total * row, 42));
    let qs = rnd_scaled(total * qrow, 43, 3.0);
    let p = c.params();
    let mut out = Vec::with_capacity(total * qrow);
    let (mut a, mut i) = (0, 0);
    while a < total {
        let n = chunks[i.min(chunks.len() - 1)].min(total - a);
        i += 1;
        let b = ForwardBatch {
            tokens: vec![0; n],
            positions: (a as u32..(a + n) as u32).collect(),
            seqs: vec![SeqBatch { start: 0, len: n, block_table: table.clone() }],
            logits_rows: vec![n - 1],
            state_slots: vec![],
        };
        out.extend(store_attend(
            be,
            &mut kv,
            0,
            &b,
            &p,
            [&ks[a * row..(a + n) * row], &vs[a * row..(a + n) * row], &qs[a * qrow..(a + n) * qrow]],
            None,
        ));
        a += n;
    }
    out
}

/// Invariant numerics' attention (rows below position `invariant_one_pass_below()`, 128, by the
/// one-pass kernel of exact attention, later rows by `attn_mmi_f16_*`: the tensor cores over
/// absolute 256-position spans, at every token count): a 700-token sequence prefilled at once,
/// in chunks of 100 / 300 / 7 tokens (batches on both sides of the split), or as 250 tokens then one token per step
/// gives the same bits for every token (across three spans, tiles of fewer than 8 tokens,
/// windows, soft caps, odd groups), in a cache of 160 or 400 blocks; its one-pass rows are the
/// CPU vector path's (llama.cpp's decode order) and the later ones within the tensor-core
/// kernel's bound of the CPU's f32 path.
#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-test.sh)"]
fn invariant_attention_prefill_equals_decode_bits() {
    let (gpu, cpu) = cuda_and_cpu();
    gpu.set_numerics(quarrel_core::Numerics::Invariant);
    let total = 700;
    let mut cases = Vec::new();
    for (n_head, n_kv_head, hd) in [(32, 8, 128), (4, 4, 64), (3, 1, 64), (8, 2, 256)] {
        cases.push(Case { n_head, n_kv_head, hd, ty: KvType::F16, window: None, softcap: None });
    }
    cases.push(Case { n_head: 8, n_kv_head: 2, hd: 128, ty: KvType::F16, window: Some(300), softcap: None });
    cases.push(Case { n_head: 8, n_kv_head: 4, hd: 256, ty: KvType::F16, window: Some(50), softcap: Some(30.0) });
    for c in &cases {
        let what = format!("heads {}/{} hd {} window {:?} softcap {:?}", c.n_head, c.n_kv_head, c.hd, c.window, c.softcap);
        let whole = chunked(&gpu, c, total, &[total], 160);
        cpu.set_batch_invariant_attention(true);
        let want_vec = chunked(&cpu, c, total, &[total], 160);
        cpu.set_batch_invariant_attention(false);
        let want_f32 = chunked(&cpu, c, total, &[total], 160);
        let split = quarrel_cuda::invariant_one_pass_below().min(total);
        let low = split * c.n_head * c.hd;
        let e_low = if split > 0 { nmse(&want_vec[..low], &whole[..low]) } else { 0.0 };
        let e_high = if split < total { nmse(&want_f32[low..], &whole[low..]) } else { 0.0 };
        eprintln!(
            "invariant {what}: positions < {split} vs the CPU's vector path nmse {e_low:.2e}, later ones vs its f32 path {e_high:.2e}"
        );
        assert!(e_low <= tol::ONE_PASS_CPU, "invariant {what}: positions < {split} vs CPU {e_low:.3e}");
        assert!(e_high <= tol::MMA_CPU, "invariant {what}: positions >= {split} vs CPU {e_high:.3e}");
        for (chunks, n_blocks) in [(&[100usize, 300, 7][..], 160), (&[250, 1][..], 160), (&[250, 1][..], 400)] {
            let got = chunked(&gpu, c, total, chunks, n_blocks);
            let qrow = c.n_head * c.hd;
            let differ: Vec<usize> =
                (0..total).filter(|&t| (t * qrow..(t + 1) * qrow).any(|i| got[i].to_bits() != whole[i].to_bits())).collect();
            assert!(
                differ.is_empty(),
                "invariant {what}: chunks {chunks:?} ({n_blocks} blocks) differ from one prefill at {} tokens, first {:?}",
                differ.len(),
                &differ[..differ.len().min(8)]
            );
        }
    }
}
