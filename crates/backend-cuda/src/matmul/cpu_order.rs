//! Quantized matmuls in the CPU backend's float order: every output has the CPU's bits, for
//! the weight types whose CPU float order is reproduced (`kernels/exact.cu`: Q4_1 and Q8_0 in
//! ggml's vec_dot order, Q4_0 in llama.cpp's repacked order). Activations are quantized as for
//! the GEMV (`matmul::q8_activations`: the CPU's Q8_0 / Q8_1 bytes); then `gemvo_*` (2 rows a
//! warp, the integer block sums in parallel, the float chains in order) in chunks of 8 tokens.
//! Used by exact numerics (`Numerics::Exact`: every token count; other types take the decode
//! GEMV then, whose sums do not depend on the token count) and by decode and prompts up to
//! `ORDERED_MAX_TOKENS` tokens as [`OrderedGemv`] says (default: models of at most
//! `ORDERED_AUTO_MAX_BYTES`; tests: `set_ordered_gemv`).
//!
//! ```text
//!  Q4_0 Q4_1 Q8_0: x ──q8_activations──► (xq, xm) ──gemvo_<type>_<NT> (rows / 8; gemvo3: q/k/v, gate/up)──► out
//!  other types:    x ──matmul::gemv (chunks of 8 tokens)──► out
//! ```

use crate::error::CudaError;
use crate::fusion::Device;
use crate::matmul::QCache;
use crate::weights::{CudaWeight, DevType};
use quarrel_core::QuantType;
use std::sync::Mutex;

/// Up to this many tokens the ordered GEMV runs outside exact numerics (above: MMQ / cuBLAS).
pub const ORDERED_MAX_TOKENS: usize = 32;

/// Models with at most this many bytes of weights take the ordered GEMV by default: their
/// decode steps are bound by launch latency (a 135M-parameter model's matrices are 0.2-0.6 MB),
/// where the in-order float chain costs nothing measurable, while 7B matrices lose 5-30% to it.
pub const ORDERED_AUTO_MAX_BYTES: usize = 512 << 20;

/// When decode and short prompts take the GEMV in the CPU's float order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum OrderedGemv {
    /// Never (the fast GEMV's order).
    Off = 0,
    /// Always for Q4_0 / Q4_1 / Q8_0.
    On = 1,
    /// When the backend's weights total at most `ORDERED_AUTO_MAX_BYTES`.
    Auto = 2,
}

impl OrderedGemv {
    pub fn from_u8(v: u8) -> OrderedGemv {
        match v {
            0 => OrderedGemv::Off,
            1 => OrderedGemv::On,
            _ => OrderedGemv::Auto,
        }
    }

    /// Whether the ordered GEMV is used with `loaded_bytes` of weights on the backend.
    pub fn applies(self, loaded_bytes: usize) -> bool {
        match self {
            OrderedGemv::Off => false,
            OrderedGemv::On => true,
            OrderedGemv::Auto => loaded_bytes <= ORDERED_AUTO_MAX_BYTES,
        }
    }
}

/// Warps per block of `gemvo_*` (GEMVO_WARPS in exact.cu).
const WARPS: usize = 4;

/// Rows per warp of `gemvo_<name>_<nt>` (`Gemvo::R` in exact.cu): 2, but 1 for Q4_1 / Q8_0 at 8
/// tokens (their lane dots of two rows would not fit the block's 48 KB of shared memory).
fn rows_per_warp(name: &str, nt: usize) -> usize {
    if name != "q4_0" && nt == 8 {
        1
    } else {
        2
    }
}

/// Whether `w` has an ordered kernel.
pub(crate) fn applies(w: &CudaWeight) -> bool {
    matches!(w.dev_ty, DevType::Quant(_))
        && matches!(w.ty, QuantType::Q4_0 | QuantType::Q4_1 | QuantType::Q8_0)
        && w.n_in.is_multiple_of(32)
}

