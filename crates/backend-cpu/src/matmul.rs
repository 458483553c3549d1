//! Quantized matrix multiplication: activations quantized once per row to the weight's
//! vec_dot_type, then row chunks of W run in parallel, each over all tokens (so a chunk of
//! weight rows is read from memory once per call, not once per token).
//!
//! Several tokens with a GEMM kernel for the type ([`simd::gemm_fn`]): activations are
//! repacked into panels of [`GEMM_TOKENS`] tokens, each task repacks its rows into panels of
//! [`GEMM_ROWS`] rows and runs tiles over them (token panels outer, so a panel stays in
//! cache while the task's rows go by). From `WIDE_MIN_TOKENS` tokens on, types with wide
//! tiles use panels of [`GEMM_WIDE_TOKENS`] tokens instead, quantized and packed straight
//! from the f32 activations in one parallel pass. Tasks split rows, and tokens too where
//! there are few row chunks. Every output has the bits the one-row kernel gives it.

use crate::simd::{self, Dot4Fn, DotFn, Gemm, Gemv8Fn, GEMM_ROWS, GEMM_TOKENS, GEMM_WIDE_TOKENS, GEMV_ROWS};
use crate::{CpuBackend, CpuWeight};
use quarrel_core::Result;
use std::cell::RefCell;

/// A raw pointer that tasks write through at disjoint indices.
#[derive(Clone, Copy)]
pub(crate) struct SyncPtr(pub *mut f32);
unsafe impl Send for SyncPtr {}
unsafe impl Sync for SyncPtr {}

impl SyncPtr {
    /// SAFETY: callers write disjoint indices within the allocation.
    #[inline]
    pub unsafe fn write(self, i: usize, v: f32) {
        *self.0.add(i) = v;
    }

    /// SAFETY: callers write disjoint ranges `i..i + src.len()` within the allocation.
    #[inline]
    pub unsafe fn write_slice(self, i: usize, src: &[f32]) {
        std::ptr::copy_nonoverlapping(src.as_ptr(), self.0.add(i), src.len());
    }
}

/// Quantize `n_tok` rows of `x` to `ty` into `out` (`ty.row_bytes(n_in) * n_tok` bytes; in
/// parallel for many rows), bit-compatible with ggml's x86 activation quantizers (`actquant`),
/// using the SIMD twin where there is one.
pub(crate) fn quantize_rows(
    be: &CpuBackend,
    ty: quarrel_core::QuantType,
    x: &[f32],
    n_in: usize,
    n_tok: usize,
    out: &mut [u8],
) -> Result<()> {
    let rb = ty
        .row_bytes(n_in)
        .ok_or_else(|| quarrel_core::CoreError::Shape(format!("row of {n_in} is not a multiple of the {} block", ty.name())))?;
    let out = &mut out[..rb * n_tok];
    let fast = simd::quantize_row_fn_ggml_x86(ty);
    let one = |xr: &[f32], or: &mut [u8]| -> Result<()> {
        match fast {
            Some(f) => {
                f(xr, or);
                Ok(())
            }
            None => crate::actquant::quantize_row(ty, xr, or),
        }
    };
    if n_tok >= 8 {
        let err = std::sync::Mutex::new(None);
        be.par_chunks_mut(out, rb, &|t, or| {
            if let Err(e) = one(&x[t * n_in..(t + 1) * n_in], or) {
                *err.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
            }
        });
        if let Some(e) = err.into_inner().unwrap_or_else(|p| p.into_inner()) {
            return Err(e);
        }
    } else {
        x.chunks(n_in).zip(out.chunks_mut(rb)).try_for_each(|(xr, or)| one(xr, or))?;
    }
    Ok(())
}

pub(crate) fn matmul(be: &CpuBackend, w: &CpuWeight, x: &[f32], n_tok: usize, out: &mut [f32]) -> Result<()> {
    if crate::matmul_amx::takes(be, w) {
        return crate::matmul_amx::matmul_f16(be, w, x, n_tok, out);
    }
    if let Some(g) = wide_gemm(be, w, n_tok) {
        return gemm_wide_f32(be, g, w, x, n_tok, out);
    }
    let act_ty = w.ty.vec_dot_type();
    let arb = act_ty.row_bytes(w.n_in).unwrap_or(0);
    // the quantized activations live in this thread's scratch (no allocation per call)
    with_scratch(Scratch::Quant, arb * n_tok, |xq| -> Result<()> {
        quantize_rows(be, act_ty, x, w.n_in, n_tok, xq)?;
        matmul_quantized(be, w, &xq[..arb * n_tok], arb, n_tok, out);
        Ok(())
    })
}

