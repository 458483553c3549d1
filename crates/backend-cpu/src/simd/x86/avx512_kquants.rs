//! AVX-512 (F/BW/VL) kernels for the K-quants against Q8_K: the AVX2 scheme on 64 weights
//! per instruction. Codes are expanded to unsigned bytes (<= 63), `vpmaddubsw`-ed with the
//! Q8_K bytes, and `vpmaddwd`-ed with a vector of i16 sub-block scales (one `vpshufb` of the
//! broadcast scales per 64 elements); offsets (mins, Q6_K's -32, Q3_K's -4) come from the
//! Q8_K `bsums`. `Level::Avx512Vnni` uses the same kernels with `vpdpwssd` fusing the
//! scale multiply and the accumulate.

use super::kquants::{k4_block_start, q3k_scales, Q8K_BSUMS, Q8K_BYTES, Q8K_QS, QK_K};
use super::*;

const fn make_shuffles(first: [usize; 4], second: [usize; 4]) -> [[u8; 64]; 2] {
    let mut t = [[0u8; 64]; 2];
    let mut b = 0;
    while b < 64 {
        let lane = b / 16;
        t[0][b] = (2 * first[lane] + (b & 1)) as u8;
        t[1][b] = (2 * second[lane] + (b & 1)) as u8;
        b += 1;
    }
    t
}

/// `vpshufb` controls over 8 broadcast i16 scales: `SUB16[0]` puts scale `L` in 128-bit
/// lane `L`, `SUB16[1]` scale `4 + L` (sub-blocks of 16 elements, 64 elements a vector).
pub(super) static SUB16: [[u8; 64]; 2] = make_shuffles([0, 1, 2, 3], [4, 5, 6, 7]);

/// `vpshufb` controls for sub-blocks of 32: chunk `j` (64 elements) takes scale `2j` in
/// lanes 0-1 and `2j + 1` in lanes 2-3.
pub(super) static SUB32: [[[u8; 64]; 2]; 2] = [make_shuffles([0, 0, 1, 1], [2, 2, 3, 3]), make_shuffles([4, 4, 5, 5], [6, 6, 7, 7])];

/// `[b, b >> S]` (16-bit lane shifts) as one vector.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
pub(super) fn pair_shifted<const S: i32>(b: __m256i) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(b), _mm256_srli_epi16::<S>(b))
}

/// SAFETY: `p..p+64` readable.
#[inline(always)]
pub(super) unsafe fn load64(p: *const u8) -> __m512i {
    _mm512_loadu_si512(p as *const _)
}

