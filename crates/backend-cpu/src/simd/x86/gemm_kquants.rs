//! GEMM kernels (AVX-512) for Q4_K, Q5_K and Q6_K weights against Q8_K activations, giving
//! every (row, token) output exactly the bits of the one-row kernels in `avx512_kquants.rs`
//! (the matmul's kernels at `Level::Avx512` and above): per output a 16-lane accumulator
//! `acc = fma(set1(d_a * d_w), cvt(sumi), acc)` per super-block in order, Q4_K/Q5_K's 4-lane
//! `acc_m = fma(set1(-d_a * dmin_w), cvt(mins · bsums), acc_m)`, and the same final sums.
//! `sumi` is an exact integer per lane (`vpmaddubsw` products, `vpmaddwd`/`vpdpwssd` with the
//! sub-block scales): the VNNI and non-VNNI flavours agree lane for lane.
//!
//! One row against up to 8 tokens: a super-block's unpacked codes and scale vectors (8
//! registers) are built once and used for every token; the activations are read in place.
//! Panels are the rows one after another (`ROWS` weight rows, up to `TOKENS` activation
//! rows): the matmul passes runs of rows in place.

use super::avx512_kquants::{load16, load32, load64, pair_shifted, scale_vec, SUB16, SUB32};
use super::kquants::{k4_scales_mins, QK_K, Q8K_BSUMS, Q8K_BYTES, Q8K_QS};
use super::{f16_at, f32_at, hsum_ps128, hsum_ps512};
use crate::simd::{GEMM_ROWS as ROWS, GEMM_TOKENS as TOKENS};
use std::arch::x86_64::*;

/// The K-quant types with a GEMM kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ty {
    Q4K,
    Q5K,
    Q6K,
}

impl Ty {
    fn block_bytes(self) -> usize {
        match self {
            Ty::Q4K => 144,
            Ty::Q5K => 176,
            Ty::Q6K => 210,
        }
    }

    pub(crate) fn act_panel_bytes(self, n_in: usize) -> usize {
        (n_in / QK_K * Q8K_BYTES * TOKENS).next_multiple_of(64)
    }

    pub(crate) fn weight_panel_bytes(self, n_in: usize) -> usize {
        (n_in / QK_K * self.block_bytes() * ROWS).next_multiple_of(64)
    }

    pub(crate) fn pack_act(self, n_in: usize, rows: &[&[u8]], panel: &mut [u8]) {
        copy_rows(n_in / QK_K * Q8K_BYTES, TOKENS, rows, panel);
    }

    pub(crate) fn pack_weights(self, n_in: usize, rows: &[&[u8]], panel: &mut [u8]) {
        copy_rows(n_in / QK_K * self.block_bytes(), ROWS, rows, panel);
    }

    /// See `gemm::Kind::tile`. `vnni`: use `vpdpwssd` (the CPU must have AVX512-VNNI).
    pub(crate) fn tile(self, vnni: bool, n_in: usize, w: &[u8], a: &[u8], n_tok: usize, out: &mut [[f32; TOKENS]; ROWS]) {
        let (nb, wrb, arb) = (n_in / QK_K, n_in / QK_K * self.block_bytes(), n_in / QK_K * Q8K_BYTES);
        assert!(super::has_avx2() && super::has_avx512() && (!vnni || super::has_avx512vnni()));
        assert!(n_in.is_multiple_of(QK_K) && w.len() >= ROWS * wrb && (1..=TOKENS).contains(&n_tok) && a.len() >= n_tok * arb);
        for (r, o) in out.iter_mut().enumerate() {
            let wr = w[r * wrb..].as_ptr();
            let mut t0 = 0;
            while t0 < n_tok {
                let ap = |t: usize| a[(t0 + t) * arb..].as_ptr();
                // SAFETY: the CPU has the features (asserted above); the row and the token
                // rows `t0..t0 + T` (< n_tok <= TOKENS) hold `nb` blocks each.
                let take = unsafe {
                    macro_rules! run {
                        ($T:literal) => {{
                            let v = match (self, vnni) {
                                (Ty::Q4K, false) => bw::q4k::<$T>(nb, wr, std::array::from_fn(ap)),
                                (Ty::Q5K, false) => bw::q5k::<$T>(nb, wr, std::array::from_fn(ap)),
                                (Ty::Q6K, false) => bw::q6k::<$T>(nb, wr, std::array::from_fn(ap)),
                                (Ty::Q4K, true) => vnni::q4k::<$T>(nb, wr, std::array::from_fn(ap)),
                                (Ty::Q5K, true) => vnni::q5k::<$T>(nb, wr, std::array::from_fn(ap)),
                                (Ty::Q6K, true) => vnni::q6k::<$T>(nb, wr, std::array::from_fn(ap)),
                            };
                            o[t0..t0 + $T].copy_from_slice(&v);
                            $T
                        }};
                    }
                    match n_tok - t0 {
                        8.. => run!(8),
                        7 => run!(7),
                        6 => run!(6),
                        5 => run!(5),
                        4 => run!(4),
                        3 => run!(3),
                        2 => run!(2),
                        _ => run!(1),
                    }
                };
                t0 += take;
            }
        }
    }
}

