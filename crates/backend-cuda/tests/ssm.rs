//! The Mamba2 selective scan of prefill steps (`ssm_scan_chunk` and its compile-time-state-size
//! twins `ssm_scan_chunk_<ds>`, picked by `CudaBackend::set_scan_kernel`) against the
//! decode kernel run token by token: the same outputs, carried states and non-finite counts bit
//! for bit, for sequences that start fresh and that continue a carried state, over state sizes
//! with and without a specialized kernel, group counts, partial chunks and extreme inputs
//! (dt far beyond softplus's linear threshold, exp(dt·A) underflowing to 0, states overflowing).
//! Needs a CUDA device: ignored unless asked for (scripts/gpu-test.sh).

mod common;
use common::{cuda, rnd};
use quarrel_core::{Backend, ForwardBatch, KvSpec, KvType, SeqBatch, SsmParams, StateSpec};
use quarrel_cuda::{CudaBackend, CudaKv, ScanKernel};

/// One shape's inputs: per sequence, per token, the conv output row (x, B, C) and the
/// projection row (z, x, B, C, dt).
struct Inputs {
    p: SsmParams,
    xbc: Vec<Vec<Vec<f32>>>,
    zx: Vec<Vec<Vec<f32>>>,
    a: Vec<f32>,
    d: Vec<f32>,
    dtb: Vec<f32>,
}

fn inputs(p: SsmParams, lens: &[usize], seed: u64, overflow: bool) -> Inputs {
    let (cd, dp) = (p.conv_dim(), p.d_in_proj());
    let mut k = seed;
    let mut next = |n: usize, scale: f32| {
        k += 1;
        rnd(n, k).into_iter().map(|v| v * scale).collect::<Vec<f32>>()
    };
    let mut xbc = vec![];
    let mut zx = vec![];
    for (s, &len) in lens.iter().enumerate() {
        let (mut xs, mut zs) = (vec![], vec![]);
        for t in 0..len {
            let mut x = next(cd, 2.0);
            let mut z = next(dp, 3.0);
            // dt: far above softplus's threshold (exp(dt·A) underflows to 0), far below (dt ~ 0)
            let dt_col = dp - p.n_head;
            match t % 7 {
                3 => z[dt_col..].iter_mut().for_each(|v| *v += 40.0),
                5 => z[dt_col..].iter_mut().for_each(|v| *v -= 60.0),
                _ => {}
            }
            if overflow && s == 1 && t == len / 2 {
                // a state that overflows: non-finite from here on, counted alike
                x[..p.d_inner].iter_mut().for_each(|v| *v *= 3e38);
            }
            xs.push(x);
            zs.push(z);
        }
        xbc.push(xs);
        zx.push(zs);
    }
    let mut a: Vec<f32> = next(p.n_head, 8.0).iter().map(|v| -v.abs() - 0.01).collect();
    a[0] = -1e4; // exp(dt·A) = 0 at every token
    Inputs { p, xbc, zx, a, d: next(p.n_head, 2.0), dtb: next(p.n_head, 4.0) }
}

/// Runs the scan over `steps`, each a list of (sequence, first token, tokens) taken together in
/// one batch; returns every step's outputs and the non-finite count.
fn run(be: &CudaBackend, inp: &Inputs, slots: &[u32], steps: &[Vec<(usize, usize, usize)>]) -> (Vec<Vec<f32>>, u64) {
    let p = inp.p;
    let spec = KvSpec { n_layer: 1, n_kv_head: 1, head_dim: 32, block_size: 16, n_blocks: 1, ty: KvType::F32 };
    let mut kv: CudaKv = be.alloc_kv(&spec).unwrap();
    be.alloc_state(&mut kv, &StateSpec { n_slots: 4, layers: vec![Some(p)] }).unwrap();
    let up = |v: &[f32]| be.upload(v).unwrap();
    let (a, d, dtb) = (up(&inp.a), up(&inp.d), up(&inp.dtb));
    let mut outs = vec![];
    for step in steps {
        let (mut xbc, mut zx, mut positions, mut seqs, mut state_slots) = (vec![], vec![], vec![], vec![], vec![]);
        for &(s, t0, n) in step {
            seqs.push(SeqBatch { start: positions.len(), len: n, block_table: vec![0] });
            state_slots.push(slots[s]);
            for t in t0..t0 + n {
                xbc.extend_from_slice(&inp.xbc[s][t]);
                zx.extend_from_slice(&inp.zx[s][t]);
                positions.push(t as u32);
            }
        }
        let n = positions.len();
        let batch = ForwardBatch { tokens: vec![0; n], positions, seqs, logits_rows: vec![], state_slots };
        let mut y = be.alloc(n * p.d_inner).unwrap();
        be.ssm_scan(&mut kv, 0, &p, &up(&xbc), &up(&zx), &a, &d, &dtb, &batch, &mut y).unwrap();
        outs.push(be.download(&y).unwrap());
    }
    (outs, be.state_stats(&kv).unwrap().1)
}