/// SAFETY: `p..p+32` readable.
#[inline(always)]
pub(super) unsafe fn load32(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

/// SAFETY: `p..p+16` readable.
#[inline(always)]
pub(super) unsafe fn load16(p: *const u8) -> __m128i {
    _mm_loadu_si128(p as *const __m128i)
}

/// The 16 i16 sub-block scales of a block as two vectors, each one half's 8 scales broadcast
/// to the four 128-bit lanes (for [`scale_vec`] with the `SUB16` controls).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
pub(super) fn scale_halves(sc: __m256i) -> [__m512i; 2] {
    [_mm512_broadcast_i32x4(_mm256_castsi256_si128(sc)), _mm512_broadcast_i32x4(_mm256_extracti128_si256::<1>(sc))]
}

/// The 8 i16 scales in `s` broadcast, then shuffled by control `ctl`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
pub(super) fn scale_vec(s: __m512i, ctl: &[u8; 64]) -> __m512i {
    // SAFETY: `ctl` is 64 readable bytes.
    _mm512_shuffle_epi8(s, unsafe { load64(ctl.as_ptr()) })
}

/// Defines the five kernels for one flavour; `$madd_acc(acc, s, p)` = `acc + madd(s, p)`.
macro_rules! kquant_kernels {
    ($features:literal, $madd_acc:expr) => {
        use super::*;

        kquant_table!(pub(crate));

        #[inline]
        #[target_feature(enable = $features)]
        fn madd_acc(acc: __m512i, s: __m512i, p: __m512i) -> __m512i {
            ($madd_acc)(acc, s, p)
        }

        /// `sumi` plus one 128-element half of a block: the codes `q01` (elements 0..64) and
        /// `q23` (64..128) times the Q8_K bytes at `q8`, each 16 of them times their scale
        /// from `s` (see [`scale_halves`]). SAFETY: `q8..q8+128` readable, the CPU has this
        /// module's features.
        #[inline(always)]
        unsafe fn half_sum(sumi: __m512i, s: __m512i, q01: __m512i, q23: __m512i, q8: *const u8) -> __m512i {
            let p01 = _mm512_maddubs_epi16(q01, load64(q8));
            let p23 = _mm512_maddubs_epi16(q23, load64(q8.add(64)));
            let sumi = madd_acc(sumi, scale_vec(s, &SUB16[0]), p01);
            madd_acc(sumi, scale_vec(s, &SUB16[1]), p23)
        }

        /// Q2_K · Q8_K. SAFETY: the CPU has this module's features.
        #[target_feature(enable = $features)]
        pub(crate) unsafe fn dot_q2_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
            let nb = n / QK_K;
            check_len(nb, w, 84, a, Q8K_BYTES);
            let (wp, ap) = (w.as_ptr(), a.as_ptr());
            let m3 = _mm512_set1_epi8(3);
            let m4 = _mm_set1_epi8(0xF);
            let mut acc = _mm512_setzero_ps();
            let mut acc_m = _mm256_setzero_ps();
            for i in 0..nb {
                let (x, y) = (wp.add(i * 84), ap.add(i * Q8K_BYTES));
                prefetch(x, 84);
                let yd = f32_at(y);
                let d = yd * f16_at(x.add(80));
                let dmin = -yd * f16_at(x.add(82));
                let sm = load16(x);
                let mins = _mm256_cvtepi8_epi16(_mm_and_si128(_mm_srli_epi16(sm, 4), m4));
                let prod = _mm256_madd_epi16(mins, load32(y.add(Q8K_BSUMS)));
                acc_m = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(prod), acc_m);
                let sc = _mm256_cvtepi8_epi16(_mm_and_si128(sm, m4));
                let scb = scale_halves(sc);
                let mut sumi = _mm512_setzero_si512();
                for (h, s) in scb.iter().enumerate() {
                    let bits = pair_shifted::<2>(load32(x.add(16 + 32 * h)));
                    let q01 = _mm512_and_si512(bits, m3);
                    let q23 = _mm512_and_si512(_mm512_srli_epi16::<4>(bits), m3);
                    sumi = half_sum(sumi, *s, q01, q23, y.add(Q8K_QS + 128 * h));
                }
                acc = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(sumi), acc);
            }
            hsum_ps512(acc) + hsum_ps(acc_m)
        }

        /// Q3_K · Q8_K: codes `low2 | hbit << 2` (0..=7), value = code - 4; the -4 goes
        /// through `bsums`. SAFETY: the CPU has this module's features.
        #[target_feature(enable = $features)]
        pub(crate) unsafe fn dot_q3_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
            let nb = n / QK_K;
            check_len(nb, w, 110, a, Q8K_BYTES);
            let (wp, ap) = (w.as_ptr(), a.as_ptr());
            let m3 = _mm512_set1_epi8(3);
            let m4 = _mm512_set1_epi8(4);
            let mut acc = _mm512_setzero_ps();
            for i in 0..nb {
                let (x, y) = (wp.add(i * 110), ap.add(i * Q8K_BYTES));
                prefetch(x, 110);
                let d = f32_at(y) * f16_at(x.add(108));
                let sc = _mm256_cvtepi8_epi16(q3k_scales(x.add(96)));
                let off = _mm256_slli_epi32::<2>(_mm256_madd_epi16(sc, load32(y.add(Q8K_BSUMS))));
                let scb = scale_halves(sc);
                // bit 4h + k of hmask[l] for element l of group k in half h
                let mut hb = pair_shifted::<1>(load32(x));
                let mut sumi = _mm512_setzero_si512();
                for (h, s) in scb.iter().enumerate() {
                    let bits = pair_shifted::<2>(load32(x.add(32 + 32 * h)));
                    let h01 = _mm512_and_si512(_mm512_slli_epi16::<2>(hb), m4);
                    let h23 = _mm512_and_si512(hb, m4);
                    hb = _mm512_srli_epi16::<4>(hb);
                    let q01 = _mm512_or_si512(_mm512_and_si512(bits, m3), h01);
                    let q23 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16::<4>(bits), m3), h23);
                    sumi = half_sum(sumi, *s, q01, q23, y.add(Q8K_QS + 128 * h));
                }
                let sumi = _mm512_sub_epi32(sumi, _mm512_zextsi256_si512(off));
                acc = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(sumi), acc);
            }
            hsum_ps512(acc)
        }

        /// Q4_K · Q8_K. SAFETY: the CPU has this module's features.
        #[target_feature(enable = $features)]
        pub(crate) unsafe fn dot_q4_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
            let nb = n / QK_K;
            check_len(nb, w, 144, a, Q8K_BYTES);
            let (wp, ap) = (w.as_ptr(), a.as_ptr());
            let m4 = _mm512_set1_epi8(0xF);
            let mut acc = _mm512_setzero_ps();
            let mut acc_m = _mm_setzero_ps();
            for i in 0..nb {
                let (x, y) = (wp.add(i * 144), ap.add(i * Q8K_BYTES));
                prefetch(x, 144);
                let (d, ms) = k4_block_start(x, y, &mut acc_m);
                let scb = _mm512_broadcast_i32x4(_mm256_castsi256_si128(ms));
                let mut sumi = _mm512_setzero_si512();
                for j in 0..4 {
                    let q = _mm512_and_si512(pair_shifted::<4>(load32(x.add(16 + 32 * j))), m4);
                    let p = _mm512_maddubs_epi16(q, load64(y.add(Q8K_QS + 64 * j)));
                    sumi = madd_acc(sumi, scale_vec(scb, &SUB32[j / 2][j % 2]), p);
                }
                acc = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(sumi), acc);
            }
            hsum_ps512(acc) + hsum_ps128(acc_m)
        }

        /// Q5_K · Q8_K. SAFETY: the CPU has this module's features.
        #[target_feature(enable = $features)]
        pub(crate) unsafe fn dot_q5_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
            let nb = n / QK_K;
            check_len(nb, w, 176, a, Q8K_BYTES);
            let (wp, ap) = (w.as_ptr(), a.as_ptr());
            let m4 = _mm512_set1_epi8(0xF);
            let m16 = _mm512_set1_epi8(0x10);
            let mut acc = _mm512_setzero_ps();
            let mut acc_m = _mm_setzero_ps();
            for i in 0..nb {
                let (x, y) = (wp.add(i * 176), ap.add(i * Q8K_BYTES));
                prefetch(x, 176);
                let (d, ms) = k4_block_start(x, y, &mut acc_m);
                let scb = _mm512_broadcast_i32x4(_mm256_castsi256_si128(ms));
                // low half of chunk j: bit 2j of qh[l]; high half: bit 2j + 1
                let mut hb = pair_shifted::<1>(load32(x.add(16)));
                let mut sumi = _mm512_setzero_si512();
                for j in 0..4 {
                    let q = _mm512_and_si512(pair_shifted::<4>(load32(x.add(48 + 32 * j))), m4);
                    let q = _mm512_or_si512(q, _mm512_and_si512(_mm512_slli_epi16::<4>(hb), m16));
                    hb = _mm512_srli_epi16::<2>(hb);
                    let p = _mm512_maddubs_epi16(q, load64(y.add(Q8K_QS + 64 * j)));
                    sumi = madd_acc(sumi, scale_vec(scb, &SUB32[j / 2][j % 2]), p);
                }
                acc = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(sumi), acc);
            }
            hsum_ps512(acc) + hsum_ps128(acc_m)
        }

        /// Q6_K · Q8_K: the -32 goes through `bsums`. SAFETY: the CPU has this module's
        /// features.
        #[target_feature(enable = $features)]
        pub(crate) unsafe fn dot_q6_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
            let nb = n / QK_K;
            check_len(nb, w, 210, a, Q8K_BYTES);
            let (wp, ap) = (w.as_ptr(), a.as_ptr());
            let m3 = _mm512_set1_epi8(3);
            let m15 = _mm512_set1_epi8(15);
            let mut acc = _mm512_setzero_ps();
            for i in 0..nb {
                let (x, y) = (wp.add(i * 210), ap.add(i * Q8K_BYTES));
                prefetch(x, 210);
                let d = f32_at(y) * f16_at(x.add(208));
                let sc = _mm256_cvtepi8_epi16(load16(x.add(192)));
                let off = _mm256_slli_epi32::<5>(_mm256_madd_epi16(sc, load32(y.add(Q8K_BSUMS))));
                let scb = scale_halves(sc);
                let mut sumi = _mm512_setzero_si512();
                for (h, s) in scb.iter().enumerate() {
                    let ql = load64(x.add(64 * h));
                    let h01 = pair_shifted::<2>(load32(x.add(128 + 32 * h)));
                    let h23 = _mm512_srli_epi16::<4>(h01);
                    let q01 = _mm512_or_si512(_mm512_and_si512(ql, m15), _mm512_slli_epi16::<4>(_mm512_and_si512(h01, m3)));
                    let q23 = _mm512_or_si512(
                        _mm512_and_si512(_mm512_srli_epi16::<4>(ql), m15),
                        _mm512_slli_epi16::<4>(_mm512_and_si512(h23, m3)),
                    );
                    sumi = half_sum(sumi, *s, q01, q23, y.add(Q8K_QS + 128 * h));
                }
                let sumi = _mm512_sub_epi32(sumi, _mm512_zextsi256_si512(off));
                acc = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(sumi), acc);
            }
            hsum_ps512(acc)
        }
    };
}

/// AVX512F/BW/VL.
pub(crate) mod bw {
    kquant_kernels!("avx2,fma,f16c,avx512f,avx512bw,avx512vl", |acc: __m512i, s: __m512i, p: __m512i| {
        _mm512_add_epi32(acc, _mm512_madd_epi16(s, p))
    });
}

/// AVX512F/BW/VL + VNNI (`vpdpwssd`).
pub(crate) mod vnni {
    kquant_kernels!("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni", |acc: __m512i, s: __m512i, p: __m512i| {
        _mm512_dpwssd_epi32(acc, s, p)
    });
}
