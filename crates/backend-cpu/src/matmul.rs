//! Quantized matrix multiplication: activations quantized once per row to the weight's
//! vec_dot_type, then row chunks of W run in parallel, each over all tokens (so a chunk of
//! weight rows is read from memory once per call, not once per token).

use crate::simd::{self, Dot4Fn, DotFn};
use crate::{CpuBackend, CpuWeight};
use quarrel_core::Result;
use rayon::prelude::*;

/// Rows of W handed to one task.
const ROWS_PER_TASK: usize = 16;

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
}

/// Quantize `n_tok` rows of `x` to `ty` (in parallel for many rows), bit-compatible with
/// ggml's x86 activation quantizers (`actquant`), using the SIMD twin where there is one.
pub(crate) fn quantize_rows(be: &CpuBackend, ty: quarrel_core::QuantType, x: &[f32], n_in: usize, n_tok: usize) -> Result<Vec<u8>> {
    let rb = ty
        .row_bytes(n_in)
        .ok_or_else(|| quarrel_core::CoreError::Shape(format!("row of {n_in} is not a multiple of the {} block", ty.name())))?;
    let mut out = vec![0u8; rb * n_tok];
    let fast = simd::quantize_row_fn_ggml_x86(ty);
    let one = |(xr, or): (&[f32], &mut [u8])| -> Result<()> {
        match fast {
            Some(f) => {
                f(xr, or);
                Ok(())
            }
            None => crate::actquant::quantize_row(ty, xr, or),
        }
    };
    if n_tok >= 8 {
        be.pool().install(|| x.par_chunks(n_in).zip(out.par_chunks_mut(rb)).try_for_each(one))?;
    } else {
        x.chunks(n_in).zip(out.chunks_mut(rb)).try_for_each(one)?;
    }
    Ok(out)
}

pub(crate) fn matmul(be: &CpuBackend, w: &CpuWeight, x: &[f32], n_tok: usize, out: &mut [f32]) -> Result<()> {
    let act_ty = w.ty.vec_dot_type();
    let xq = quantize_rows(be, act_ty, x, w.n_in, n_tok)?;
    let arb = act_ty.row_bytes(w.n_in).unwrap_or(0);
    let dot: Option<DotFn> = simd::dot_fn(w.ty);
    let dot4: Option<Dot4Fn> = simd::dot4_fn(w.ty);
    let (n_in, n_out, ty) = (w.n_in, w.n_out, w.ty);
    let out_ptr = SyncPtr(out.as_mut_ptr());
    let n_tasks = n_out.div_ceil(ROWS_PER_TASK);
    be.pool().install(|| {
        (0..n_tasks).into_par_iter().for_each(|task| {
            let r0 = task * ROWS_PER_TASK;
            let r1 = (r0 + ROWS_PER_TASK).min(n_out);
            for t in 0..n_tok {
                let a = &xq[t * arb..(t + 1) * arb];
                let mut r = r0;
                if let Some(f4) = dot4 {
                    while r + 4 <= r1 {
                        let v = f4(n_in, [w.row(r), w.row(r + 1), w.row(r + 2), w.row(r + 3)], a);
                        for (k, &vk) in v.iter().enumerate() {
                            // SAFETY: (t, r) pairs are disjoint across tasks; index < n_tok * n_out.
                            unsafe { out_ptr.write(t * n_out + r + k, vk) };
                        }
                        r += 4;
                    }
                }
                for r in r..r1 {
                    let wr = w.row(r);
                    let v = match dot {
                        Some(f) => f(n_in, wr, a),
                        None => simd::reference_dot(ty, n_in, wr, a),
                    };
                    // SAFETY: as above.
                    unsafe { out_ptr.write(t * n_out + r, v) };
                }
            }
        })
    });
    Ok(())
}
