//! Kernels that accumulate in exactly the float order of llama.cpp's x86 build
//! (`ggml_vec_dot_{q4_0_q8_0,q4_1_q8_1,q5_0_q8_0,q5_1_q8_1,q8_0_q8_0}` AVX2 paths, which its
//! AVX-512 builds run too): one 8-lane accumulator, `acc = fma(d_w * d_a, block_sum, acc)` per
//! block, `hsum_float_8`, and Q4_1's / Q5_1's `summs` updated with an FMA as ggml's compiler
//! contracts it.
//! Integer block sums are exact (`vpmaddubsw`+`vpmaddwd`, or `vpdpbusd` where AVX-512 VNNI is
//! present, as ggml does), so results are bit-identical to llama.cpp's.

use crate::simd::{Dot4Fn, DotFn};
use quarrel_core::QuantType;
use std::arch::x86_64::*;

pub(crate) fn dot_fn(ty: QuantType) -> Option<DotFn> {
    let vnni = std::arch::is_x86_feature_detected!("avx512vnni") && std::arch::is_x86_feature_detected!("avx512vl");
    // SAFETY (all arms): callers reach this only on CPUs with AVX2+FMA+F16C (checked by the
    // dispatcher), and VNNI variants only when detected above; the kernels check lengths.
    Some(match (ty, vnni) {
        (QuantType::Q4_0, false) => |n, w, a| unsafe { avx2::dot_q4_0(n, w, a) },
        (QuantType::Q4_1, false) => |n, w, a| unsafe { avx2::dot_q4_1(n, w, a) },
        (QuantType::Q8_0, false) => |n, w, a| unsafe { avx2::dot_q8_0(n, w, a) },
        (QuantType::Q5_0, false) => |n, w, a| unsafe { avx2::dot_q5_0(n, w, a) },
        (QuantType::Q5_1, false) => |n, w, a| unsafe { avx2::dot_q5_1(n, w, a) },
        (QuantType::Q4_0, true) => |n, w, a| unsafe { vnni::dot_q4_0(n, w, a) },
        (QuantType::Q4_1, true) => |n, w, a| unsafe { vnni::dot_q4_1(n, w, a) },
        (QuantType::Q8_0, true) => |n, w, a| unsafe { vnni::dot_q8_0(n, w, a) },
        (QuantType::Q5_0, true) => |n, w, a| unsafe { vnni::dot_q5_0(n, w, a) },
        (QuantType::Q5_1, true) => |n, w, a| unsafe { vnni::dot_q5_1(n, w, a) },
        _ => return None,
    })
}

/// Four-row twins of [`dot_fn`]'s kernels (each row bit-identical to the one-row kernel).
pub(crate) fn dot4_fn(ty: QuantType) -> Option<Dot4Fn> {
    let vnni = std::arch::is_x86_feature_detected!("avx512vnni") && std::arch::is_x86_feature_detected!("avx512vl");
    // SAFETY: as in `dot_fn`.
    Some(match (ty, vnni) {
        (QuantType::Q4_0, false) => |n, w, a| unsafe { avx2::dot4_q4_0(n, w, a) },
        (QuantType::Q4_1, false) => |n, w, a| unsafe { avx2::dot4_q4_1(n, w, a) },
        (QuantType::Q8_0, false) => |n, w, a| unsafe { avx2::dot4_q8_0(n, w, a) },
        (QuantType::Q5_0, false) => |n, w, a| unsafe { avx2::dot4_q5_0(n, w, a) },
        (QuantType::Q5_1, false) => |n, w, a| unsafe { avx2::dot4_q5_1(n, w, a) },
        (QuantType::Q4_0, true) => |n, w, a| unsafe { vnni::dot4_q4_0(n, w, a) },
        (QuantType::Q4_1, true) => |n, w, a| unsafe { vnni::dot4_q4_1(n, w, a) },
        (QuantType::Q8_0, true) => |n, w, a| unsafe { vnni::dot4_q8_0(n, w, a) },
        (QuantType::Q5_0, true) => |n, w, a| unsafe { vnni::dot4_q5_0(n, w, a) },
        (QuantType::Q5_1, true) => |n, w, a| unsafe { vnni::dot4_q5_1(n, w, a) },
        _ => return None,
    })
}

#[inline(always)]
unsafe fn f16_at(p: *const u8) -> f32 {
    let h = (p as *const u16).read_unaligned();
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)))
}

/// ggml's `hsum_float_8` (also the order of the AVX-512 GEMV / GEMM tiles' row sums).
#[inline(always)]
pub(super) unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// ggml's `bytes_from_bits_32`: byte `j` is 0xFF where bit `j` of the u32 at `p` is set.
#[inline(always)]
unsafe fn bytes_from_bits(p: *const u8) -> __m256i {
    let x = (p as *const u32).read_unaligned() as i32;
    let shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x), shuf);
    let bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1))
}

