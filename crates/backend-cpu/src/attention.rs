//! Paged causal attention on the CPU: one task per (token, head), streaming over the cached
//! positions with an online softmax (no n_ctx-sized scratch per head).
//!
//! Precision follows llama.cpp's CPU flash attention so that greedy texts agree: a sequence
//! with fewer than `VEC_PATH_MAX_TOKENS` query tokens in the batch over an f16 cache takes
//! ggml's "vector" path (Q rounded to f16, the V accumulator kept in f16 and rounded after
//! every update); more take its tiled path (everything in f32). llama.cpp decides by the whole
//! batch; deciding per sequence gives the same results for one sequence and makes a
//! sequence's numerics independent of what else shares its batch (continuous batching). The inner loops, one head over one
//! cache block at a time, are `simd::attn`'s (SIMD kernels with reference twins).

use crate::kv::CpuKv;
use crate::matmul::SyncPtr;
use crate::simd::attn::{self, KvRows, Online, Run, Scoring};
use crate::CpuBackend;
use half::f16;
use quarrel_core::{AttnParams, CoreError, ForwardBatch, Result};

/// ggml's GGML_FA_TILE_Q: below this many query rows it uses the f16 vector kernel.
const VEC_PATH_MAX_TOKENS: usize = 64;

/// Largest head_dim (per-task scratch lives on the stack).
const MAX_HEAD_DIM: usize = 1024;

/// Quantized caches: positions dequantized at a time, and the largest head_dim supported.
const QUANT_RUN: usize = 16;
const QUANT_MAX_HEAD_DIM: usize = 256;

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
    if hd != kv.spec.head_dim || p.n_kv_head != kv.spec.n_kv_head || p.n_kv_head == 0 || p.n_head % p.n_kv_head != 0 {
        return Err(CoreError::Shape(format!(
            "attention: {} heads / {} kv heads of {hd} vs cache {} x {}",
            p.n_head, p.n_kv_head, kv.spec.n_kv_head, kv.spec.head_dim
        )));
    }
    if hd > MAX_HEAD_DIM {
        return Err(CoreError::Shape(format!("attention: head_dim {hd} above {MAX_HEAD_DIM}")));
    }
    if kv.k[layer].rows().is_none() && hd > QUANT_MAX_HEAD_DIM {
        return Err(CoreError::Unsupported(format!("quantized KV cache with head_dim {hd} above {QUANT_MAX_HEAD_DIM}")));
    }
    batch.validate(kv.spec.block_size).map_err(CoreError::Shape)?;
    let group = p.n_head / p.n_kv_head;
    let (kst, vst) = (&kv.k[layer], &kv.v[layer]);
    // f32/f16 caches are read in place; quantized ones (Q8_0/Q4_0) are dequantized a block
    // run at a time into per-task scratch and go through the f32 path
    let rows = kst.rows().zip(vst.rows());
    let out_ptr = SyncPtr(out.as_mut_ptr());
    let f16_cache = kv.spec.ty == quarrel_core::KvType::F16;
    let sc = Scoring { scale: p.scale, softcap: p.softcap };
    let (bs, stride) = (kv.spec.block_size, kv.spec.n_kv_head * hd);
    let n_tasks = batch.n_tokens() * p.n_head;
    // tasks are chunks of (token, head) pairs; later tokens see more positions, so many
    // small chunks keep the threads evenly loaded
    let per_chunk = n_tasks.div_ceil(be.n_threads() * 16).max(1);
    let n_chunks = n_tasks.div_ceil(per_chunk);
    be.for_each_task(n_chunks, &|chunk| {
        let (mut q16, mut acc) = ([0f32; MAX_HEAD_DIM], [0f32; MAX_HEAD_DIM]);
        let (mut kq, mut vq) = ([0f32; QUANT_RUN * QUANT_MAX_HEAD_DIM], [0f32; QUANT_RUN * QUANT_MAX_HEAD_DIM]);
        let (q16, acc) = (&mut q16[..hd], &mut acc[..hd]);
        for task in chunk * per_chunk..((chunk + 1) * per_chunk).min(n_tasks) {
            let (t, h) = (task / p.n_head, task % p.n_head);
            // validated: every token lies in exactly one sequence
            let Some(seq) = batch.seqs.iter().find(|s| (s.start..s.start + s.len).contains(&t)) else { continue };
            let f16_vec_path = f16_cache && seq.len < VEC_PATH_MAX_TOKENS;
            let pos = batch.positions[t] as usize;
            let lo = p.sliding_window.map_or(0, |w| (pos + 1).saturating_sub(w));
            let qh = &q[(t * p.n_head + h) * hd..][..hd];
            let kvh_off = (h / group) * hd;
            acc.fill(0.0);
            let mut st = Online::START;
            // one run per cache block: positions j..j_end are contiguous slots
            let mut j = lo;
            while j <= pos {
                let j_end = ((j / bs + 1) * bs).min(pos + 1);
                let Some((ks, vs)) = rows else {
                    let j_end = j_end.min(j + QUANT_RUN);
                    for (r, jj) in (j..j_end).enumerate() {
                        let at = kv.slot_offset(&seq.block_table, jj) + kvh_off;
                        kst.dequantize(at, &mut kq[r * hd..(r + 1) * hd]);
                        vst.dequantize(at, &mut vq[r * hd..(r + 1) * hd]);
                    }
                    let run = Run { start: 0, stride: hd, len: j_end - j };
                    let n = run.len * hd;
                    attn::f32_run(qh, KvRows::F32(&kq[..n]), KvRows::F32(&vq[..n]), run, sc, &mut st, acc);
                    j = j_end;
                    continue;
                };
                let run = Run { start: kv.slot_offset(&seq.block_table, j) + kvh_off, stride, len: j_end - j };
                match (f16_vec_path, ks, vs) {
                    (true, KvRows::F16(k), KvRows::F16(v)) => {
                        if j == lo {
                            q16.iter_mut().zip(qh).for_each(|(a, &b)| *a = f16::from_f32(b).to_f32());
                        }
                        attn::vec_f16_run(q16, k, v, run, sc, &mut st, acc)
                    }
                    _ => attn::f32_run(qh, ks, vs, run, sc, &mut st, acc),
                }
                j = j_end;
            }
            let inv = if st.s > 0.0 { 1.0 / st.s } else { 0.0 };
            let base = (t * p.n_head + h) * hd;
            for (d, &a) in acc.iter().enumerate() {
                // SAFETY: each task owns the disjoint range base..base+hd.
                unsafe { out_ptr.write(base + d, a * inv) };
            }
        }
    });
    Ok(())
}