/// `out = x W^T` from the quantized activations `xq` (`arb` bytes per token).
fn matmul_quantized(be: &CpuBackend, w: &CpuWeight, xq: &[u8], arb: usize, n_tok: usize, out: &mut [f32]) {
    // (an expert view shares its tensor's repacked copy)
    if let Some(rt) = simd::repack::enabled(w.ty) {
        if let Some(packed) = w.packed(be, rt) {
            crate::matmul_repacked::matmul_repacked(be, w, rt, packed, xq, arb, n_tok, out);
            return;
        }
    }
    if let Some(g) = simd::gemm_fn(w.ty).filter(|g| n_tok >= g.min_tokens()) {
        gemm(be, g, w, xq, arb, n_tok, out);
        return;
    }
    let dot: Option<DotFn> = simd::dot_fn(w.ty);
    let dot4: Option<Dot4Fn> = simd::dot4_fn(w.ty);
    let gemv8: Option<Gemv8Fn> = simd::gemv8_fn(w.ty);
    let (n_in, n_out, ty) = (w.n_in, w.n_out, w.ty);
    let out_ptr = SyncPtr(out.as_mut_ptr());
    // contiguous runs of rows per task, a few tasks per thread: each thread streams long runs
    // of weight rows (what the hardware prefetchers follow), and the shared task counter is
    // touched a few times per op instead of once per 16 rows
    let unit = if gemv8.is_some() { GEMV_ROWS } else { 4 };
    let n_units = n_out.div_ceil(unit);
    let units_per_task = n_units.div_ceil(GEMV_TASKS_PER_THREAD * be.n_threads().max(1)).max(1);
    let rows_per_task = units_per_task * unit;
    let n_tasks = n_out.div_ceil(rows_per_task);
    let (wb, rb) = (w.bytes(), w.row_bytes());
    let row = |r: usize| &wb[r * rb..(r + 1) * rb];
    be.for_each_task(n_tasks, &|task| {
        let r0 = task * rows_per_task;
        let r1 = (r0 + rows_per_task).min(n_out);
        // a few rows at a time, every token over them: the rows stay in L1 while the tokens
        // go by, so a few tokens read the weights once (the same kernel per row and token
        // as one token alone)
        let a = |t: usize| &xq[t * arb..(t + 1) * arb];
        let mut r = r0;
        if let Some(g8) = gemv8 {
            let mut o = [0f32; GEMV_ROWS];
            while r + GEMV_ROWS <= r1 {
                for t in 0..n_tok {
                    g8(n_in, &wb[r * rb..(r + GEMV_ROWS) * rb], rb, a(t), &mut o);
                    // SAFETY: (t, r) pairs are disjoint across tasks; index < n_tok * n_out.
                    unsafe { out_ptr.write_slice(t * n_out + r, &o) };
                }
                r += GEMV_ROWS;
            }
        }
        if let Some(f4) = dot4 {
            while r + 4 <= r1 {
                for t in 0..n_tok {
                    let v = f4(n_in, [row(r), row(r + 1), row(r + 2), row(r + 3)], a(t));
                    // SAFETY: as above.
                    unsafe { out_ptr.write_slice(t * n_out + r, &v) };
                }
                r += 4;
            }
        }
        for r in r..r1 {
            let wr = row(r);
            for t in 0..n_tok {
                let v = match dot {
                    Some(f) => f(n_in, wr, a(t)),
                    None => simd::reference_dot(ty, n_in, wr, a(t)),
                };
                // SAFETY: as above.
                unsafe { out_ptr.write(t * n_out + r, v) };
            }
        }
    });
}

/// Tasks per thread of a GEMV (contiguous row runs; the pool hands out the leftovers).
pub(crate) const GEMV_TASKS_PER_THREAD: usize = 4;

