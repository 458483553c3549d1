//! `out (n_tok, n_out) = x (n_tok, n_in) · Wᵀ` on the device.
//!
//! ```text
//!  n_tok <= GEMV_MAX_TOKENS: quantized W: x ──quantize_q8──► (xq, xm) ──gemv_<type>_<NT> (dp4a)──► out
//!                            float W:     x ──gemv_<type>_<NT> (f32 FMA)──► out
//!  more tokens:              W ──dequant_<type>──► W16 (scratch) ┐
//!                            x ──tof16_f32──► x16                ├─ cuBLAS GemmEx (f16 in, f32 accumulate) ──► out
//! ```

use crate::device::{Arg, Device, PoolMem};
use std::sync::Mutex;

/// Activations already quantized to Q8: `x` (device pointer) as (xq, xm).
pub(crate) struct QCache {
    pub x: u64,
    n_tok: usize,
    n_in: usize,
    xq: PoolMem,
    xm: PoolMem,
}
use crate::error::CudaError;
use crate::weight::{CudaWeight, DevType};
use cudarc::cublas::{result as blas, sys as bsys, CudaBlas};

/// Up to this many tokens the GEMV kernels run (weights read once per 8 tokens); above, the GEMM.
pub const GEMV_MAX_TOKENS: usize = 8;

const ROWS_PER_BLOCK: usize = 8; // GEMV_WARPS * GEMV_ROWS in matmul.cu

pub(crate) fn matmul(dev: &Device, blas: &CudaBlas, qc: &Mutex<Option<QCache>>, w: &CudaWeight, x: u64, n_tok: usize, out: u64) -> Result<(), CudaError> {
    if n_tok == 0 {
        return Ok(());
    }
    if let Ok(mut g) = qc.lock() {
        // the output may reuse the cached input's memory
        if g.as_ref().is_some_and(|c| c.x == out) {
            *g = None;
        }
    }
    if n_tok <= GEMV_MAX_TOKENS || std::env::var_os("QUARREL_CUDA_NO_GEMM").is_some() {
        gemv(dev, qc, w, x, n_tok, out)
    } else {
        gemm(dev, blas, w, x, n_tok, out)
    }
}

fn gemv(dev: &Device, qc: &Mutex<Option<QCache>>, w: &CudaWeight, x: u64, n_tok: usize, out: u64) -> Result<(), CudaError> {
    let (n_in, n_out) = (w.n_in, w.n_out);
    let grid = (n_out.div_ceil(ROWS_PER_BLOCK) as u32, 1, 1);
    let name = w.dev_ty.name();
    match w.dev_ty {
        DevType::Quant(_) => {
            let units = n_in / 32;
            let mut g = qc.lock().map_err(|_| CudaError::Driver("lock poisoned".into()))?;
            let hit = g.as_ref().is_some_and(|c| c.x == x && c.n_tok == n_tok && c.n_in == n_in) && x != out;
            if !hit {
                let xq = dev.scratch(n_tok * n_in)?;
                let xm = dev.scratch(n_tok * units * 8)?;
                let nb = (n_tok * units) as u32;
                dev.launch("quantize_q8", (nb.div_ceil(8), 1, 1), 256, 0, &[Arg::P(x), Arg::P(xq.ptr()), Arg::P(xm.ptr()), Arg::I(nb as i32)])?;
                *g = Some(QCache { x, n_tok, n_in, xq, xm });
            }
            let c = g.as_ref().expect("set above");
            let (xq, xm) = (&c.xq, &c.xm);
            let mut t0 = 0;
            while t0 < n_tok {
                let nt = chunk(n_tok - t0);
                dev.launch(
                    &format!("gemv_{name}_{nt}"),
                    grid,
                    128,
                    0,
                    &[
                        Arg::P(w.p.ptr),
                        Arg::P(w.m_ptr()),
                        Arg::P(xq.ptr() + (t0 * n_in) as u64),
                        Arg::P(xm.ptr() + (t0 * units * 8) as u64),
                        Arg::P(out + 4 * (t0 * n_out) as u64),
                        Arg::I(units as i32),
                        Arg::I(n_out as i32),
                    ],
                )?;
                t0 += nt;
            }
        }
        _ => {
            let mut t0 = 0;
            while t0 < n_tok {
                let nt = chunk(n_tok - t0);
                dev.launch(
                    &format!("gemv_{name}_{nt}"),
                    grid,
                    128,
                    0,
                    &[
                        Arg::P(w.p.ptr),
                        Arg::P(x + 4 * (t0 * n_in) as u64),
                        Arg::P(out + 4 * (t0 * n_out) as u64),
                        Arg::I(n_in as i32),
                        Arg::I(n_out as i32),
                    ],
                )?;
                t0 += nt;
            }
        }
    }
    Ok(())
}

