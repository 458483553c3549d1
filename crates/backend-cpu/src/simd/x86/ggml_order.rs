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

/// The kernel `$f` of `ty` among the five formats, from the VNNI module where the CPU has
/// AVX-512 VNNI (as ggml picks `vpdpbusd`), else from the AVX2 one.
macro_rules! pick {
    ($ty:expr, $($qt:ident => $f:ident),*) => {{
        let vnni = std::arch::is_x86_feature_detected!("avx512vnni") && std::arch::is_x86_feature_detected!("avx512vl");
        // SAFETY (all arms): callers reach this only on CPUs with AVX2+FMA+F16C (checked by
        // the dispatcher), and VNNI variants only when detected above; the kernels check
        // lengths.
        Some(match ($ty, vnni) {
            $(
                (QuantType::$qt, false) => |n, w, a| unsafe { avx2::$f(n, w, a) },
                (QuantType::$qt, true) => |n, w, a| unsafe { vnni::$f(n, w, a) },
            )*
            _ => return None,
        })
    }};
}

pub(crate) fn dot_fn(ty: QuantType) -> Option<DotFn> {
    pick!(ty, Q4_0 => dot_q4_0, Q4_1 => dot_q4_1, Q8_0 => dot_q8_0, Q5_0 => dot_q5_0, Q5_1 => dot_q5_1)
}

/// Four-row twins of [`dot_fn`]'s kernels (each row bit-identical to the one-row kernel).
pub(crate) fn dot4_fn(ty: QuantType) -> Option<Dot4Fn> {
    pick!(ty, Q4_0 => dot4_q4_0, Q4_1 => dot4_q4_1, Q8_0 => dot4_q8_0, Q5_0 => dot4_q5_0, Q5_1 => dot4_q5_1)
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

/// The 32 activation codes at `p`.
#[inline(always)]
unsafe fn load_codes(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

/// One-row (`dot_*`) and four-row (`dot4_*`) entry points of each format: `$rows` with
/// `$wb`-byte weight blocks, prefetched `$pf` bytes ahead (four rows only), with a min or not
/// (`$min`), whose codes `$codes` reads from a block.
macro_rules! entry_points {
    ($feat:literal; $($dot:ident, $dot4:ident: $rows:ident::<$wb:literal, $pf:literal, $min:literal>($codes:expr);)*) => {$(
        #[target_feature(enable = $feat)]
        pub(super) unsafe fn $dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
            $rows::<1, $wb, $pf, $min>(n, [w], a, $codes)[0]
        }

        #[target_feature(enable = $feat)]
        pub(super) unsafe fn $dot4(n: usize, w: [&[u8]; 4], a: &[u8]) -> [f32; 4] {
            $rows::<4, $wb, $pf, $min>(n, w, a, $codes)
        }
    )*};
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

        /// The block loop of `R` weight rows against one activation row (32 elements a block;
        /// `WB`, `ab`: weight and activation block bytes). Per block, `act` reads the
        /// activation block once for all rows, then `step(r, wr, &act, &mut acc[r])` advances
        /// row `r`'s own chain with its weight block `wr`: each row sums in the order of the
        /// one-row kernel, so every result is bit-identical to it, while several independent
        /// rows hide memory latency. With `R > 1`, `PF > 0` prefetches each row `PF` bytes
        /// ahead (0: no prefetch).
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn rows<const R: usize, const WB: usize, const PF: usize, A>(
            n: usize,
            w: [&[u8]; R],
            a: &[u8],
            ab: usize,
            act: impl Fn(*const u8) -> A,
            mut step: impl FnMut(usize, *const u8, &A, &mut __m256),
        ) -> [__m256; R] {
            let nb = n / 32;
            assert!(w.iter().all(|r| r.len() >= nb * WB) && a.len() >= nb * ab);
            let mut wp = w.map(|r| r.as_ptr());
            let mut ap = a.as_ptr();
            let mut acc = [_mm256_setzero_ps(); R];
            for _ in 0..nb {
                let y = act(ap);
                for r in 0..R {
                    if R > 1 && PF > 0 {
                        _mm_prefetch::<_MM_HINT_T0>(wp[r].add(PF) as *const i8);
                    }
                    step(r, wp[r], &y, &mut acc[r]);
                    wp[r] = wp[r].add(WB);
                }
                ap = ap.add(ab);
            }
            acc
        }

        /// `R` rows against Q8_0 (`MIN` false: signed codes with a scale a block, as Q4_0, Q5_0,
        /// Q8_0; `acc = fma(d_w * d_a, block_sum, acc)`) or against Q8_1 (`MIN` true: unsigned
        /// codes with a scale and a min a block, as Q4_1, Q5_1; plus `summs = fma(m_w, s_a,
        /// summs)`, added after the sum).
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn rows_q8<const R: usize, const WB: usize, const PF: usize, const MIN: bool>(
            n: usize,
            w: [&[u8]; R],
            a: &[u8],
            codes: impl Fn(*const u8) -> __m256i,
        ) -> [f32; R] {
            // activation blocks: d, then s (Q8_1 only), then the 32 codes
            let (ab, at) = if MIN { (36, 4) } else { (34, 2) };
            let act = |ap: *const u8| (f16_at(ap), if MIN { f16_at(ap.add(2)) } else { 0.0 }, load_codes(ap.add(at)));
            let mut summs = [0.0f32; R];
            let acc = rows::<R, WB, PF, _>(n, w, a, ab, act, |r, wr, &(da, sa, y), acc| {
                let sum = if MIN {
                    summs[r] = f16_at(wr.add(2)).mul_add(sa, summs[r]);
                    mul_sum_us(codes(wr), y)
                } else {
                    mul_sum_ss(codes(wr), y)
                };
                *acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_at(wr) * da), sum, *acc);
            });
            // Q8_0 formats add nothing (not even 0.0, which would turn a -0.0 sum into +0.0)
            std::array::from_fn(|r| if MIN { hsum(acc[r]) + summs[r] } else { hsum(acc[r]) })
        }

        entry_points! {
            $feat;
            dot_q4_0, dot4_q4_0: rows_q8::<18, 576, false>(|x| _mm256_sub_epi8(unpack_nibbles(x.add(2)), _mm256_set1_epi8(8)));
            dot_q4_1, dot4_q4_1: rows_q8::<20, 640, true>(|x| unpack_nibbles(x.add(4)));
            dot_q5_0, dot4_q5_0: rows_q8::<22, 0, false>(|x| q5_0_signed(x));
            dot_q5_1, dot4_q5_1: rows_q8::<24, 0, true>(|x| q5_1_codes(x));
            dot_q8_0, dot4_q8_0: rows_q8::<34, 1088, false>(|x| load_codes(x.add(2)));
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