/// `rows` (each at least `rb` bytes) one after the other into `panel`, zeros for the rest
/// of `n` rows.
fn copy_rows(rb: usize, n: usize, rows: &[&[u8]], panel: &mut [u8]) {
    assert!(rows.len() <= n && panel.len() >= n * rb);
    panel[..n * rb].fill(0);
    for (dst, src) in panel.chunks_exact_mut(rb).zip(rows) {
        dst.copy_from_slice(&src[..rb]);
    }
}

macro_rules! kquant_tiles {
    ($features:literal, $madd_acc:expr) => {
        use super::*;

        #[inline(always)]
        unsafe fn madd_acc(acc: __m512i, s: __m512i, p: __m512i) -> __m512i {
            ($madd_acc)(acc, s, p)
        }

        /// Q4_K's `acc_m` step and the code/scale dot of one token (4 chunks of 64).
        #[allow(clippy::too_many_arguments)]
        #[inline(always)]
        unsafe fn k4_token(y: *const u8, dw: f32, dmw: f32, mins: __m128i, sc: &[__m512i; 4], q: &[__m512i; 4], acc: &mut __m512, acc_m: &mut __m128) {
            let yd = f32_at(y);
            let d = yd * dw;
            let dmin = -yd * dmw;
            let q8sums = load32(y.add(Q8K_BSUMS));
            let q8s = _mm_hadd_epi16(_mm256_castsi256_si128(q8sums), _mm256_extracti128_si256::<1>(q8sums));
            let prod = _mm_madd_epi16(mins, q8s);
            *acc_m = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(prod), *acc_m);
            let mut sumi = _mm512_setzero_si512();
            for j in 0..4 {
                let p = _mm512_maddubs_epi16(q[j], load64(y.add(Q8K_QS + 64 * j)));
                sumi = madd_acc(sumi, sc[j], p);
            }
            *acc = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(sumi), *acc);
        }

        /// Q4_K / Q5_K scales and mins of the block at `x` (`scales` at `x + 4`): the four
        /// chunk scale vectors and the 8 mins as i16.
        #[inline(always)]
        unsafe fn k4_scales(x: *const u8) -> ([__m512i; 4], __m128i) {
            let u = k4_scales_mins(x.add(4));
            let ms = _mm256_cvtepu8_epi16(_mm_setr_epi32(u[0] as i32, u[1] as i32, u[2] as i32, u[3] as i32));
            let scb = _mm512_broadcast_i32x4(_mm256_castsi256_si128(ms));
            let sc = std::array::from_fn(|j| scale_vec(scb, &SUB32[j / 2][j % 2]));
            (sc, _mm256_extracti128_si256::<1>(ms))
        }

        /// Q4_K row `w` against `T` Q8_K rows. SAFETY: the features; `nb` blocks readable
        /// at `w` and at each `a[t]`.
        #[target_feature(enable = $features)]
        pub(super) unsafe fn q4k<const T: usize>(nb: usize, w: *const u8, a: [*const u8; T]) -> [f32; T] {
            let m4 = _mm512_set1_epi8(0xF);
            let mut acc = [_mm512_setzero_ps(); T];
            let mut acc_m = [_mm_setzero_ps(); T];
            for i in 0..nb {
                let x = w.add(i * 144);
                let (dw, dmw) = (f16_at(x), f16_at(x.add(2)));
                let (sc, mins) = k4_scales(x);
                let q: [__m512i; 4] = std::array::from_fn(|j| _mm512_and_si512(pair_shifted::<4>(load32(x.add(16 + 32 * j))), m4));
                for t in 0..T {
                    k4_token(a[t].add(i * Q8K_BYTES), dw, dmw, mins, &sc, &q, &mut acc[t], &mut acc_m[t]);
                }
            }
            std::array::from_fn(|t| hsum_ps512(acc[t]) + hsum_ps128(acc_m[t]))
        }

        /// Q5_K, as [`q4k`].
        #[target_feature(enable = $features)]
        pub(super) unsafe fn q5k<const T: usize>(nb: usize, w: *const u8, a: [*const u8; T]) -> [f32; T] {
            let m4 = _mm512_set1_epi8(0xF);
            let m16 = _mm512_set1_epi8(0x10);
            let mut acc = [_mm512_setzero_ps(); T];
            let mut acc_m = [_mm_setzero_ps(); T];
            for i in 0..nb {
                let x = w.add(i * 176);
                let (dw, dmw) = (f16_at(x), f16_at(x.add(2)));
                let (sc, mins) = k4_scales(x);
                let mut hb = pair_shifted::<1>(load32(x.add(16)));
                let q: [__m512i; 4] = std::array::from_fn(|j| {
                    let q = _mm512_and_si512(pair_shifted::<4>(load32(x.add(48 + 32 * j))), m4);
                    let q = _mm512_or_si512(q, _mm512_and_si512(_mm512_slli_epi16::<4>(hb), m16));
                    hb = _mm512_srli_epi16::<2>(hb);
                    q
                });
                for t in 0..T {
                    k4_token(a[t].add(i * Q8K_BYTES), dw, dmw, mins, &sc, &q, &mut acc[t], &mut acc_m[t]);
                }
            }
            std::array::from_fn(|t| hsum_ps512(acc[t]) + hsum_ps128(acc_m[t]))
        }

        /// Q6_K, as [`q4k`] (the -32 through `bsums`).
        #[target_feature(enable = $features)]
        pub(super) unsafe fn q6k<const T: usize>(nb: usize, w: *const u8, a: [*const u8; T]) -> [f32; T] {
            let m3 = _mm512_set1_epi8(3);
            let m15 = _mm512_set1_epi8(15);
            let mut acc = [_mm512_setzero_ps(); T];
            for i in 0..nb {
                let x = w.add(i * 210);
                let dw = f16_at(x.add(208));
                let sc16 = _mm256_cvtepi8_epi16(load16(x.add(192)));
                let scb = [
                    _mm512_broadcast_i32x4(_mm256_castsi256_si128(sc16)),
                    _mm512_broadcast_i32x4(_mm256_extracti128_si256::<1>(sc16)),
                ];
                let sc: [__m512i; 4] = std::array::from_fn(|k| scale_vec(scb[k / 2], &SUB16[k % 2]));
                let q: [__m512i; 4] = std::array::from_fn(|k| {
                    let h = k / 2;
                    let ql = load64(x.add(64 * h));
                    let h01 = pair_shifted::<2>(load32(x.add(128 + 32 * h)));
                    if k % 2 == 0 {
                        _mm512_or_si512(_mm512_and_si512(ql, m15), _mm512_slli_epi16::<4>(_mm512_and_si512(h01, m3)))
                    } else {
                        let h23 = _mm512_srli_epi16::<4>(h01);
                        _mm512_or_si512(
                            _mm512_and_si512(_mm512_srli_epi16::<4>(ql), m15),
                            _mm512_slli_epi16::<4>(_mm512_and_si512(h23, m3)),
                        )
                    }
                });
                for t in 0..T {
                    let y = a[t].add(i * Q8K_BYTES);
                    let d = f32_at(y) * dw;
                    let off = _mm256_slli_epi32::<5>(_mm256_madd_epi16(sc16, load32(y.add(Q8K_BSUMS))));
                    let mut sumi = _mm512_setzero_si512();
                    for k in 0..4 {
                        let p = _mm512_maddubs_epi16(q[k], load64(y.add(Q8K_QS + 64 * k)));
                        sumi = madd_acc(sumi, sc[k], p);
                    }
                    let sumi = _mm512_sub_epi32(sumi, _mm512_zextsi256_si512(off));
                    acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(sumi), acc[t]);
                }
            }
            std::array::from_fn(|t| hsum_ps512(acc[t]))
        }
    };
}

/// AVX512F/BW/VL.
mod bw {
    kquant_tiles!("avx2,fma,f16c,avx512f,avx512bw,avx512vl", |acc: __m512i, s: __m512i, p: __m512i| {
        _mm512_add_epi32(acc, _mm512_madd_epi16(s, p))
    });
}

/// AVX512F/BW/VL + VNNI (`vpdpwssd`).
mod vnni {
    kquant_tiles!("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni", |acc: __m512i, s: __m512i, p: __m512i| {
        _mm512_dpwssd_epi32(acc, s, p)
    });
}