/// Tokens per GEMV launch: 8, 4, 2 or 1.
fn chunk(left: usize) -> usize {
    [8, 4, 2, 1].into_iter().find(|&c| c <= left).unwrap_or(1)
}

fn gemm(dev: &Device, blas: &CudaBlas, w: &CudaWeight, x: u64, n_tok: usize, out: u64) -> Result<(), CudaError> {
    let (n_in, n_out) = (w.n_in, w.n_out);
    let n_w = (n_in * n_out) as u64;
    // the weight as f16 (in place for F16 weights)
    let w16_scratch;
    let w16 = match w.dev_ty {
        DevType::F16 => w.p.ptr,
        DevType::F32 => return sgemm(dev, blas, w.p.ptr, x, n_in, n_out, n_tok, out),
        DevType::BF16 => {
            w16_scratch = dev.scratch(2 * n_w as usize)?;
            dev.launch_1d("tof16_bf16", n_w, &[Arg::P(w.p.ptr), Arg::P(w16_scratch.ptr()), Arg::U64(n_w)])?;
            w16_scratch.ptr()
        }
        DevType::Quant(name) => {
            w16_scratch = dev.scratch(2 * n_w as usize)?;
            let units = n_w / 32;
            dev.launch_1d(
                &format!("dequant_{name}"),
                units,
                &[Arg::P(w.p.ptr), Arg::P(w.m_ptr()), Arg::P(w16_scratch.ptr()), Arg::I((n_in / 32) as i32), Arg::U64(units)],
            )?;
            w16_scratch.ptr()
        }
    };
    let n_x = (n_tok * n_in) as u64;
    let x16 = dev.scratch(2 * n_x as usize)?;
    dev.launch_1d("tof16_f32", n_x, &[Arg::P(x), Arg::P(x16.ptr()), Arg::U64(n_x)])?;
    let (alpha, beta) = (1.0f32, 0.0f32);
    // cuBLAS enqueues on the stream itself: submit the queued kernels first
    dev.flush()?;
    dev.not_graphable();
    // column-major view: C (n_out x n_tok) = W16ᵀ (n_out x n_in) · x16 (n_in x n_tok)
    // SAFETY: pointers are live device buffers of the sizes given; the handle is on our stream.
    unsafe {
        blas::gemm_ex(
            *blas.handle(),
            bsys::cublasOperation_t::CUBLAS_OP_T,
            bsys::cublasOperation_t::CUBLAS_OP_N,
            n_out as i32,
            n_tok as i32,
            n_in as i32,
            &alpha as *const f32 as *const _,
            w16 as *const _,
            bsys::cudaDataType_t::CUDA_R_16F,
            n_in as i32,
            x16.ptr() as *const _,
            bsys::cudaDataType_t::CUDA_R_16F,
            n_in as i32,
            &beta as *const f32 as *const _,
            out as *mut _,
            bsys::cudaDataType_t::CUDA_R_32F,
            n_out as i32,
            bsys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            bsys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }
    .map_err(|e| CudaError::Blas(format!("GemmEx {n_out}x{n_tok}x{n_in}: {e:?}")))
}

#[allow(clippy::too_many_arguments)]
fn sgemm(dev: &Device, blas: &CudaBlas, w: u64, x: u64, n_in: usize, n_out: usize, n_tok: usize, out: u64) -> Result<(), CudaError> {
    let (alpha, beta) = (1.0f32, 0.0f32);
    dev.flush()?;
    dev.not_graphable();
    // SAFETY: as in `gemm`.
    unsafe {
        blas::gemm_ex(
            *blas.handle(),
            bsys::cublasOperation_t::CUBLAS_OP_T,
            bsys::cublasOperation_t::CUBLAS_OP_N,
            n_out as i32,
            n_tok as i32,
            n_in as i32,
            &alpha as *const f32 as *const _,
            w as *const _,
            bsys::cudaDataType_t::CUDA_R_32F,
            n_in as i32,
            x as *const _,
            bsys::cudaDataType_t::CUDA_R_32F,
            n_in as i32,
            &beta as *const f32 as *const _,
            out as *mut _,
            bsys::cudaDataType_t::CUDA_R_32F,
            n_out as i32,
            bsys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            bsys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }
    .map_err(|e| CudaError::Blas(format!("SGEMM {n_out}x{n_tok}x{n_in}: {e:?}")))
}
