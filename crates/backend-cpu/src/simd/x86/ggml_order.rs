//! Kernels that accumulate in exactly the float order of llama.cpp's x86 build
//! (`ggml_vec_dot_{q4_0_q8_0,q4_1_q8_1,q8_0_q8_0}` AVX2 paths, which its AVX-512 builds run
//! too): one 8-lane accumulator, `acc = fma(d_w * d_a, block_sum, acc)` per block,
//! `hsum_float_8`, and Q4_1's `summs` updated with an FMA as ggml's compiler contracts it.
//! Integer block sums are exact, so results are bit-identical to llama.cpp's.

use crate::simd::DotFn;
use quarrel_core::QuantType;
use std::arch::x86_64::*;

pub(crate) fn dot_fn(ty: QuantType) -> Option<DotFn> {
    Some(match ty {
        QuantType::Q4_0 => |n, w, a| unsafe { dot_q4_0_q8_0(n, w, a) },
        QuantType::Q4_1 => |n, w, a| unsafe { dot_q4_1_q8_1(n, w, a) },
        QuantType::Q8_0 => |n, w, a| unsafe { dot_q8_0_q8_0(n, w, a) },
        _ => return None,
    })
}

#[inline]
#[target_feature(enable = "f16c")]
unsafe fn f16(b: &[u8], off: usize) -> f32 {
    let h = u16::from_le_bytes([b[off], b[off + 1]]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)))
}

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn hsum(v: __m256) -> f32 {
    let lo = _mm256_castps256_ps128(v);
    let hi = _mm256_extractf128_ps(v, 1);
    let s = _mm_add_ps(lo, hi);
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// 16 bytes of packed nibbles -> 32 bytes: low nibbles (elements 0..16) then high (16..32).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn unpack_nibbles(p: *const u8) -> __m256i {
    let t = _mm_loadu_si128(p as *const __m128i);
    let hi = _mm_srli_epi16(t, 4);
    let v = _mm256_set_m128i(hi, t);
    _mm256_and_si256(v, _mm256_set1_epi8(0x0f))
}

/// Sum of products of signed bytes `x` and `y` as 8 i32 lanes converted to f32.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn mul_sum_i8(x: __m256i, y: __m256i) -> __m256 {
    let ax = _mm256_sign_epi8(x, x);
    let sy = _mm256_sign_epi8(y, x);
    let dot16 = _mm256_maddubs_epi16(ax, sy);
    let dot32 = _mm256_madd_epi16(dot16, _mm256_set1_epi16(1));
    _mm256_cvtepi32_ps(dot32)
}

/// Unsigned bytes `x` times signed bytes `y`, summed to 8 f32 lanes.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn mul_sum_u8_i8(x: __m256i, y: __m256i) -> __m256 {
    let dot16 = _mm256_maddubs_epi16(x, y);
    let dot32 = _mm256_madd_epi16(dot16, _mm256_set1_epi16(1));
    _mm256_cvtepi32_ps(dot32)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q4_0_q8_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let nb = n / 32;
    assert!(w.len() >= nb * 18 && a.len() >= nb * 34);
    let mut acc = _mm256_setzero_ps();
    for i in 0..nb {
        let wb = &w[i * 18..];
        let ab = &a[i * 34..];
        let d = _mm256_set1_ps(f16(wb, 0) * f16(ab, 0));
        let q = _mm256_sub_epi8(unpack_nibbles(wb.as_ptr().add(2)), _mm256_set1_epi8(8));
        let y = _mm256_loadu_si256(ab.as_ptr().add(2) as *const __m256i);
        acc = _mm256_fmadd_ps(d, mul_sum_i8(q, y), acc);
    }
    hsum(acc)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q4_1_q8_1(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let nb = n / 32;
    assert!(w.len() >= nb * 20 && a.len() >= nb * 36);
    let mut acc = _mm256_setzero_ps();
    let mut summs = 0.0f32;
    for i in 0..nb {
        let wb = &w[i * 20..];
        let ab = &a[i * 36..];
        summs = f16(wb, 2).mul_add(f16(ab, 2), summs);
        let d = _mm256_set1_ps(f16(wb, 0) * f16(ab, 0));
        let q = unpack_nibbles(wb.as_ptr().add(4));
        let y = _mm256_loadu_si256(ab.as_ptr().add(4) as *const __m256i);
        acc = _mm256_fmadd_ps(d, mul_sum_u8_i8(q, y), acc);
    }
    hsum(acc) + summs
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q8_0_q8_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let nb = n / 32;
    assert!(w.len() >= nb * 34 && a.len() >= nb * 34);
    let mut acc = _mm256_setzero_ps();
    for i in 0..nb {
        let wb = &w[i * 34..];
        let ab = &a[i * 34..];
        let d = _mm256_set1_ps(f16(wb, 0) * f16(ab, 0));
        let x = _mm256_loadu_si256(wb.as_ptr().add(2) as *const __m256i);
        let y = _mm256_loadu_si256(ab.as_ptr().add(2) as *const __m256i);
        acc = _mm256_fmadd_ps(d, mul_sum_i8(x, y), acc);
    }
    hsum(acc)
}