/// 64 bytes, 64-byte aligned: panel storage.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// Which per-thread scratch buffer (the caller runs tasks too, while it holds the
/// quantized activations and the activation panels).
#[derive(Clone, Copy)]
enum Scratch {
    Quant,
    Act,
    Weights,
    Stage,
}

thread_local! {
    /// This thread's panel storage, kept between calls (grown as needed).
    static SCRATCH: [RefCell<Vec<Line>>; 4] = const { [RefCell::new(Vec::new()), RefCell::new(Vec::new()), RefCell::new(Vec::new()), RefCell::new(Vec::new())] };
}

/// `f` on at least `n` bytes of 64-byte aligned scratch of this thread (contents left from
/// earlier use; a fresh buffer if this thread's is in use).
fn with_scratch<R>(which: Scratch, n: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
    let lines = n.div_ceil(64);
    let bytes = |v: &mut [Line]| {
        // SAFETY: `Line` is 64 plain bytes without padding; the slice covers exactly `v`.
        unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, v.len() * 64) }
    };
    SCRATCH.with(|c| match c[which as usize].try_borrow_mut() {
        Ok(mut v) => {
            if v.len() < lines {
                *v = vec![Line([0; 64]); lines];
            }
            f(bytes(&mut v[..lines]))
        }
        Err(_) => f(bytes(&mut vec![Line([0; 64]); lines])),
    })
}

/// `f` on at least `n` bytes of this thread's activation-panel scratch ([`with_scratch`]).
pub(crate) fn with_act_scratch<R>(n: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
    with_scratch(Scratch::Act, n, f)
}

/// Most row panels (of `GEMM_ROWS` rows) one task repacks and runs.
const MAX_PANELS_PER_TASK: usize = 16;
/// Fewest row panels per task (unless the matrix has fewer): below this the activation
/// panels would be read from memory too often per weight byte.
const MIN_PANELS_PER_TASK: usize = 8;
/// Tasks wanted per thread (the pool hands them out one at a time).
const TASKS_PER_THREAD: usize = 8;

/// Most token groups a task runs panel by panel (each weight panel's tiles for all of the
/// task's groups while the panel is in L1) rather than group by group.
const PANEL_MAJOR_GROUPS: usize = 4;

/// The tokens of activation panel `gi` when `n_tok` tokens go into panels of at most `gt`:
/// the 8-token panels share the tokens evenly (9 tokens: 5 + 4, not 8 + 1, whose one-token
/// tiles would convert every weight for one token's multiply-adds), wide panels are full but
/// the last.
fn group_tokens(gi: usize, gt: usize, n_tok: usize) -> std::ops::Range<usize> {
    if gt != GEMM_TOKENS {
        return gi * gt..(gi * gt + gt).min(n_tok);
    }
    let n_groups = n_tok.div_ceil(gt).max(1);
    let (base, rem) = (n_tok / n_groups, n_tok % n_groups);
    let start = gi * base + gi.min(rem);
    start..start + base + usize::from(gi < rem)
}

/// Fewest tokens for the wide tiles ([`Gemm::tile_wide`], 16 tokens; fewer tokens leave
/// lanes idle, and below this the 8-token tiles do less work).
const WIDE_MIN_TOKENS: usize = 12;

/// The GEMM kernels when `matmul_quantized` would run the wide tiles for this weight and
/// token count (no repacked form in use, a GEMM kind with wide tiles, tokens enough).
fn wide_gemm(be: &CpuBackend, w: &CpuWeight, n_tok: usize) -> Option<Gemm> {
    if n_tok < WIDE_MIN_TOKENS || crate::matmul_amx::takes(be, w) {
        return None;
    }
    if let Some(rt) = simd::repack::enabled(w.ty) {
        if w.packed(be, rt).is_some() {
            return None;
        }
    }
    simd::gemm_fn(w.ty).filter(|g| n_tok >= g.min_tokens() && g.has_wide())
}

