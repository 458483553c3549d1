//! Paged causal attention on the CPU: one task per (token, head), streaming over the cached
//! positions with an online softmax (no n_ctx-sized scratch per head).

use crate::kv::CpuKv;
use crate::matmul::SyncPtr;
use crate::CpuBackend;
use quarrel_core::{AttnParams, CoreError, ForwardBatch, Result};
use rayon::prelude::*;

pub(crate) fn attention(
    be: &CpuBackend,
    q: &[f32],
    kv: &CpuKv,
    layer: usize,
    batch: &ForwardBatch,
    p: &AttnParams,
    out: &mut [f32],
) -> Result<()> {
    let hd = p.head_dim;
    if hd != kv.spec.head_dim || p.n_kv_head != kv.spec.n_kv_head || p.n_head % p.n_kv_head != 0 {
        return Err(CoreError::Shape(format!(
            "attention: {} heads / {} kv heads of {hd} vs cache {} x {}",
            p.n_head, p.n_kv_head, kv.spec.n_kv_head, kv.spec.head_dim
        )));
    }
    batch.validate(kv.spec.block_size).map_err(CoreError::Shape)?;
    // token -> sequence
    let mut seq_of = vec![0usize; batch.n_tokens()];
    for (i, s) in batch.seqs.iter().enumerate() {
        seq_of[s.start..s.start + s.len].iter_mut().for_each(|x| *x = i);
    }
    let group = p.n_head / p.n_kv_head;
    let (ks, vs) = (&kv.k[layer], &kv.v[layer]);
    let out_ptr = SyncPtr(out.as_mut_ptr());
    let n_tasks = batch.n_tokens() * p.n_head;
    be.pool().install(|| {
        (0..n_tasks).into_par_iter().for_each_init(
            || (vec![0f32; hd], vec![0f32; hd], vec![0f32; hd]),
            |(kbuf, vbuf, acc), task| {
                let (t, h) = (task / p.n_head, task % p.n_head);
                let seq = &batch.seqs[seq_of[t]];
                let pos = batch.positions[t] as usize;
                let lo = p.sliding_window.map_or(0, |w| (pos + 1).saturating_sub(w));
                let qh = &q[(t * p.n_head + h) * hd..][..hd];
                let kvh_off = (h / group) * hd;
                acc.iter_mut().for_each(|a| *a = 0.0);
                let (mut m, mut s) = (f32::NEG_INFINITY, 0f32);
                for j in lo..=pos {
                    let at = kv.slot_offset(&seq.block_table, j) + kvh_off;
                    ks.read(at, kbuf);
                    let mut score = dot(qh, kbuf) * p.scale;
                    if let Some(c) = p.softcap {
                        score = c * (score / c).tanh();
                    }
                    vs.read(at, vbuf);
                    if score > m {
                        let ms = (m - score).exp();
                        acc.iter_mut().zip(vbuf.iter()).for_each(|(a, &v)| *a = *a * ms + v);
                        s = s * ms + 1.0;
                        m = score;
                    } else {
                        let w = (score - m).exp();
                        acc.iter_mut().zip(vbuf.iter()).for_each(|(a, &v)| *a += v * w);
                        s += w;
                    }
                }
                let inv = if s > 0.0 { 1.0 / s } else { 0.0 };
                let base = (t * p.n_head + h) * hd;
                for (d, &a) in acc.iter().enumerate() {
                    // SAFETY: each task owns the disjoint range base..base+hd.
                    unsafe { out_ptr.write(base + d, a * inv) };
                }
            },
        )
    });
    Ok(())
}

#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    // 8 independent accumulators so the compiler vectorizes
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}
