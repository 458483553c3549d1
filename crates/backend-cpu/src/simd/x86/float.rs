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

/// `$name`: the dot of `n` floats of `$size` bytes in vectors of `$lanes` f32 lanes
/// (`$zero`, `$fmadd`, `$add`, `$hsum`: the width's vector ops). Four accumulators take runs
/// of four vectors; then the first takes the rest a vector at a time while `$mask(left)`
/// gives the lanes to load (`$load(p, mask)`: those lanes at `p` as f32, the others 0.0),
/// and `$scalar` whatever is left after that.
macro_rules! float_dot {
    ($feat:literal, $name:ident, $size:expr, $lanes:literal, [$zero:ident, $fmadd:ident, $add:ident, $hsum:ident],
     $load:expr, $mask:expr, $scalar:expr) => {
        #[target_feature(enable = $feat)]
        pub(crate) unsafe fn $name(n: usize, w: &[u8], a: &[u8]) -> f32 {
            check_float(n, w, a, $size);
            let (wp, ap) = (w.as_ptr(), a.as_ptr());
            let (load, mask, scalar) = ($load, $mask, $scalar);
            let full = mask($lanes).unwrap();
            let mut acc = [$zero(); 4];
            let mut i = 0;
            while i + 4 * $lanes <= n {
                prefetch(wp.add(i * $size), 4 * $lanes * $size);
                for (k, acc) in acc.iter_mut().enumerate() {
                    let off = (i + $lanes * k) * $size;
                    *acc = $fmadd(load(wp.add(off), full), load(ap.add(off), full), *acc);
                }
                i += 4 * $lanes;
            }
            while i < n {
                let Some(m) = mask(n - i) else { break };
                let off = i * $size;
                acc[0] = $fmadd(load(wp.add(off), m), load(ap.add(off), m), acc[0]);
                i += $lanes;
            }
            let mut sum = $hsum($add($add(acc[0], acc[1]), $add(acc[2], acc[3])));
            while i < n {
                sum += scalar(&w[i * $size..], 0) * scalar(&a[i * $size..], 0);
                i += 1;
            }
            sum
        }
    };
}

/// AVX2 (SAFETY: AVX2+FMA+F16C): whole vectors of 8 lanes, the last few elements scalar.
macro_rules! avx2_float_dot {
    ($name:ident, $size:expr, $load:ident, $scalar:expr) => {
        float_dot!(
            "avx2,fma,f16c",
            $name,
            $size,
            8,
            [_mm256_setzero_ps, _mm256_fmadd_ps, _mm256_add_ps, hsum_ps],
            |p, ()| $load(p),
            |left: usize| (left >= 8).then_some(()),
            $scalar
        );
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

/// AVX-512 (SAFETY: AVX2+FMA+F16C+AVX512F/BW/VL): vectors of 16 lanes, the last one masked.
macro_rules! avx512_float_dot {
    ($name:ident, $size:expr, $load:ident, $scalar:expr) => {
        float_dot!(
            "avx2,fma,f16c,avx512f,avx512bw,avx512vl",
            $name,
            $size,
            16,
            [_mm512_setzero_ps, _mm512_fmadd_ps, _mm512_add_ps, hsum_ps512],
            $load,
            |left: usize| Some::<__mmask16>(if left >= 16 { 0xFFFF } else { (1u16 << left) - 1 }),
            $scalar
        );
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

avx512_float_dot!(dot_f32_avx512, 4, load16_f32, scalar_f32);
avx512_float_dot!(dot_f16_avx512, 2, load16_f16, scalar_f16);
avx512_float_dot!(dot_bf16_avx512, 2, load16_bf16, scalar_bf16);
