//! Paged causal attention on the CPU: tasks of (token, heads of one KV head), streaming over
//! the cached positions with an online softmax (no n_ctx-sized scratch per head).
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

thread_local! {
    /// Per-thread attention scratch: the heads' q16 and accumulators (quantized caches: rotated queries, accumulators, dequantized K/V runs).
    static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Quantized caches: positions dequantized at a time, and the largest head_dim supported.
const QUANT_RUN: usize = 16;
const QUANT_MAX_HEAD_DIM: usize = 256;

#[allow(clippy::too_many_arguments)]
pub(crate) fn attention(
    be: &CpuBackend,
    q: &[f32],
    kv: &CpuKv,
    layer: usize,
    batch: &ForwardBatch,
    p: &AttnParams,
    sinks: Option<&[f32]>,
    out: &mut [f32],
) -> Result<()> {
    let hd = p.head_dim;
    if let Some(s) = sinks {
        if s.len() != p.n_head {
            return Err(CoreError::Shape(format!("attention: {} sinks for {} heads", s.len(), p.n_head)));
        }
    }
    if hd != kv.spec.head_dim || p.n_kv_head != kv.spec.n_kv_head || p.n_kv_head == 0 || !p.n_head.is_multiple_of(p.n_kv_head) {
        return Err(CoreError::Shape(format!(
            "attention: {} heads / {} kv heads of {hd} vs cache {} x {}",
            p.n_head, p.n_kv_head, kv.spec.n_kv_head, kv.spec.head_dim
        )));
    }
    if hd > MAX_HEAD_DIM {
        return Err(CoreError::Shape(format!("attention: head_dim {hd} above {MAX_HEAD_DIM}")));
    }
    if (kv.k[layer].rows().is_none() || kv.v[layer].rows().is_none()) && hd > QUANT_MAX_HEAD_DIM {
        return Err(CoreError::Unsupported(format!("quantized KV cache with head_dim {hd} above {QUANT_MAX_HEAD_DIM}")));
    }
    batch.validate(kv.spec.block_size).map_err(CoreError::Shape)?;
    if crate::attention_amx::takes(be, kv, layer, p, sinks) {
        crate::attention_amx::attention(be, q, kv, layer, batch, p, out);
        return Ok(());
    }
    let group = p.n_head / p.n_kv_head;
    let (kst, vst) = (&kv.k[layer], &kv.v[layer]);
    if kst.rows().is_none() || vst.rows().is_none() {
        return attention_quant(be, q, kv, layer, batch, p, sinks, out);
    }
    // f32/f16 caches are read in place (quantized ones: `attention_quant`)
    let rows = kst.rows().zip(vst.rows());
    let out_ptr = SyncPtr(out.as_mut_ptr());
    let f16_cache = kv.spec.ty == quarrel_core::KvType::F16;
    let sc = Scoring { scale: p.scale, softcap: p.softcap };
    let bs = kv.spec.block_size;
    // a task is one token and `hg` heads of one KV head, run in lock step over each K/V row
    // (up to `attn::MULTI_MAX`); decode-only batches (the f16 vector path) with too few
    // tokens to keep every thread busy that way keep one head per task
    let invariant = be.batch_invariant_attention();
    let vec_path = |len: usize| f16_cache && (invariant || len < VEC_PATH_MAX_TOKENS);
    let any_f32_path = batch.seqs.iter().any(|s| !vec_path(s.len));
    let multi_tasks = batch.n_tokens() * p.n_kv_head * group.div_ceil(attn::MULTI_MAX);
    let hg = if any_f32_path || multi_tasks >= 2 * be.n_threads() { group.min(attn::MULTI_MAX) } else { 1 };
    let chunks_per_kv = group.div_ceil(hg);
    let n_tasks = batch.n_tokens() * p.n_kv_head * chunks_per_kv;
    // tasks are chunks of these; later tokens see more positions, so many small chunks keep
    // the threads evenly loaded
    let per_chunk = n_tasks.div_ceil(be.n_threads() * 16).max(1);
    let n_chunks = n_tasks.div_ceil(per_chunk);
    be.for_each_task(n_chunks, &|chunk| {
        // this thread's scratch (kept between calls: no per-task zeroing of large arrays)
        let need = 2 * attn::MULTI_MAX * hd;
        SCRATCH.with(|cell| {
            let mut guard = cell.borrow_mut();
            if guard.len() < need {
                guard.resize(need, 0.0);
            }
            let (q16, rest) = guard.split_at_mut(attn::MULTI_MAX * hd);
            let accs = &mut rest[..attn::MULTI_MAX * hd];
            for task in chunk * per_chunk..((chunk + 1) * per_chunk).min(n_tasks) {
                let t = task / (p.n_kv_head * chunks_per_kv);
                let (kvh, c) = (task / chunks_per_kv % p.n_kv_head, task % chunks_per_kv);
                let h0 = kvh * group + c * hg;
                let heads = h0..(h0 + hg).min((kvh + 1) * group);
                let nh = heads.len();
                // validated: every token lies in exactly one sequence
                let Some(seq) = batch.seqs.iter().find(|s| (s.start..s.start + s.len).contains(&t)) else {
                    continue;
                };
                let f16_vec_path = vec_path(seq.len);
                let pos = batch.positions[t] as usize;
                let lo = p.sliding_window.map_or(0, |w| (pos + 1).saturating_sub(w));
                let qs: [&[f32]; attn::MULTI_MAX] =
                    std::array::from_fn(|g| if g < nh { &q[(t * p.n_head + h0 + g) * hd..][..hd] } else { &[][..] });
                let mut sts = [Online::START; attn::MULTI_MAX];
                let mut acc_it = accs.chunks_exact_mut(hd);
                let mut acc: [&mut [f32]; attn::MULTI_MAX] = std::array::from_fn(|_| acc_it.next().unwrap_or_default());
                acc[..nh].iter_mut().for_each(|a| a.fill(0.0));
                if f16_vec_path {
                    // llama.cpp's vector path (decode), the task's heads in lock step
                    for g in 0..nh {
                        q16[g * hd..(g + 1) * hd].iter_mut().zip(qs[g]).for_each(|(a, &b)| *a = f16::from_f32(b).to_f32());
                    }
                    let q16s: [&[f32]; attn::MULTI_MAX] =
                        std::array::from_fn(|g| if g < nh { &q16[g * hd..(g + 1) * hd] } else { &[][..] });
                    let mut j = lo;
                    while j <= pos {
                        let j_end = ((j / bs + 1) * bs).min(pos + 1);
                        if let Some((KvRows::F16(k), KvRows::F16(v))) = rows {
                            if j_end <= pos {
                                // the next block's K and V runs (cache blocks lie anywhere in
                                // the pool: the hardware prefetchers start over on each)
                                let next = kv.row_offset(&seq.block_table, j_end, kvh);
                                let n = ((j_end / bs + 1) * bs).min(pos + 1) - j_end;
                                attn::prefetch(k, next, n * hd);
                                attn::prefetch(v, next, n * hd);
                            }
                            let run = Run { start: kv.row_offset(&seq.block_table, j, kvh), stride: hd, len: j_end - j };
                            attn::vec_f16_run_multi(&q16s[..nh], k, v, run, sc, &mut sts[..nh], &mut acc[..nh]);
                        }
                        j = j_end;
                    }
                } else {
                    // one run per cache block: positions j..j_end are contiguous slots
                    let mut j = lo;
                    while j <= pos {
                        let j_end = ((j / bs + 1) * bs).min(pos + 1);
                        match rows {
                            Some((ks, vs)) => {
                                let run = Run { start: kv.row_offset(&seq.block_table, j, kvh), stride: hd, len: j_end - j };
                                attn::f32_run_multi(&qs[..nh], ks, vs, run, sc, &mut sts[..nh], &mut acc[..nh]);
                                j = j_end;
                            }
                            None => j = j_end,
                        }
                    }
                }
                for g in 0..nh {
                    let (f, sum) = with_sink(sts[g], sinks.map(|s| s[h0 + g]));
                    let inv = if sum > 0.0 { 1.0 / sum } else { 0.0 };
                    let base = (t * p.n_head + h0 + g) * hd;
                    for (d, &a) in acc[g].iter().enumerate() {
                        // SAFETY: each (token, head) is in exactly one task: base..base+hd is its own.
                        unsafe { out_ptr.write(base + d, a * f * inv) };
                    }
                }
            }
        })
    });
    Ok(())
}

/// A head's softmax state after its sink (`sink`: the head's extra logit, which attends to
/// nothing), folded in after the last position as llama.cpp does: the factor of the
/// accumulator and the new sum (factor 1 and the sum unchanged without a sink).
fn with_sink(st: Online, sink: Option<f32>) -> (f32, f32) {
    match sink {
        Some(s) if s > st.m => {
            let ms = (st.m - s).exp();
            (ms, st.s * ms + 1.0)
        }
        Some(s) => (1.0, st.s + (s - st.m).exp()),
        None => (1.0, st.s),
    }
}

/// Query tokens of one sequence that a quantized-cache task takes together: each K/V run is
/// dequantized once for all of them.
const QUANT_TILE: usize = 16;

/// Attention over a quantized (Q8_0 / Q4_0) cache, in the cache's rotated domain: each
/// query head is Hadamard-rotated once (`H·q · H·k = q·k`), K/V runs are dequantized as stored
/// (plus the rotated key offset, see `kv`), the f32 path runs over them, and the accumulated
/// output is rotated back once (`H · Σ w·H·v = Σ w·v`). A task is a tile of up to
/// `QUANT_TILE` tokens of one sequence and up to `attn::MULTI_MAX` heads of one KV head.
#[allow(clippy::too_many_arguments)]
fn attention_quant(
    be: &CpuBackend,
    q: &[f32],
    kv: &CpuKv,
    layer: usize,
    batch: &ForwardBatch,
    p: &AttnParams,
    sinks: Option<&[f32]>,
    out: &mut [f32],
) -> Result<()> {
    use quarrel_quant::rotate::hadamard_blocks;
    let hd = p.head_dim;
    let (kst, vst) = (&kv.k[layer], &kv.v[layer]);
    let r = kst.rotation().or(vst.rotation()).unwrap_or(hd);
    let group = p.n_head / p.n_kv_head;
    let hg = group.min(attn::MULTI_MAX);
    let chunks_per_kv = group.div_ceil(hg);
    let sc = Scoring { scale: p.scale, softcap: p.softcap };
    let bs = kv.spec.block_size;
    let offset = kv.k_offset[layer].as_ref();
    // (sequence, first token, tokens) tiles
    let tiles: Vec<(usize, usize, usize)> = batch
        .seqs
        .iter()
        .enumerate()
        .flat_map(|(si, s)| {
            (0..s.len.div_ceil(QUANT_TILE)).map(move |i| (si, s.start + i * QUANT_TILE, (s.len - i * QUANT_TILE).min(QUANT_TILE)))
        })
        .collect();
    let n_tasks = tiles.len() * p.n_kv_head * chunks_per_kv;
    let out_ptr = SyncPtr(out.as_mut_ptr());
    // K/V rows read with the f32 path: f32/f16 stores as they are, quantized ones dequantized
    let read = |st: &crate::kv::Store, at: usize, dst: &mut [f32], kvh_off: usize, is_k: bool| {
        match st.rows() {
            Some(KvRows::F32(v)) => dst.copy_from_slice(&v[at..at + hd]),
            Some(KvRows::F16(v)) => dst.iter_mut().zip(&v[at..at + hd]).for_each(|(a, b)| *a = b.to_f32()),
            None => st.dequantize_rotated(at, dst),
        }
        if st.rows().is_some() {
            // an unquantized half of a mixed cache: into the rotated domain
            hadamard_blocks(dst, r);
        } else if is_k {
            if let Some(o) = offset {
                dst.iter_mut().zip(&o.rotated[kvh_off..kvh_off + hd]).for_each(|(a, b)| *a += b);
            }
        }
    };
    be.for_each_task(n_tasks, &|task| {
        let (tile, rest) = (task / (p.n_kv_head * chunks_per_kv), task % (p.n_kv_head * chunks_per_kv));
        let (kvh, c) = (rest / chunks_per_kv, rest % chunks_per_kv);
        let (si, t0, nt) = tiles[tile];
        let seq = &batch.seqs[si];
        let h0 = kvh * group + c * hg;
        let nh = hg.min((kvh + 1) * group - h0);
        let kvh_off = kvh * hd;
        let need = 2 * QUANT_TILE * attn::MULTI_MAX * hd + 2 * QUANT_RUN * hd;
        SCRATCH.with(|cell| {
            let mut guard = cell.borrow_mut();
            if guard.len() < need {
                guard.resize(need, 0.0);
            }
            let (qr, rest) = guard.split_at_mut(QUANT_TILE * attn::MULTI_MAX * hd);
            let (accs, rest) = rest.split_at_mut(QUANT_TILE * attn::MULTI_MAX * hd);
            let (kq, rest) = rest.split_at_mut(QUANT_RUN * hd);
            let vq = &mut rest[..QUANT_RUN * hd];
            let mut sts = [[Online::START; attn::MULTI_MAX]; QUANT_TILE];
            let (mut lo_all, mut hi_all) = (usize::MAX, 0);
            for i in 0..nt {
                let t = t0 + i;
                let pos = batch.positions[t] as usize;
                lo_all = lo_all.min(p.sliding_window.map_or(0, |w| (pos + 1).saturating_sub(w)));
                hi_all = hi_all.max(pos + 1);
                for g in 0..nh {
                    let x = &mut qr[(i * attn::MULTI_MAX + g) * hd..][..hd];
                    x.copy_from_slice(&q[(t * p.n_head + h0 + g) * hd..][..hd]);
                    hadamard_blocks(x, r);
                    accs[(i * attn::MULTI_MAX + g) * hd..][..hd].fill(0.0);
                }
            }
            let mut j = lo_all;
            while j < hi_all {
                let j_end = ((j / bs + 1) * bs).min(hi_all).min(j + QUANT_RUN);
                for (ri, jj) in (j..j_end).enumerate() {
                    let at = kv.row_offset(&seq.block_table, jj, kvh);
                    read(kst, at, &mut kq[ri * hd..(ri + 1) * hd], kvh_off, true);
                    read(vst, at, &mut vq[ri * hd..(ri + 1) * hd], kvh_off, false);
                }
                for i in 0..nt {
                    let pos = batch.positions[t0 + i] as usize;
                    let lo = p.sliding_window.map_or(0, |w| (pos + 1).saturating_sub(w));
                    let (a, b) = (j.max(lo), j_end.min(pos + 1));
                    if a >= b {
                        continue;
                    }
                    let qs: [&[f32]; attn::MULTI_MAX] =
                        std::array::from_fn(|g| if g < nh { &qr[(i * attn::MULTI_MAX + g) * hd..][..hd] } else { &[][..] });
                    let mut it = accs[i * attn::MULTI_MAX * hd..(i + 1) * attn::MULTI_MAX * hd].chunks_exact_mut(hd);
                    let mut acc: [&mut [f32]; attn::MULTI_MAX] = std::array::from_fn(|_| it.next().unwrap_or_default());
                    let run = Run { start: (a - j) * hd, stride: hd, len: b - a };
                    let n = (j_end - j) * hd;
                    attn::f32_run_multi(
                        &qs[..nh],
                        KvRows::F32(&kq[..n]),
                        KvRows::F32(&vq[..n]),
                        run,
                        sc,
                        &mut sts[i][..nh],
                        &mut acc[..nh],
                    );
                }
                j = j_end;
            }
            for i in 0..nt {
                for g in 0..nh {
                    let acc = &mut accs[(i * attn::MULTI_MAX + g) * hd..][..hd];
                    hadamard_blocks(acc, r);
                    let (f, sum) = with_sink(sts[i][g], sinks.map(|s| s[h0 + g]));
                    let inv = if sum > 0.0 { 1.0 / sum } else { 0.0 };
                    let base = ((t0 + i) * p.n_head + h0 + g) * hd;
                    for (d, &a) in acc.iter().enumerate() {
                        // SAFETY: each (token, head) is in exactly one task: base..base+hd is its own.
                        unsafe { out_ptr.write(base + d, a * f * inv) };
                    }
                }
            }
        })
    });
    Ok(())
}