/// The wide-tile GEMM from f32 activations: one parallel pass quantizes (per 32-block, as
/// the row quantizer does: its blocks are independent) and packs the activation panels,
/// tasks splitting tokens groups x block ranges; then the tiles ([`run_tasks`]).
fn gemm_wide_f32(be: &CpuBackend, g: Gemm, w: &CpuWeight, x: &[f32], n_tok: usize, out: &mut [f32]) -> Result<()> {
    let apb = g.wide_act_panel_bytes(w.n_in);
    let n_groups = n_tok.div_ceil(GEMM_WIDE_TOKENS);
    with_scratch(Scratch::Act, n_groups * apb, |act| -> Result<()> {
        let act = &mut act[..n_groups * apb];
        pack_wide_act(be, g, w.ty, w.n_in, x, n_tok, act)?;
        let act: &[u8] = act;
        let act_panel = |gi: usize| &act[gi * apb..(gi + 1) * apb];
        run_tasks(be, g, w, n_tok, GEMM_WIDE_TOKENS, &act_panel, out);
        Ok(())
    })
}

/// Quantize `x` (`n_tok` rows of `n_in`) to `ty`'s vec_dot_type and pack it into wide
/// activation panels (`act`: one panel of `g.wide_act_panel_bytes(n_in)` per 16 tokens), in
/// one parallel pass over (token group, block range) tasks.
fn pack_wide_act(
    be: &CpuBackend,
    g: Gemm,
    ty: quarrel_core::QuantType,
    n_in: usize,
    x: &[f32],
    n_tok: usize,
    act: &mut [u8],
) -> Result<()> {
    const QK: usize = 32;
    let act_ty = ty.vec_dot_type();
    let nb = n_in / QK;
    let abb = act_ty.row_bytes(QK).ok_or_else(|| quarrel_core::CoreError::Shape(format!("no {} blocks of {QK}", act_ty.name())))?;
    let (apb, pbb) = (g.wide_act_panel_bytes(n_in), g.wide_act_panel_bytes(QK));
    let n_groups = n_tok.div_ceil(GEMM_WIDE_TOKENS);
    assert!(act.len() >= n_groups * apb && x.len() >= n_tok * n_in);
    let fast = simd::quantize_row_fn_ggml_x86(act_ty);
    // a few tasks per thread over (token group, block range)
    let want = (4 * be.n_threads().max(1)).div_ceil(n_groups);
    let bpt = nb.div_ceil(want).max(1);
    let chunks = nb.div_ceil(bpt);
    let err = std::sync::Mutex::new(None);
    let act_ptr = act.as_mut_ptr() as usize;
    be.for_each_task(n_groups * chunks, &|task| {
        let (gi, c) = (task / chunks, task % chunks);
        let (b0, b1) = (c * bpt, ((c + 1) * bpt).min(nb));
        let ts = gi * GEMM_WIDE_TOKENS..(gi * GEMM_WIDE_TOKENS + GEMM_WIDE_TOKENS).min(n_tok);
        let qb = (b1 - b0) * abb;
        with_scratch(Scratch::Quant, ts.len() * qb, |q| {
            for (k, t) in ts.clone().enumerate() {
                let (xs, qs) = (&x[t * n_in + b0 * QK..t * n_in + b1 * QK], &mut q[k * qb..(k + 1) * qb]);
                match fast {
                    Some(f) => f(xs, qs),
                    None => {
                        if let Err(e) = crate::actquant::quantize_row(act_ty, xs, qs) {
                            *err.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                        }
                    }
                }
            }
            let mut rows: [&[u8]; GEMM_WIDE_TOKENS] = [&[]; GEMM_WIDE_TOKENS];
            for (k, r) in rows.iter_mut().take(ts.len()).enumerate() {
                *r = &q[k * qb..(k + 1) * qb];
            }
            // SAFETY: blocks b0..b1 of group gi's panel belong to this task alone, and lie
            // within the n_groups * apb bytes of `act` (asserted), which outlives the tasks.
            let panel = unsafe { std::slice::from_raw_parts_mut((act_ptr as *mut u8).add(gi * apb + b0 * pbb), (b1 - b0) * pbb) };
            g.pack_act_wide((b1 - b0) * QK, &rows[..ts.len()], panel);
        })
    });
    match err.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// `outs[i] = x · W_iᵀ` for weights sharing their input ([`quarrel_core::Backend::matmul_many`]).
/// When every weight runs the wide tiles of one kind over kept panels, `x` is quantized and
/// packed once and all weights' tiles run as one parallel job (one barrier instead of one per
/// weight, and the threads balance over all rows); otherwise one [`matmul`] per weight.
/// Every output has the bits [`matmul`] gives it (the same tiles over the same panels).
pub(crate) fn matmul_many(be: &CpuBackend, ws: &[&CpuWeight], x: &[f32], n_tok: usize, outs: &mut [&mut Vec<f32>]) -> Result<()> {
    if let Some(g) = ws.first().and_then(|w| wide_gemm(be, w, n_tok)) {
        let w0 = ws[0];
        let same = ws.iter().all(|w| w.n_in == w0.n_in && w.ty == w0.ty && wide_gemm(be, w, n_tok) == Some(g));
        if ws.len() > 1 && same && !g.raw_panels() {
            // the weights' kept panels (packed now where this is the first GEMM)
            let panels: Option<Vec<&[u8]>> = ws.iter().map(|w| kept_panels(be, g, w)).collect();
            if let Some(panels) = panels {
                let apb = g.wide_act_panel_bytes(w0.n_in);
                let n_groups = n_tok.div_ceil(GEMM_WIDE_TOKENS);
                return with_scratch(Scratch::Act, n_groups * apb, |act| -> Result<()> {
                    let act = &mut act[..n_groups * apb];
                    pack_wide_act(be, g, w0.ty, w0.n_in, x, n_tok, act)?;
                    let act: &[u8] = act;
                    let act_panel = |gi: usize| &act[gi * apb..(gi + 1) * apb];
                    let jobs: Vec<Job> = ws
                        .iter()
                        .zip(panels)
                        .zip(outs.iter_mut())
                        .map(|((w, panels), o)| Job { w, panels, out: SyncPtr(o.as_mut_ptr()) })
                        .collect();
                    run_jobs(be, g, &jobs, n_tok, GEMM_WIDE_TOKENS, &act_panel);
                    Ok(())
                });
            }
        }
    }
    ws.iter().zip(outs.iter_mut()).try_for_each(|(w, o)| matmul(be, w, x, n_tok, o))
}

/// `w`'s kept GEMM panels for `g` (packed on this first use), or None where the panel budget
/// does not keep them (the caller then runs a plain [`matmul`]).
fn kept_panels<'w>(be: &CpuBackend, g: Gemm, w: &'w CpuWeight) -> Option<&'w [u8]> {
    let bytes = w.n_out.div_ceil(GEMM_ROWS) * stored_panel_bytes(g, w);
    w.kept_gemm_panels(bytes, |v| pack_weight_panels(be, g, w, v))
}

