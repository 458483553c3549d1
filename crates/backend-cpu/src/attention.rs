//! Paged causal attention on the CPU: one task per (token, head), streaming over the cached
//! positions with an online softmax (no n_ctx-sized scratch per head).
//!
//! Precision follows llama.cpp's CPU flash attention so that greedy texts agree: a sequence
//! with fewer than `VEC_PATH_MAX_TOKENS` query tokens in the batch over an f16 cache takes
//! ggml's "vector" path (Q rounded to f16, the V accumulator kept in f16 and rounded after
//! every update); more take its tiled path (everything in f32). llama.cpp decides by the whole
//! batch; deciding per sequence gives the same results for one sequence and makes a
//! sequence's numerics independent of what else shares its batch (continuous batching).

use crate::kv::CpuKv;
use crate::matmul::SyncPtr;
use crate::CpuBackend;
use quarrel_core::{AttnParams, CoreError, ForwardBatch, Result};
use half::f16;

/// ggml's GGML_FA_TILE_Q: below this many query rows it uses the f16 vector kernel.
const VEC_PATH_MAX_TOKENS: usize = 64;

#[inline]
fn r16(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}

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
    let f16_cache = kv.spec.ty == quarrel_core::KvType::F16;
    let n_tasks = batch.n_tokens() * p.n_head;
    // tasks are chunks of (token, head) pairs, each with its own scratch
    let per_chunk = n_tasks.div_ceil(be.n_threads() * 4).max(1);
    let n_chunks = n_tasks.div_ceil(per_chunk);
    be.for_each_task(n_chunks, &|chunk| {
        let (kbuf, vbuf, acc, q16) = (&mut vec![0f32; hd], &mut vec![0f32; hd], &mut vec![0f32; hd], &mut vec![0f32; hd]);
        for task in chunk * per_chunk..((chunk + 1) * per_chunk).min(n_tasks) {
                let (t, h) = (task / p.n_head, task % p.n_head);
                let seq = &batch.seqs[seq_of[t]];
                let f16_vec_path = f16_cache && seq.len < VEC_PATH_MAX_TOKENS;
                let pos = batch.positions[t] as usize;
                let lo = p.sliding_window.map_or(0, |w| (pos + 1).saturating_sub(w));
                let mut qh = &q[(t * p.n_head + h) * hd..][..hd];
                if f16_vec_path {
                    q16.iter_mut().zip(qh).for_each(|(a, &b)| *a = r16(b));
                    qh = &q16[..];
                }
                let kvh_off = (h / group) * hd;
                acc.iter_mut().for_each(|a| *a = 0.0);
                let (mut m, mut s) = (f32::NEG_INFINITY, 0f32);
                for j in lo..=pos {
                    let at = kv.slot_offset(&seq.block_table, j) + kvh_off;
                    ks.read(at, kbuf);
                    let mut score = if f16_vec_path { dot_f16_ggml(qh, kbuf) } else { dot(qh, kbuf) } * p.scale;
                    if let Some(c) = p.softcap {
                        score = c * (score / c).tanh();
                    }
                    vs.read(at, vbuf);
                    if f16_vec_path {
                        // ggml_vec_scale_f16 / ggml_vec_mad_f16: f32 math, f16 storage
                        let (ms, w) = if score > m {
                            let ms = (m - score).exp();
                            m = score;
                            acc.iter_mut().for_each(|a| *a = r16(*a * ms));
                            (ms, 1.0)
                        } else {
                            (1.0, (score - m).exp())
                        };
                        acc.iter_mut().zip(vbuf.iter()).for_each(|(a, &v)| {
                            *a = r16((v as f64 * w as f64 + *a as f64) as f32);
                        });
                        // S = S*ms + vs, contracted to an FMA by ggml's compiler
                        s = s.mul_add(ms, w);
                        continue;
                    }
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
            }
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

/// `ggml_vec_dot_f16` as ggml's AVX-512 build computes it (f16 inputs already widened to f32):
/// four 16-lane FMA accumulators over 64-element steps, the accumulators folded pairwise
/// (0+=2, 1+=3, 0+=1), then `_mm512_reduce_add_ps`'s tree (8, 4, then 2+2 lanes), and the
/// leftover elements added in f64. The same bits as llama.cpp's decode attention scores.
fn dot_f16_ggml(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len();
    let np = n & !63;
    let mut acc = [[0f32; 16]; 4];
    for i in (0..np).step_by(64) {
        for (j, accj) in acc.iter_mut().enumerate() {
            for (l, al) in accj.iter_mut().enumerate() {
                let k = i + j * 16 + l;
                *al = a[k].mul_add(b[k], *al);
            }
        }
    }
    let mut x = [0f32; 16];
    for l in 0..16 {
        let s0 = acc[0][l] + acc[2][l];
        let s1 = acc[1][l] + acc[3][l];
        x[l] = s0 + s1;
    }
    let mut t8 = [0f32; 8];
    for i in 0..8 {
        t8[i] = x[i] + x[i + 8];
    }
    let mut t4 = [0f32; 4];
    for i in 0..4 {
        t4[i] = t8[i] + t8[i + 4];
    }
    let c0 = t4[0] + t4[2];
    let c1 = t4[1] + t4[3];
    let mut sum = (c0 + c1) as f64;
    for k in np..n {
        sum += (a[k] * b[k]) as f64;
    }
    sum as f32
}