/// Per sequence, per token, the output row of `run`'s steps.
fn by_token(p: &SsmParams, steps: &[Vec<(usize, usize, usize)>], outs: &[Vec<f32>], n_seq: usize) -> Vec<Vec<Vec<u32>>> {
    let mut rows = vec![vec![]; n_seq];
    for (step, y) in steps.iter().zip(outs) {
        let mut i = 0;
        for &(s, _, n) in step {
            for _ in 0..n {
                rows[s].push(y[i * p.d_inner..(i + 1) * p.d_inner].iter().map(|v| v.to_bits()).collect());
                i += 1;
            }
        }
    }
    rows
}

#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-test.sh)"]
fn prefill_scan_kernels_equal_token_steps() {
    let be = cuda();
    // (heads, head size, state size, groups): state sizes 16 and 48 have only the generic kernel
    let shapes = [
        (8usize, 32usize, 16usize, 2usize),
        (4, 64, 48, 1),
        (8, 64, 64, 2),
        (6, 64, 128, 1),
        (16, 32, 128, 8),
        (4, 64, 256, 4),
        (4, 32, 256, 1),
    ];
    let lens = [76usize, 44];
    let slots = [3u32, 1];
    // prefills: fresh (50 and 40 tokens: a partial chunk), then continuing a carried state (25
    // and 3), then one decode step of both
    let chunked = vec![vec![(0, 0, 50), (1, 0, 40)], vec![(0, 50, 25), (1, 40, 3)], vec![(0, 75, 1), (1, 43, 1)]];
    let stepwise: Vec<Vec<(usize, usize, usize)>> = (0..76).map(|t| (0..2).filter(|&s| t < lens[s]).map(|s| (s, t, 1)).collect()).collect();
    let mut checked = 0;
    for (i, &(n_head, hd, d_state, n_group)) in shapes.iter().enumerate() {
        let p = SsmParams { d_conv: 4, d_inner: n_head * hd, d_state, n_group, n_head, eps: 1e-5 };
        for overflow in [false, true] {
            let inp = inputs(p, &lens, 100 * i as u64 + overflow as u64, overflow);
            be.set_scan_kernel(ScanKernel::Generic);
            let (want, want_bad) = run(&be, &inp, &slots, &stepwise);
            let want = by_token(&p, &stepwise, &want, 2);
            assert_eq!(want_bad > 0, overflow, "{p:?}: non-finite count {want_bad}");
            for kernel in [ScanKernel::Generic, ScanKernel::Specialized] {
                be.set_scan_kernel(kernel);
                let (got, bad) = run(&be, &inp, &slots, &chunked);
                let got = by_token(&p, &chunked, &got, 2);
                for s in 0..2 {
                    for t in 0..lens[s] {
                        assert!(
                            got[s][t] == want[s][t],
                            "{p:?} {kernel:?} overflow {overflow}: sequence {s} token {t} differs from token-by-token decode"
                        );
                    }
                }
                assert_eq!(bad, want_bad, "{p:?} {kernel:?}: non-finite state counts differ");
                checked += 1;
            }
        }
    }
    eprintln!("prefill scans == token-by-token decode, bit for bit: {checked} (shape, input, kernel) cases");
}