/// Whether `w`'s panels are compact ([`Gemm::compact_panel_bytes`], expanded per task): where
/// the kind has compact panels and they are kept (an expert view's per-call panels are not
/// worth compacting).
fn compact_panels(g: Gemm, w: &CpuWeight) -> bool {
    !w.is_view() && g.compact_panel_bytes(w.n_in).is_some()
}

/// Bytes of one of `w`'s GEMM weight panels as stored (see [`compact_panels`]).
fn stored_panel_bytes(g: Gemm, w: &CpuWeight) -> usize {
    match compact_panels(g, w) {
        true => g.compact_panel_bytes(w.n_in).unwrap_or_else(|| g.weight_panel_bytes(w.n_in)),
        false => g.weight_panel_bytes(w.n_in),
    }
}

/// Fill `v` with `w`'s GEMM weight panels ([`GEMM_ROWS`] rows each, compact where
/// [`compact_panels`]), in parallel.
fn pack_weight_panels(be: &CpuBackend, g: Gemm, w: &CpuWeight, v: &mut [u8]) {
    let (n_in, n_out) = (w.n_in, w.n_out);
    let (wbytes, wrb) = (w.bytes(), w.row_bytes());
    let compact = compact_panels(g, w);
    let spb = stored_panel_bytes(g, w);
    be.par_chunks_mut(v, spb, &|p, panel| {
        if panel.len() < spb {
            return; // the rounding tail of the panel storage
        }
        let mut rows: [&[u8]; GEMM_ROWS] = [&[]; GEMM_ROWS];
        let r1 = (p * GEMM_ROWS + GEMM_ROWS).min(n_out);
        for (k, r) in (p * GEMM_ROWS..r1).enumerate() {
            rows[k] = &wbytes[r * wrb..(r + 1) * wrb];
        }
        if compact {
            g.pack_weights_compact(n_in, &rows[..r1 - p * GEMM_ROWS], panel);
        } else {
            g.pack_weights(n_in, &rows[..r1 - p * GEMM_ROWS], panel);
        }
    });
}

