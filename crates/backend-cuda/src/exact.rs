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

/// Reference twin of `kernels/exact.cu` in plain Rust: output `row` of a repacked weight
/// (`weight::repack` planes `p`, `m`; `u` units per row) against one token's Q8 activations
/// (`mmq::quantize_q8_ref`: int8 `xq`, `(d, d·Σq)` per unit), in the kernel's (= the CPU
/// backend's) float order. Q4_0, Q4_1, Q8_0 only.
pub fn reference_row(t: DevType, p: &[u8], m: &[u8], row: usize, u: usize, xq: &[i8], xm: &[(f32, f32)]) -> f32 {
    let name = t.name();
    let (mut acc8, mut acc, mut summs) = ([0f32; 8], 0f32, 0f32);
    for k in 0..u {
        let w = crate::unit::load_unit(t, p, m, row, k, u);
        let xb = &xq[k * 32..k * 32 + 32];
        let (xd, xs) = xm[k];
        // lane l: the exact integer dot of elements 4l..4l+3
        let lane = |l: usize| -> i32 { (4 * l..4 * l + 4).map(|i| w.q[i] as i32 * xb[i] as i32).sum() };
        let d = w.s0 * xd;
        if name == "q4_0" {
            let isum: i32 = (0..8).map(lane).sum();
            acc = (isum as f32).mul_add(d, acc);
            continue;
        }
        if name == "q4_1" {
            summs = w.o.mul_add(xs, summs);
        }
        for (l, a) in acc8.iter_mut().enumerate() {
            *a = d.mul_add(lane(l) as f32, *a);
        }
    }
    if name == "q4_0" {
        return acc;
    }
    // ggml's hsum_float_8
    let h: [f32; 4] = std::array::from_fn(|i| acc8[i] + acc8[i + 4]);
    let v = (h[0] + h[2]) + (h[1] + h[3]);
    if name == "q4_1" {
        v + summs
    } else {
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::weight::repack;
    use quarrel_core::{Backend, WeightSource};
    use quarrel_gguf::{Gguf, GgufWriter};
    use std::sync::Arc;

    /// The twin of the exact kernels gives the CPU backend's matmul bits (the GPU test
    /// `tests/numerics.rs` then holds the kernels to the same bits on a GPU).
    #[test]
    fn reference_twin_equals_the_cpu_backend_bit_for_bit() {
        let (n_in, n_out, n_tok) = (256usize, 48usize, 3usize);
        let mut s = 0x9e3779b97f4a7c15u64;
        let mut rnd = |scale: f32| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        };
        // activations with a few large channels, as a residual stream has
        let x: Vec<f32> = (0..n_tok * n_in).map(|i| if i % 37 == 3 { rnd(20.0) } else { rnd(1.5) }).collect();
        let cpu = quarrel_cpu::CpuBackend::new(1).unwrap();
        for ty in [QuantType::Q4_0, QuantType::Q4_1, QuantType::Q8_0] {
            let w: Vec<f32> = (0..n_in * n_out).map(|_| rnd(0.1)).collect();
            let bytes = quarrel_quant::quantize_to_vec(ty, &w).unwrap();
            let mut gw = GgufWriter::new();
            gw.add_tensor("w", &[n_in as u64, n_out as u64], ty).unwrap();
            let g = Arc::new(Gguf::from_bytes(gw.to_bytes(&[bytes.as_slice()]).unwrap()).unwrap());
            let cw = cpu.load_weight(WeightSource { gguf: &g, name: "w" }).unwrap();
            let xb = cpu.upload(&x).unwrap();
            let mut ob = cpu.alloc(n_tok * n_out).unwrap();
            cpu.matmul(&cw, &xb, n_tok, &mut ob).unwrap();
            let want = cpu.download(&ob).unwrap();
            let (t, p, m) = repack(ty, &bytes).unwrap();
            let m = m.unwrap_or_default();
            let u = n_in / 32;
            let (xq, xm) = crate::mmq::quantize_q8_ref(&x);
            for tok in 0..n_tok {
                for row in 0..n_out {
                    let got = reference_row(t, &p, &m, row, u, &xq[tok * n_in..(tok + 1) * n_in], &xm[tok * u..(tok + 1) * u]);
                    let w = want[tok * n_out + row];
                    assert_eq!(got.to_bits(), w.to_bits(), "{ty} token {tok} row {row}: {got} vs {w}");
                }
            }
        }
    }

    #[test]
    fn grid_covers_every_row() {
        for n in [1usize, 15, 16, 17, 576, 49152] {
            assert!(grid_rows(n) as usize * 16 >= n && (grid_rows(n) as usize - 1) * 16 < n);
        }
    }
}
