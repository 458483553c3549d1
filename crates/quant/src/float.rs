//! Plain float element types: F32, F16, BF16 — conversions, row
//! (de)quantization and the scalar dot products (`ggml_vec_dot_f32/f16/bf16`).
//!
//! Conversions:
//! * f16 <-> f32 uses the `half` crate (round-to-nearest-even, same as
//!   `GGML_FP32_TO_FP16` and numpy's `astype(np.float16)`).
//! * bf16 is implemented by hand to mirror `ggml_compute_fp32_to_bf16`
//!   bit for bit (NaN forced quiet, otherwise round-to-nearest-even).

use half::f16;

/// f16 bits -> f32 (exact).
#[inline]
pub fn fp16_to_f32(h: u16) -> f32 {
    f16::from_bits(h).to_f32()
}

/// f32 -> f16 bits, round-to-nearest-even.
#[inline]
pub fn f32_to_fp16(x: f32) -> u16 {
    f16::from_f32(x).to_bits()
}

/// bf16 bits -> f32 (exact: the bits become the upper half of the f32).
#[inline]
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// f32 -> bf16 bits exactly like ggml's `ggml_compute_fp32_to_bf16`:
/// NaNs are made quiet, everything else rounds to nearest even.
#[inline]
pub fn f32_to_bf16(x: f32) -> u16 {
    let u = x.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    // u + 0x7fff + lsb cannot overflow u32 for non-NaN inputs except for the
    // largest magnitudes, where wrapping matches C's unsigned arithmetic.
    (u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16
}

/// Bytes -> f32 row (little endian). `src.len() == 4 * dst.len()`.
pub fn dequantize_row_f32(src: &[u8], dst: &mut [f32]) {
    dequantize_widened("f32", src, dst, f32::from_le_bytes)
}

/// f16 bytes -> f32 row. `src.len() == 2 * dst.len()`.
pub fn dequantize_row_f16(src: &[u8], dst: &mut [f32]) {
    dequantize_widened("f16", src, dst, |c| fp16_to_f32(u16::from_le_bytes(c)))
}

/// bf16 bytes -> f32 row. `src.len() == 2 * dst.len()`.
pub fn dequantize_row_bf16(src: &[u8], dst: &mut [f32]) {
    dequantize_widened("bf16", src, dst, |c| bf16_to_f32(u16::from_le_bytes(c)))
}

/// f32 row -> bytes. `dst.len() == 4 * src.len()`.
pub fn quantize_row_f32(src: &[f32], dst: &mut [u8]) {
    quantize_narrowed("f32", src, dst, f32::to_le_bytes)
}

/// f32 row -> f16 bytes (round-to-nearest-even). `dst.len() == 2 * src.len()`.
pub fn quantize_row_f16(src: &[f32], dst: &mut [u8]) {
    quantize_narrowed("f16", src, dst, |x| f32_to_fp16(x).to_le_bytes())
}

/// f32 row -> bf16 bytes (ggml rounding). `dst.len() == 2 * src.len()`.
pub fn quantize_row_bf16(src: &[f32], dst: &mut [u8]) {
    quantize_narrowed("bf16", src, dst, |x| f32_to_bf16(x).to_le_bytes())
}

/// The float formats' dequantize loop: each `W`-byte little-endian element widened by `widen`.
#[inline]
#[track_caller]
fn dequantize_widened<const W: usize>(what: &str, src: &[u8], dst: &mut [f32], widen: impl Fn([u8; W]) -> f32) {
    crate::layout::assert_geometry(what, 1, W, dst.len(), src.len());
    for (o, c) in dst.iter_mut().zip(src.chunks_exact(W)) {
        *o = widen(std::array::from_fn(|i| c[i]));
    }
}

/// The float formats' quantize loop: each value narrowed to `W` little-endian bytes.
#[inline]
#[track_caller]
fn quantize_narrowed<const W: usize>(what: &str, src: &[f32], dst: &mut [u8], narrow: impl Fn(f32) -> [u8; W]) {
    crate::layout::assert_geometry(what, 1, W, src.len(), dst.len());
    for (x, c) in src.iter().zip(dst.chunks_exact_mut(W)) {
        c.copy_from_slice(&narrow(*x));
    }
}

/// Scalar `ggml_vec_dot_f32`: products in f32, accumulated in f64
/// (`ggml_float`), result rounded to f32. Both operands are `n` f32 (bytes).
pub fn vec_dot_f32(n: usize, x: &[u8], y: &[u8]) -> f32 {
    vec_dot_widened(["f32 vec_dot x", "f32 vec_dot y"], n, x, y, f32::from_le_bytes)
}

/// Scalar `ggml_vec_dot_f16`: widen both to f32, multiply in f32, accumulate in f64.
pub fn vec_dot_f16(n: usize, x: &[u8], y: &[u8]) -> f32 {
    vec_dot_widened(["f16 vec_dot x", "f16 vec_dot y"], n, x, y, |c: [u8; 2]| fp16_to_f32(u16::from_le_bytes(c)))
}

/// Scalar `ggml_vec_dot_bf16`: widen both to f32, multiply in f32, accumulate in f64.
pub fn vec_dot_bf16(n: usize, x: &[u8], y: &[u8]) -> f32 {
    vec_dot_widened(["bf16 vec_dot x", "bf16 vec_dot y"], n, x, y, |c: [u8; 2]| bf16_to_f32(u16::from_le_bytes(c)))
}

/// The float dot products' one loop: each `W`-byte element widened to f32 by `widen`,
/// products in f32, accumulated in f64, the sum rounded to f32.
#[inline]
#[track_caller]
fn vec_dot_widened<const W: usize>(what: [&str; 2], n: usize, x: &[u8], y: &[u8], widen: impl Fn([u8; W]) -> f32) -> f32 {
    let mut sumf = 0.0f64;
    for (a, b) in crate::layout::dot_blocks(what, n, (x, 1, W), (y, 1, W)) {
        let a = widen(std::array::from_fn(|i| a[i]));
        let b = widen(std::array::from_fn(|i| b[i]));
        sumf += (a * b) as f64;
    }
    sumf as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounding_matches_ggml_rules() {
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        // exactly halfway, even lsb -> round down; odd lsb -> round up
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8001)), 0x3f81);
        // NaN made quiet, sign kept
        assert_eq!(f32_to_bf16(f32::from_bits(0xff80_0001)), 0xffc0);
        assert_eq!(f32_to_bf16(f32::INFINITY), 0x7f80);
        assert_eq!(bf16_to_f32(0xc040), -3.0);
    }

    #[test]
    fn fp16_basics() {
        assert_eq!(f32_to_fp16(1.0), 0x3c00);
        assert_eq!(fp16_to_f32(0xc000), -2.0);
        assert_eq!(f32_to_fp16(65520.0), 0x7c00); // rounds to +inf
        assert_eq!(fp16_to_f32(0x0001), 5.960_464_5e-8);
    }
}
