//! The "legacy" 32-element block formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1.
//!
//! Each submodule exposes the same scalar reference kernels:
//! `dequantize_row(src, dst)`, `quantize_row(src, dst)` (ggml's
//! `quantize_row_*_ref`) and `vec_dot_<partner>(n, w, a)` (ggml's
//! `ggml_vec_dot_*_generic`, same float operation order). They panic on
//! inconsistent buffer sizes; the crate-level API checks sizes first.

pub mod q4_0;
pub mod q4_1;
pub mod q5_0;
pub mod q5_1;
pub mod q8_0;
pub mod q8_1;

/// Split a packed 5th-bit word: element `j` (0..16) of the low half and
/// element `j` of the high half, as ggml does (`xh_0`, `xh_1`), already
/// shifted to bit 4.
#[inline]
pub(crate) fn q5_high_bits(qh: u32, j: usize) -> (u8, u8) {
    let xh_0 = (((qh >> j) << 4) & 0x10) as u8;
    let xh_1 = ((qh >> (j + 12)) & 0x10) as u8;
    (xh_0, xh_1)
}