/// `out[t * n_out + r]` for all tokens through the 8-token GEMM tiles (`xq`: quantized
/// activations, `arb` bytes per token; the wide tiles start from f32: [`gemm_wide_f32`]).
fn gemm(be: &CpuBackend, g: Gemm, w: &CpuWeight, xq: &[u8], arb: usize, n_tok: usize, out: &mut [f32]) {
    let (n_in, apb) = (w.n_in, g.act_panel_bytes(w.n_in));
    // activation panels are always packed (once per call, shared by every task)
    let n_groups = n_tok.div_ceil(GEMM_TOKENS);
    let tokens = |gi: usize| group_tokens(gi, GEMM_TOKENS, n_tok);
    with_scratch(Scratch::Act, n_groups * apb, |act| {
        let pack = |gi: usize, panel: &mut [u8]| {
            let mut rows: [&[u8]; GEMM_TOKENS] = [&[]; GEMM_TOKENS];
            let ts = tokens(gi);
            for (k, t) in ts.clone().enumerate() {
                rows[k] = &xq[t * arb..(t + 1) * arb];
            }
            g.pack_act(n_in, &rows[..ts.len()], panel);
        };
        let act = &mut act[..n_groups * apb];
        if n_groups >= 4 {
            be.par_chunks_mut(act, apb, &pack);
        } else {
            act.chunks_mut(apb).enumerate().for_each(|(gi, panel)| pack(gi, panel));
        }
        let act: &[u8] = act;
        let act_panel = |gi: usize| &act[gi * apb..(gi + 1) * apb];
        run_tasks(be, g, w, n_tok, GEMM_TOKENS, &act_panel, out);
    });
}

/// The tasks of [`gemm`]: row panels x token groups over the weight's panels (packed on
/// its first GEMM and kept; raw kinds read the rows in place and pack only a short last
/// panel). `gt`: tokens per activation panel ([`GEMM_TOKENS`], or [`GEMM_WIDE_TOKENS`] for
/// the wide tiles).
fn run_tasks<'a>(
    be: &CpuBackend,
    g: Gemm,
    w: &CpuWeight,
    n_tok: usize,
    gt: usize,
    act_panel: &(dyn Fn(usize) -> &'a [u8] + Sync),
    out: &mut [f32],
) {
    let n_panels = w.n_out.div_ceil(GEMM_ROWS);
    let bytes = if g.raw_panels() { 0 } else { n_panels * stored_panel_bytes(g, w) };
    let out = SyncPtr(out.as_mut_ptr());
    w.with_gemm_panels(
        bytes,
        |v| pack_weight_panels(be, g, w, v),
        |panels| run_jobs(be, g, &[Job { w, panels, out }], n_tok, gt, act_panel),
    );
}

/// One weight of [`run_jobs`]: its kept panels (empty for raw kinds, compact where the kind
/// has compact panels) and where its `(n_tok, n_out)` output goes.
struct Job<'a> {
    w: &'a CpuWeight,
    panels: &'a [u8],
    out: SyncPtr,
}

