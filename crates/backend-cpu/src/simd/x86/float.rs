//! Float weight types against activations of the same type: F32·F32, F16·F16, BF16·BF16.
//!
//! The reference multiplies in f32 and accumulates in f64; these multiply-add in f32 with
//! four independent vector accumulators (the same as ggml's SIMD path), so results differ
//! from the reference by float rounding only. Tails (n not a multiple of the vector step)
//! use masked loads (AVX-512) or a scalar loop (AVX2).

use super::*;
use quarrel_quant::{bf16_to_f32, fp16_to_f32};

kernel_table!(pub(super) fn dot_fn_avx2 -> DotFn { F32 => dot_f32_avx2, F16 => dot_f16_avx2, BF16 => dot_bf16_avx2 });
kernel_table!(pub(super) fn dot_fn_avx512 -> DotFn { F32 => dot_f32_avx512, F16 => dot_f16_avx512, BF16 => dot_bf16_avx512 });

#[inline(always)]
fn check_float(n: usize, w: &[u8], a: &[u8], size: usize) {
    assert!(w.len() >= n * size && a.len() >= n * size, "simd dot: {n} floats need {} bytes, got {} and {}", n * size, w.len(), a.len());
}

/// Load 8 elements of `T` at element index `i` as f32.
macro_rules! avx2_float_dot {
    ($name:ident, $size:expr, $load:ident, $scalar:expr) => {
        /// SAFETY: AVX2+FMA+F16C.
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(crate) unsafe fn $name(n: usize, w: &[u8], a: &[u8]) -> f32 {
            check_float(n, w, a, $size);
            let (wp, ap) = (w.as_ptr(), a.as_ptr());
            let mut acc = [_mm256_setzero_ps(); 4];
            let mut i = 0;
            while i + 32 <= n {
                prefetch(wp.add(i * $size), 32 * $size);
                for (k, acc) in acc.iter_mut().enumerate() {
                    let off = (i + 8 * k) * $size;
                    *acc = _mm256_fmadd_ps($load(wp.add(off)), $load(ap.add(off)), *acc);
                }
                i += 32;
            }
            while i + 8 <= n {
                acc[0] = _mm256_fmadd_ps($load(wp.add(i * $size)), $load(ap.add(i * $size)), acc[0]);
                i += 8;
            }
            let s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
            let mut sum = hsum_ps(s);
            let scalar = $scalar;
            while i < n {
                sum += scalar(&w[i * $size..], 0) * scalar(&a[i * $size..], 0);
                i += 1;
            }
            sum
        }
    };
}

/// SAFETY: `p..p+32` readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load8_f32(p: *const u8) -> __m256 {
    _mm256_loadu_ps(p as *const f32)
}

/// SAFETY: `p..p+16` readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load8_f16(p: *const u8) -> __m256 {
    _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
}

/// SAFETY: `p..p+16` readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load8_bf16(p: *const u8) -> __m256 {
    let h = _mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i));
    _mm256_castsi256_ps(_mm256_slli_epi32(h, 16))
}

fn scalar_f32(b: &[u8], o: usize) -> f32 {
    f32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}
fn scalar_f16(b: &[u8], o: usize) -> f32 {
    fp16_to_f32(u16::from_le_bytes([b[o], b[o + 1]]))
}
fn scalar_bf16(b: &[u8], o: usize) -> f32 {
    bf16_to_f32(u16::from_le_bytes([b[o], b[o + 1]]))
}

avx2_float_dot!(dot_f32_avx2, 4, load8_f32, scalar_f32);
avx2_float_dot!(dot_f16_avx2, 2, load8_f16, scalar_f16);
avx2_float_dot!(dot_bf16_avx2, 2, load8_bf16, scalar_bf16);

/// 16 lanes at element `i` (`mask` selects the valid ones; the others read as 0.0).
macro_rules! avx512_float_dot {
    ($name:ident, $size:expr, $load:ident) => {
        /// SAFETY: AVX2+FMA+F16C+AVX512F/BW/VL.
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
        pub(crate) unsafe fn $name(n: usize, w: &[u8], a: &[u8]) -> f32 {
            check_float(n, w, a, $size);
            let (wp, ap) = (w.as_ptr(), a.as_ptr());
            let mut acc = [_mm512_setzero_ps(); 4];
            let mut i = 0;
            while i + 64 <= n {
                prefetch(wp.add(i * $size), 64 * $size);
                for (k, acc) in acc.iter_mut().enumerate() {
                    let off = (i + 16 * k) * $size;
                    *acc = _mm512_fmadd_ps($load(wp.add(off), 0xFFFF), $load(ap.add(off), 0xFFFF), *acc);
                }
                i += 64;
            }
            while i < n {
                let m: __mmask16 = if n - i >= 16 { 0xFFFF } else { (1u16 << (n - i)) - 1 };
                let off = i * $size;
                acc[0] = _mm512_fmadd_ps($load(wp.add(off), m), $load(ap.add(off), m), acc[0]);
                i += 16;
            }
            let s = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
            hsum_ps512(s)
        }
    };
}

/// SAFETY: the `m`-selected f32 lanes at `p` readable (masked lanes are not accessed).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn load16_f32(p: *const u8, m: __mmask16) -> __m512 {
    _mm512_maskz_loadu_ps(m, p as *const f32)
}

/// SAFETY: the `m`-selected u16 lanes at `p` readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn load16_f16(p: *const u8, m: __mmask16) -> __m512 {
    _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p as *const i16))
}

/// SAFETY: the `m`-selected u16 lanes at `p` readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn load16_bf16(p: *const u8, m: __mmask16) -> __m512 {
    let h = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p as *const i16));
    _mm512_castsi512_ps(_mm512_slli_epi32(h, 16))
}

avx512_float_dot!(dot_f32_avx512, 4, load16_f32);
avx512_float_dot!(dot_f16_avx512, 2, load16_f16);
avx512_float_dot!(dot_bf16_avx512, 2, load16_bf16);
