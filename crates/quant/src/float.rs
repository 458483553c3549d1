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
    crate::layout::assert_geometry("f32", 1, 4, dst.len(), src.len());
    for (o, c) in dst.iter_mut().zip(src.chunks_exact(4)) {
        *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    }
}

/// f16 bytes -> f32 row. `src.len() == 2 * dst.len()`.
pub fn dequantize_row_f16(src: &[u8], dst: &mut [f32]) {
    crate::layout::assert_geometry("f16", 1, 2, dst.len(), src.len());
    for (o, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *o = fp16_to_f32(u16::from_le_bytes([c[0], c[1]]));
    }
}

/// bf16 bytes -> f32 row. `src.len() == 2 * dst.len()`.
pub fn dequantize_row_bf16(src: &[u8], dst: &mut [f32]) {
    crate::layout::assert_geometry("bf16", 1, 2, dst.len(), src.len());
    for (o, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *o = bf16_to_f32(u16::from_le_bytes([c[0], c[1]]));
    }
}

/// f32 row -> bytes. `dst.len() == 4 * src.len()`.
pub fn quantize_row_f32(src: &[f32], dst: &mut [u8]) {
    crate::layout::assert_geometry("f32", 1, 4, src.len(), dst.len());
    for (x, c) in src.iter().zip(dst.chunks_exact_mut(4)) {
        c.copy_from_slice(&x.to_le_bytes());
    }
}

/// f32 row -> f16 bytes (round-to-nearest-even). `dst.len() == 2 * src.len()`.
pub fn quantize_row_f16(src: &[f32], dst: &mut [u8]) {
    crate::layout::assert_geometry("f16", 1, 2, src.len(), dst.len());
    for (x, c) in src.iter().zip(dst.chunks_exact_mut(2)) {
        c.copy_from_slice(&f32_to_fp16(*x).to_le_bytes());
    }
}

/// f32 row -> bf16 bytes (ggml rounding). `dst.len() == 2 * src.len()`.
pub fn quantize_row_bf16(src: &[f32], dst: &mut [u8]) {
    crate::layout::assert_geometry("bf16", 1, 2, src.len(), dst.len());
    for (x, c) in src.iter().zip(dst.chunks_exact_mut(2)) {
        c.copy_from_slice(&f32_to_bf16(*x).to_le_bytes());
    }
}

/// Scalar `ggml_vec_dot_f32`: products in f32, accumulated in f64
/// (`ggml_float`), result rounded to f32. Both operands are `n` f32 (bytes).
pub fn vec_dot_f32(n: usize, x: &[u8], y: &[u8]) -> f32 {
    crate::layout::assert_geometry("f32 vec_dot x", 1, 4, n, x.len());
    crate::layout::assert_geometry("f32 vec_dot y", 1, 4, n, y.len());
    let mut sumf = 0.0f64;
    for (a, b) in x.chunks_exact(4).zip(y.chunks_exact(4)) {
        let a = f32::from_le_bytes([a[0], a[1], a[2], a[3]]);
        let b = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        sumf += (a * b) as f64;
    }
    sumf as f32
}

/// Scalar `ggml_vec_dot_f16`: widen both to f32, multiply in f32, accumulate in f64.
pub fn vec_dot_f16(n: usize, x: &[u8], y: &[u8]) -> f32 {
    crate::layout::assert_geometry("f16 vec_dot x", 1, 2, n, x.len());
    crate::layout::assert_geometry("f16 vec_dot y", 1, 2, n, y.len());
    let mut sumf = 0.0f64;
    for (a, b) in x.chunks_exact(2).zip(y.chunks_exact(2)) {
        let a = fp16_to_f32(u16::from_le_bytes([a[0], a[1]]));
        let b = fp16_to_f32(u16::from_le_bytes([b[0], b[1]]));
        sumf += (a * b) as f64;
    }
    sumf as f32
}

/// Scalar `ggml_vec_dot_bf16`: widen both to f32, multiply in f32, accumulate in f64.
pub fn vec_dot_bf16(n: usize, x: &[u8], y: &[u8]) -> f32 {
    crate::layout::assert_geometry("bf16 vec_dot x", 1, 2, n, x.len());
    crate::layout::assert_geometry("bf16 vec_dot y", 1, 2, n, y.len());
    let mut sumf = 0.0f64;
    for (a, b) in x.chunks_exact(2).zip(y.chunks_exact(2)) {
        let a = bf16_to_f32(u16::from_le_bytes([a[0], a[1]]));
        let b = bf16_to_f32(u16::from_le_bytes([b[0], b[1]]));
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