/// Q5_0 codes minus 16 as signed bytes (block: d, qh u32, 16 nibble bytes).
#[inline(always)]
unsafe fn q5_0_signed(b: *const u8) -> __m256i {
    let hi = _mm256_andnot_si256(bytes_from_bits(b.add(2)), _mm256_set1_epi8(0xF0u8 as i8));
    _mm256_or_si256(unpack_nibbles(b.add(6)), hi)
}

/// Q5_1 codes 0..32 as unsigned bytes (block: d, m, qh u32, 16 nibble bytes).
#[inline(always)]
unsafe fn q5_1_codes(b: *const u8) -> __m256i {
    let hi = _mm256_and_si256(bytes_from_bits(b.add(4)), _mm256_set1_epi8(0x10));
    _mm256_or_si256(unpack_nibbles(b.add(8)), hi)
}

/// 16 bytes of packed nibbles -> 32 bytes: low nibbles (elements 0..16) then high (16..32).
#[inline(always)]
unsafe fn unpack_nibbles(p: *const u8) -> __m256i {
    let t = _mm_loadu_si128(p as *const __m128i);
    let v = _mm256_set_m128i(_mm_srli_epi16(t, 4), t);
    _mm256_and_si256(v, _mm256_set1_epi8(0x0f))
}

macro_rules! kernels {
    ($feat:literal, $us:ident) => {
        /// unsigned x signed byte products summed to 8 f32 lanes
        #[inline(always)]
        unsafe fn mul_sum_us(x: __m256i, y: __m256i) -> __m256 {
            _mm256_cvtepi32_ps($us(x, y))
        }

        /// signed x signed byte products summed to 8 f32 lanes (ggml's sign trick)
        #[inline(always)]
        unsafe fn mul_sum_ss(x: __m256i, y: __m256i) -> __m256 {
            mul_sum_us(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x))
        }

        #[target_feature(enable = $feat)]
        pub(super) unsafe fn dot_q4_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
            let nb = n / 32;
            assert!(w.len() >= nb * 18 && a.len() >= nb * 34);
            let (mut wp, mut ap) = (w.as_ptr(), a.as_ptr());
            let mut acc = _mm256_setzero_ps();
            for _ in 0..nb {
                let d = _mm256_set1_ps(f16_at(wp) * f16_at(ap));
                let q = _mm256_sub_epi8(unpack_nibbles(wp.add(2)), _mm256_set1_epi8(8));
                let y = _mm256_loadu_si256(ap.add(2) as *const __m256i);
                acc = _mm256_fmadd_ps(d, mul_sum_ss(q, y), acc);
                wp = wp.add(18);
                ap = ap.add(34);
            }
            hsum(acc)
        }

        #[target_feature(enable = $feat)]
        pub(super) unsafe fn dot_q4_1(n: usize, w: &[u8], a: &[u8]) -> f32 {
            let nb = n / 32;
            assert!(w.len() >= nb * 20 && a.len() >= nb * 36);
            let (mut wp, mut ap) = (w.as_ptr(), a.as_ptr());
            let mut acc = _mm256_setzero_ps();
            let mut summs = 0.0f32;
            for _ in 0..nb {
                summs = f16_at(wp.add(2)).mul_add(f16_at(ap.add(2)), summs);
                let d = _mm256_set1_ps(f16_at(wp) * f16_at(ap));
                let q = unpack_nibbles(wp.add(4));
                let y = _mm256_loadu_si256(ap.add(4) as *const __m256i);
                acc = _mm256_fmadd_ps(d, mul_sum_us(q, y), acc);
                wp = wp.add(20);
                ap = ap.add(36);
            }
            hsum(acc) + summs
        }

        /// Four rows against one activation row: each row keeps its own accumulator chain, in
        /// the same order as `dot_q4_1`, so every result is bit-identical to it; the four
        /// independent streams hide memory latency and share the activation loads.
        #[target_feature(enable = $feat)]
        pub(super) unsafe fn dot4_q4_1(n: usize, w: [&[u8]; 4], a: &[u8]) -> [f32; 4] {
            let nb = n / 32;
            assert!(w.iter().all(|r| r.len() >= nb * 20) && a.len() >= nb * 36);
            let mut wp = [w[0].as_ptr(), w[1].as_ptr(), w[2].as_ptr(), w[3].as_ptr()];
            let mut ap = a.as_ptr();
            let mut acc = [_mm256_setzero_ps(); 4];
            let mut summs = [0.0f32; 4];
            for _ in 0..nb {
                let da = f16_at(ap);
                let sa = f16_at(ap.add(2));
                let y = _mm256_loadu_si256(ap.add(4) as *const __m256i);
                for r in 0..4 {
                    _mm_prefetch::<_MM_HINT_T0>(wp[r].add(640) as *const i8);
                    summs[r] = f16_at(wp[r].add(2)).mul_add(sa, summs[r]);
                    let d = _mm256_set1_ps(f16_at(wp[r]) * da);
                    let q = unpack_nibbles(wp[r].add(4));
                    acc[r] = _mm256_fmadd_ps(d, mul_sum_us(q, y), acc[r]);
                    wp[r] = wp[r].add(20);
                }
                ap = ap.add(36);
            }
            [hsum(acc[0]) + summs[0], hsum(acc[1]) + summs[1], hsum(acc[2]) + summs[2], hsum(acc[3]) + summs[3]]
        }

        /// Four-row Q4_0 (bit-identical per row to `dot_q4_0`).
        #[target_feature(enable = $feat)]
        pub(super) unsafe fn dot4_q4_0(n: usize, w: [&[u8]; 4], a: &[u8]) -> [f32; 4] {
            let nb = n / 32;
            assert!(w.iter().all(|r| r.len() >= nb * 18) && a.len() >= nb * 34);
            let mut wp = [w[0].as_ptr(), w[1].as_ptr(), w[2].as_ptr(), w[3].as_ptr()];
            let mut ap = a.as_ptr();
            let mut acc = [_mm256_setzero_ps(); 4];
            for _ in 0..nb {
                let da = f16_at(ap);
                let y = _mm256_loadu_si256(ap.add(2) as *const __m256i);
                for r in 0..4 {
                    _mm_prefetch::<_MM_HINT_T0>(wp[r].add(576) as *const i8);
                    let d = _mm256_set1_ps(f16_at(wp[r]) * da);
                    let q = _mm256_sub_epi8(unpack_nibbles(wp[r].add(2)), _mm256_set1_epi8(8));
                    acc[r] = _mm256_fmadd_ps(d, mul_sum_ss(q, y), acc[r]);
                    wp[r] = wp[r].add(18);
                }
                ap = ap.add(34);
            }
            [hsum(acc[0]), hsum(acc[1]), hsum(acc[2]), hsum(acc[3])]
        }

        /// Four-row Q8_0 (bit-identical per row to `dot_q8_0`).
        #[target_feature(enable = $feat)]
        pub(super) unsafe fn dot4_q8_0(n: usize, w: [&[u8]; 4], a: &[u8]) -> [f32; 4] {
            let nb = n / 32;
            assert!(w.iter().all(|r| r.len() >= nb * 34) && a.len() >= nb * 34);
            let mut wp = [w[0].as_ptr(), w[1].as_ptr(), w[2].as_ptr(), w[3].as_ptr()];
            let mut ap = a.as_ptr();
            let mut acc = [_mm256_setzero_ps(); 4];
            for _ in 0..nb {
                let da = f16_at(ap);
                let y = _mm256_loadu_si256(ap.add(2) as *const __m256i);
                for r in 0..4 {
                    _mm_prefetch::<_MM_HINT_T0>(wp[r].add(1088) as *const i8);
                    let d = _mm256_set1_ps(f16_at(wp[r]) * da);
                    let x = _mm256_loadu_si256(wp[r].add(2) as *const __m256i);
                    acc[r] = _mm256_fmadd_ps(d, mul_sum_ss(x, y), acc[r]);
                    wp[r] = wp[r].add(34);
                }
                ap = ap.add(34);
            }
            [hsum(acc[0]), hsum(acc[1]), hsum(acc[2]), hsum(acc[3])]
        }

        /// `ggml_vec_dot_q5_0_q8_0`: as Q8_0 with the 5-bit codes minus 16.
        #[target_feature(enable = $feat)]
        pub(super) unsafe fn dot_q5_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
            dot4_q5_0(n, [w, w, w, w], a)[0]
        }

        /// Four-row Q5_0: each row's chain exactly `ggml_vec_dot_q5_0_q8_0`'s.
        #[target_feature(enable = $feat)]
        pub(super) unsafe fn dot4_q5_0(n: usize, w: [&[u8]; 4], a: &[u8]) -> [f32; 4] {
            let nb = n / 32;
            assert!(w.iter().all(|r| r.len() >= nb * 22) && a.len() >= nb * 34);
            let mut wp = [w[0].as_ptr(), w[1].as_ptr(), w[2].as_ptr(), w[3].as_ptr()];
            let mut ap = a.as_ptr();
            let mut acc = [_mm256_setzero_ps(); 4];
            for _ in 0..nb {
                let da = f16_at(ap);
                let y = _mm256_loadu_si256(ap.add(2) as *const __m256i);
                for r in 0..4 {
                    let d = _mm256_set1_ps(f16_at(wp[r]) * da);
                    acc[r] = _mm256_fmadd_ps(d, mul_sum_ss(q5_0_signed(wp[r]), y), acc[r]);
                    wp[r] = wp[r].add(22);
                }
                ap = ap.add(34);
            }
            [hsum(acc[0]), hsum(acc[1]), hsum(acc[2]), hsum(acc[3])]
        }

        /// `ggml_vec_dot_q5_1_q8_1`: `fma(q, d_w * d_a, acc)` per block, `summs` by FMA.
        #[target_feature(enable = $feat)]
        pub(super) unsafe fn dot_q5_1(n: usize, w: &[u8], a: &[u8]) -> f32 {
            dot4_q5_1(n, [w, w, w, w], a)[0]
        }

        /// Four-row Q5_1: each row's chain exactly `ggml_vec_dot_q5_1_q8_1`'s.
        #[target_feature(enable = $feat)]
        pub(super) unsafe fn dot4_q5_1(n: usize, w: [&[u8]; 4], a: &[u8]) -> [f32; 4] {
            let nb = n / 32;
            assert!(w.iter().all(|r| r.len() >= nb * 24) && a.len() >= nb * 36);
            let mut wp = [w[0].as_ptr(), w[1].as_ptr(), w[2].as_ptr(), w[3].as_ptr()];
            let mut ap = a.as_ptr();
            let mut acc = [_mm256_setzero_ps(); 4];
            let mut summs = [0.0f32; 4];
            for _ in 0..nb {
                let (da, sa) = (f16_at(ap), f16_at(ap.add(2)));
                let y = _mm256_loadu_si256(ap.add(4) as *const __m256i);
                for r in 0..4 {
                    summs[r] = f16_at(wp[r].add(2)).mul_add(sa, summs[r]);
                    let d = _mm256_set1_ps(f16_at(wp[r]) * da);
                    acc[r] = _mm256_fmadd_ps(mul_sum_us(q5_1_codes(wp[r]), y), d, acc[r]);
                    wp[r] = wp[r].add(24);
                }
                ap = ap.add(36);
            }
            [hsum(acc[0]) + summs[0], hsum(acc[1]) + summs[1], hsum(acc[2]) + summs[2], hsum(acc[3]) + summs[3]]
        }

        #[target_feature(enable = $feat)]
        pub(super) unsafe fn dot_q8_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
            let nb = n / 32;
            assert!(w.len() >= nb * 34 && a.len() >= nb * 34);
            let (mut wp, mut ap) = (w.as_ptr(), a.as_ptr());
            let mut acc = _mm256_setzero_ps();
            for _ in 0..nb {
                let d = _mm256_set1_ps(f16_at(wp) * f16_at(ap));
                let x = _mm256_loadu_si256(wp.add(2) as *const __m256i);
                let y = _mm256_loadu_si256(ap.add(2) as *const __m256i);
                acc = _mm256_fmadd_ps(d, mul_sum_ss(x, y), acc);
                wp = wp.add(34);
                ap = ap.add(34);
            }
            hsum(acc)
        }
    };
}