/// `out (n_tok, n_out) = x (n_tok, n_in) · Wᵀ`: in the CPU's float order where [`applies`],
/// else through the decode GEMV whatever the token count.
pub(crate) fn matmul(dev: &Device, qc: &Mutex<Option<QCache>>, w: &CudaWeight, x: u64, n_tok: usize, out: u64) -> Result<(), CudaError> {
    if n_tok == 0 {
        return Ok(());
    }
    crate::matmul::forget_input_at(qc, out);
    crate::matmul::gemv(dev, qc, w, x, n_tok, out, true)
}

/// The grid of `gemvo_<name>_<nt>` over `n_out` rows: a block per 4 row groups (the kernel
/// takes any grid; its warps loop over the row groups).
pub(crate) fn grid(name: &str, nt: usize, n_out: usize) -> (u32, u32, u32) {
    (n_out.div_ceil(WARPS * rows_per_warp(name, nt)) as u32, 1, 1)
}

/// Reference twin of `kernels/exact.cu` in plain Rust: output `row` of a repacked weight
/// (`weight::repack` planes `p`, `m`; `u` units per row) against one token's Q8 activations
/// (`mmq::quantize_q8_ref`: int8 `xq`, `(d, d·Σq)` per unit), in the kernel's (= the CPU
/// backend's) float order. Q4_0, Q4_1, Q8_0 only.
#[cfg(test)]
pub fn reference_row(t: DevType, p: &[u8], m: &[u8], row: usize, u: usize, xq: &[i8], xm: &[(f32, f32)]) -> f32 {
    let name = t.name();
    let (mut acc8, mut acc, mut summs) = ([0f32; 8], 0f32, 0f32);
    for k in 0..u {
        let w = crate::weights::unit::load_unit(t, p, m, row, k, u);
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

    use crate::weights::repack;
    use quarrel_core::{Backend, WeightSource};

    #[test]
    fn ordered_gemv_modes() {
        for m in [OrderedGemv::Off, OrderedGemv::On, OrderedGemv::Auto] {
            assert_eq!(OrderedGemv::from_u8(m as u8), m);
        }
        // a 135M-parameter Q4_1 model (~98 MB) takes the CPU's order, a 7B one (~3.9 GB) the fast one
        assert!(OrderedGemv::Auto.applies(98 << 20));
        assert!(OrderedGemv::Auto.applies(ORDERED_AUTO_MAX_BYTES));
        assert!(!OrderedGemv::Auto.applies(ORDERED_AUTO_MAX_BYTES + 1));
        assert!(!OrderedGemv::Auto.applies(3_900 << 20));
        assert!(OrderedGemv::On.applies(usize::MAX) && !OrderedGemv::Off.applies(0));
    }
    use quarrel_gguf::{Gguf, GgufWriter};
    use std::sync::Arc;

    /// The twin of the exact kernels gives the CPU backend's matmul bits (the GPU test
    /// `tests/numerics.rs` then holds the kernels to the same bits on a GPU).
    #[test]
    fn reference_twin_equals_the_cpu_backend_bit_for_bit() {
        // rows of 8 and 176 units (the kernel's partial and multiple steps), 1 and 9 tokens
        for (n_in, n_out, n_tok) in [(256usize, 48usize, 3usize), (5632, 12, 9), (1024, 20, 1)] {
            twin_vs_cpu(n_in, n_out, n_tok);
        }
    }

    fn twin_vs_cpu(n_in: usize, n_out: usize, n_tok: usize) {
        let mut s = 0x9e3779b97f4a7c15u64 ^ n_in as u64;
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
            let (xq, xm) = crate::matmul::mmq::quantize_q8_ref(&x);
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
        for (name, nt) in [("q4_0", 1), ("q4_0", 8), ("q4_1", 4), ("q8_0", 8)] {
            let rows = WARPS * rows_per_warp(name, nt);
            for n in [1usize, 3, 4, 5, 7, 8, 9, 576, 49152] {
                let b = grid(name, nt, n).0 as usize;
                assert!(b * rows >= n && (b - 1) * rows < n);
            }
        }
    }
}