/// Tiles of one or more weights over the same activation panels as one parallel job: tasks
/// are runs of row panels of one weight (sized over all the weights' panels together) x
/// token groups.
fn run_jobs<'a>(be: &CpuBackend, g: Gemm, jobs: &[Job], n_tok: usize, gt: usize, act_panel: &(dyn Fn(usize) -> &'a [u8] + Sync)) {
    let Some(n_in) = jobs.first().map(|j| j.w.n_in) else { return };
    let raw = g.raw_panels();
    let wpb = g.weight_panel_bytes(n_in);
    let n_groups = n_tok.div_ceil(gt);
    let n_panels: Vec<usize> = jobs.iter().map(|j| j.w.n_out.div_ceil(GEMM_ROWS)).collect();
    let total: usize = n_panels.iter().sum();
    let want_tasks = TASKS_PER_THREAD * be.n_threads().max(1);
    let smallest = n_panels.iter().copied().min().unwrap_or(1);
    let ppt = total.div_ceil(want_tasks).clamp(MIN_PANELS_PER_TASK.min(smallest), MAX_PANELS_PER_TASK);
    // row tasks per job, and where each job's start in the task numbering
    let mut first_task = Vec::with_capacity(jobs.len() + 1);
    first_task.push(0usize);
    for &np in &n_panels {
        first_task.push(first_task.last().unwrap() + np.div_ceil(ppt));
    }
    let row_tasks = *first_task.last().unwrap();
    let gpt = n_groups.div_ceil(want_tasks.div_ceil(row_tasks).min(n_groups));
    let tok_tasks = n_groups.div_ceil(gpt);
    be.for_each_task(row_tasks * tok_tasks, &|task| {
        let (rt, g0) = (task / tok_tasks, task % tok_tasks * gpt);
        let ji = first_task.partition_point(|&f| f <= rt) - 1;
        let Job { w, panels, out } = &jobs[ji];
        let (n_out, np) = (w.n_out, n_panels[ji]);
        let compact = !raw && compact_panels(g, w);
        let spb = stored_panel_bytes(g, w);
        let (wbytes, wrb) = (w.bytes(), w.row_bytes());
        let p0 = (rt - first_task[ji]) * ppt;
        let (p1, g1) = ((p0 + ppt).min(np), (g0 + gpt).min(n_groups));
        let short = raw && p1 == np && n_out % GEMM_ROWS != 0;
        // a task with few token groups runs each panel's tiles for all of them in a row (the
        // panel stays in L1), others group by group; compact panels are expanded here: each
        // one right before its tiles where the task goes panel by panel, else all of the
        // task's panels first
        let panel_major = g1 - g0 == 1 || (gt == GEMM_TOKENS && g1 - g0 <= PANEL_MAJOR_GROUPS);
        let scratch = if compact {
            if panel_major {
                wpb
            } else {
                (p1 - p0) * wpb
            }
        } else {
            usize::from(short) * wpb
        };
        with_scratch(Scratch::Weights, scratch, |wp| {
            if compact && !panel_major {
                for p in p0..p1 {
                    g.expand_panel(n_in, &panels[p * spb..(p + 1) * spb], &mut wp[(p - p0) * wpb..(p - p0 + 1) * wpb]);
                }
            }
            if short {
                let mut rows: [&[u8]; GEMM_ROWS] = [&[]; GEMM_ROWS];
                let r0 = (np - 1) * GEMM_ROWS;
                for (k, r) in (r0..n_out).enumerate() {
                    rows[k] = &wbytes[r * wrb..(r + 1) * wrb];
                }
                g.pack_weights(n_in, &rows[..n_out - r0], &mut wp[..wpb]);
            }
            let wp = &mut wp[..scratch];
            // the task's outputs of one token group, token-major, copied out row by row (one
            // contiguous store per token: scattered 16-byte stores to n_tok rows cost more)
            let (ra, rb) = (p0 * GEMM_ROWS, (p1 * GEMM_ROWS).min(n_out));
            let width = (p1 - p0) * GEMM_ROWS;
            // (panel by panel: a stage per group)
            let stages = if panel_major { g1 - g0 } else { 1 };
            with_scratch(Scratch::Stage, stages * gt * width * 4, |bytes| {
                // SAFETY: 64-byte aligned scratch of at least stages * gt * width f32 (any
                // bits are valid f32); every entry read below is written by a tile first.
                let stage = unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr() as *mut f32, stages * gt * width) };
                // panel `p` before its tiles: a compact one expanded into the scratch (where
                // the task goes panel by panel; it stays in L1 for its tiles), the next one
                // fetched while these run
                let prepare = |p: usize, wp: &mut [u8]| {
                    if compact && panel_major {
                        g.expand_panel(n_in, &panels[p * spb..(p + 1) * spb], &mut wp[..wpb]);
                        if p + 1 < np {
                            // the next compact panel, while this one's tiles run (the tile's
                            // own prefetch points into the scratch here): -20% of a 16-token
                            // step's Q4_1 GEMM time against none; past the task's last panel
                            // too (the pool gives a thread neighbouring tasks)
                            crate::simd::attn::prefetch(panels, (p + 1) * spb, spb);
                        }
                    }
                    if raw && panel_major && (p + 2) * GEMM_ROWS <= n_out {
                        // the next panel's rows while this one's tiles run: a few tokens'
                        // tiles are bound by reading the weights, in passes the hardware
                        // prefetchers follow poorly
                        crate::simd::attn::prefetch(wbytes, (p + 1) * GEMM_ROWS * wrb, GEMM_ROWS * wrb);
                    }
                };
                // the tiles of panel `p` and group `gi` into `stage` (token-major, `width` a row)
                let tiles = |gi: usize, p: usize, wp: &[u8], stage: &mut [f32]| {
                    let nt = group_tokens(gi, gt, n_tok).len();
                    let ap = act_panel(gi);
                    let c = (p - p0) * GEMM_ROWS;
                    let w_panel: &[u8] = match (compact, raw, (p + 1) * GEMM_ROWS <= n_out) {
                        (true, _, _) if panel_major => &wp[..wpb],
                        (true, _, _) => &wp[(p - p0) * wpb..(p - p0 + 1) * wpb],
                        (false, true, true) => &wbytes[p * GEMM_ROWS * wrb..(p + 1) * GEMM_ROWS * wrb],
                        (false, true, false) => &wp[..wpb],
                        (false, false, _) => &panels[p * wpb..(p + 1) * wpb],
                    };
                    if gt == GEMM_WIDE_TOKENS {
                        g.tile_wide(n_in, w_panel, ap, nt, &mut stage[c..], width);
                    } else {
                        let mut tile = [[0f32; GEMM_TOKENS]; GEMM_ROWS];
                        g.tile(n_in, w_panel, ap, nt, &mut tile);
                        for (r, row) in tile.iter().enumerate() {
                            for (t, &v) in row[..nt].iter().enumerate() {
                                stage[t * width + c + r] = v;
                            }
                        }
                    }
                };
                // group `gi`'s outputs from its stage
                let copy_out = |gi: usize, stage: &[f32]| {
                    let ts = group_tokens(gi, gt, n_tok);
                    for (k, t) in ts.enumerate() {
                        let src = &stage[k * width..k * width + (rb - ra)];
                        // SAFETY: the group's tokens and rows ra..rb of this job's output
                        // belong to this task alone; t * n_out + rb <= n_tok * n_out, the
                        // output's length.
                        unsafe { out.write_slice(t * n_out + ra, src) };
                    }
                };
                let per_group = gt * width;
                if panel_major {
                    for p in p0..p1 {
                        prepare(p, wp);
                        for gi in g0..g1 {
                            tiles(gi, p, wp, &mut stage[(gi - g0) * per_group..]);
                        }
                    }
                    for gi in g0..g1 {
                        copy_out(gi, &stage[(gi - g0) * per_group..]);
                    }
                } else {
                    for gi in g0..g1 {
                        for p in p0..p1 {
                            tiles(gi, p, wp, stage);
                        }
                        copy_out(gi, stage);
                    }
                }
            });
        })
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Token groups cover every token once, in order, within the panel size; the 8-token
    /// groups differ by at most one token.
    #[test]
    fn token_groups_partition_the_tokens_evenly() {
        for gt in [GEMM_TOKENS, GEMM_WIDE_TOKENS] {
            for n_tok in 1usize..200 {
                let n_groups = n_tok.div_ceil(gt);
                let groups: Vec<_> = (0..n_groups).map(|gi| group_tokens(gi, gt, n_tok)).collect();
                assert_eq!(groups[0].start, 0);
                assert_eq!(groups[n_groups - 1].end, n_tok);
                for w in groups.windows(2) {
                    assert_eq!(w[0].end, w[1].start, "gt {gt} n_tok {n_tok}");
                }
                let sizes: Vec<usize> = groups.iter().map(|g| g.len()).collect();
                assert!(sizes.iter().all(|&s| s >= 1 && s <= gt), "gt {gt} n_tok {n_tok}: {sizes:?}");
                if gt == GEMM_TOKENS {
                    let (lo, hi) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
                    assert!(hi - lo <= 1, "n_tok {n_tok}: {sizes:?}");
                }
            }
        }
        assert_eq!(group_tokens(0, GEMM_TOKENS, 9), 0..5);
        assert_eq!(group_tokens(1, GEMM_TOKENS, 9), 5..9);
    }
}