mod avx2 {
    use super::*;

    #[inline(always)]
    unsafe fn maddubs_sum(x: __m256i, y: __m256i) -> __m256i {
        _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), _mm256_set1_epi16(1))
    }

    kernels!("avx2,fma,f16c", maddubs_sum);
}

mod vnni {
    use super::*;

    #[inline(always)]
    unsafe fn dpbusd_sum(x: __m256i, y: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), x, y)
    }

    kernels!("avx2,fma,f16c,avx512f,avx512vl,avx512vnni", dpbusd_sum);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn four_row_kernels_are_bit_identical_to_one_row() {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")) {
            return;
        }
        let mut rnd = super::super::test_rnd(12345);
        for ty in [QuantType::Q4_0, QuantType::Q4_1, QuantType::Q5_0, QuantType::Q5_1, QuantType::Q8_0] {
            for nb in [1usize, 2, 18, 48] {
                let n = nb * 32;
                let rows: Vec<Vec<u8>> = (0..4)
                    .map(|_| {
                        let x: Vec<f32> = (0..n).map(|_| rnd()).collect();
                        quarrel_quant::quantize_to_vec(ty, &x).unwrap()
                    })
                    .collect();
                let x: Vec<f32> = (0..n).map(|_| rnd()).collect();
                let a = quarrel_quant::quantize_to_vec(ty.vec_dot_type(), &x).unwrap();
                let (f1, f4) = (dot_fn(ty).unwrap(), dot4_fn(ty).unwrap());
                let four = f4(n, [&rows[0], &rows[1], &rows[2], &rows[3]], &a);
                for r in 0..4 {
                    assert_eq!(four[r].to_bits(), f1(n, &rows[r], &a).to_bits(), "{} nb {nb} row {r}", ty.name());
                }
            }
        }
    }
}
