//! Exact numerics (`CudaBackend::set_exact_numerics`): matmuls whose every output has the CPU
//! backend's bits, for the weight types whose CPU float order is reproduced
//! (`kernels/exact.cu`: Q4_1 and Q8_0 in ggml's vec_dot order, Q4_0 in llama.cpp's repacked
//! order). Activations are quantized as for the GEMV (`matmul::q8_activations`: the CPU's
//! Q8_0 / Q8_1 bytes); then eight lanes per output row walk the row's blocks in order.
//! Other types take the decode GEMV at every token count (8 tokens a launch), so a prefill
//! multiplies exactly as decode does (the GEMV's sums do not depend on the token count).
//!
//! ```text
//!  Q4_0 Q4_1 Q8_0: x ──q8_activations──► (xq, xm) ──gemvx_<type> (rows / 16 x tokens / 8)──► out
//!  other types:    x ──matmul::gemv (chunks of 8 tokens)──► out
//! ```

use crate::device::{Arg, Device};
use crate::error::CudaError;
use crate::matmul::QCache;
use crate::weight::{CudaWeight, DevType};
use quarrel_core::QuantType;
use std::sync::Mutex;

/// Whether `w` has an exact-order kernel.
pub(crate) fn applies(w: &CudaWeight) -> bool {
    matches!(w.dev_ty, DevType::Quant(_)) && matches!(w.ty, QuantType::Q4_0 | QuantType::Q4_1 | QuantType::Q8_0) && w.n_in % 32 == 0
}

/// `out (n_tok, n_out) = x (n_tok, n_in) · Wᵀ`: in the CPU's float order where [`applies`],
/// else through the decode GEMV whatever the token count.
pub(crate) fn matmul(dev: &Device, qc: &Mutex<Option<QCache>>, w: &CudaWeight, x: u64, n_tok: usize, out: u64) -> Result<(), CudaError> {
    if n_tok == 0 {
        return Ok(());
    }
    if let Ok(mut g) = qc.lock() {
        // the output may reuse the cached input's memory
        if g.as_ref().is_some_and(|c| c.x == out) {
            *g = None;
        }
    }
    if !applies(w) {
        return crate::matmul::gemv(dev, qc, w, x, n_tok, out);
    }
    let (xq, xm) = crate::matmul::q8_activations(dev, qc, x, n_tok, w.n_in, out)?;
    let grid = (grid_rows(w.n_out), n_tok.div_ceil(8) as u32, 1);
    dev.launch(
        &format!("gemvx_{}", w.dev_ty.name()),
        grid,
        128,
        0,
        &[
            Arg::P(w.p.ptr),
            Arg::P(w.m_ptr()),
            Arg::P(xq),
            Arg::P(xm),
            Arg::P(out),
            Arg::I((w.n_in / 32) as i32),
            Arg::I(w.n_out as i32),
            Arg::I(n_tok as i32),
        ],
    )
}

/// Blocks along the rows: 4 warps of 4 rows each.
fn grid_rows(n_out: usize) -> u32 {
    n_out.div_ceil(16) as u32
}

/// Kernel names this module launches.
pub fn kernel_names() -> Vec<String> {
    ["q4_0", "q4_1", "q8_0"].iter().map(|q| format!("gemvx_{q}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grid_covers_every_row() {
        for n in [1usize, 15, 16, 17, 576, 49152] {
            assert!(grid_rows(n) as usize * 16 >= n && (grid_rows(n) as usize - 1) * 16 < n);
        }
    }
}
