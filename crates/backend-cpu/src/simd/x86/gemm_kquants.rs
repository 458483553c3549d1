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
//!
//! Q6_K runs a whole tile per call (`q6k_tile`): chunks of 8 super-blocks, every row over
//! the chunk for all tokens (the chunk's activations stay in L1 across the rows), 4-code
//! dots (`vpdpbusd`) of two 64-code chunks packed to i16 pairs for one `vpdpwssd` with the
//! scales; its activation panels hold the codes interleaved to match, then each token's
//! `d_a` per block. The lane integers and float steps are the one-row kernel's.

use super::avx512_kquants::{load16, load32, load64, pair_shifted, scale_vec, SUB32};
use super::kquants::{k4_scales_mins, Q8K_BSUMS, Q8K_BYTES, Q8K_QS, QK_K};
use super::{f16_at, hsum_ps128, hsum_ps512};
use crate::simd::{GEMM_ROWS as ROWS, GEMM_TOKENS as TOKENS};
use std::arch::x86_64::*;

/// Per super-block auxiliary data of an activation panel (Q4_K, Q5_K): the pair-summed
/// `bsums` of token quads (`AUX_Q8S`: two quads of 4 x 8 i16), their `-d_a` repeated 4 times
/// (`AUX_NYD`: two quads of 16 f32), and every token's `d_a` (`AUX_YD`: 8 f32).
const AUX_BLOCK: usize = 320;
const AUX_Q8S: usize = 0;
const AUX_NYD: usize = 128;
const AUX_YD: usize = 256;
const _: () = assert!(TOKENS == 8);

/// Super-blocks per chunk of the Q6_K tile: 8 tokens x 8 blocks of Q8_K (18.7 KB) stay in L1
/// while the tile's rows go over them.
const Q6K_CHUNK: usize = 8;

/// Per super-block auxiliary data of a Q6_K activation panel: every token's `d_a` (8 f32).
const Q6K_AUX_BLOCK: usize = 32;

/// Bytes of the token rows of an activation panel (a multiple of 64).
fn rows_bytes(n_in: usize) -> usize {
    (n_in / QK_K * Q8K_BYTES * TOKENS).next_multiple_of(64)
}

/// `$run!(T)` with `T` the token count `$left` capped at 8, as a literal: the kernels take
/// their token count as a const parameter.
macro_rules! by_token_count {
    ($left:expr, $run:ident) => {
        match $left {
            8.. => $run!(8),
            7 => $run!(7),
            6 => $run!(6),
            5 => $run!(5),
            4 => $run!(4),
            3 => $run!(3),
            2 => $run!(2),
            _ => $run!(1),
        }
    };
}

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
        rows_bytes(n_in) + n_in / QK_K * if self.has_mins() { AUX_BLOCK } else { Q6K_AUX_BLOCK }
    }

    /// Q4_K and Q5_K (the types with `mins`, whose activation panels carry [`AUX_BLOCK`]s).
    fn has_mins(self) -> bool {
        matches!(self, Ty::Q4K | Ty::Q5K)
    }

    pub(crate) fn weight_panel_bytes(self, n_in: usize) -> usize {
        (n_in / QK_K * self.block_bytes() * ROWS).next_multiple_of(64)
    }

    /// The token rows one after another, then (Q4_K, Q5_K) per super-block an [`AUX_BLOCK`]:
    /// what every weight row's `mins` step needs of the tokens, computed once per panel.
    pub(crate) fn pack_act(self, n_in: usize, rows: &[&[u8]], panel: &mut [u8]) {
        let nb = n_in / QK_K;
        copy_rows(nb * Q8K_BYTES, TOKENS, rows, panel);
        if self.has_mins() {
            let aux = &mut panel[rows_bytes(n_in)..rows_bytes(n_in) + nb * AUX_BLOCK];
            aux.fill(0);
            for (t, row) in rows.iter().enumerate() {
                for (i, blk) in aux.chunks_exact_mut(AUX_BLOCK).enumerate() {
                    let y = &row[i * Q8K_BYTES..(i + 1) * Q8K_BYTES];
                    let yd = f32::from_le_bytes([y[0], y[1], y[2], y[3]]);
                    let (g, l) = (t / 4, t % 4);
                    // Q8_K `bsums` summed in pairs (`_mm_hadd_epi16`'s wrapping i16 adds)
                    for j in 0..8 {
                        let b = |k: usize| i16::from_le_bytes([y[Q8K_BSUMS + 2 * k], y[Q8K_BSUMS + 2 * k + 1]]);
                        let o = AUX_Q8S + g * 64 + (l * 8 + j) * 2;
                        blk[o..o + 2].copy_from_slice(&b(2 * j).wrapping_add(b(2 * j + 1)).to_le_bytes());
                    }
                    for k in 0..4 {
                        let o = AUX_NYD + g * 64 + (l * 4 + k) * 4;
                        blk[o..o + 4].copy_from_slice(&(-yd).to_le_bytes());
                    }
                    let o = AUX_YD + t * 4;
                    blk[o..o + 4].copy_from_slice(&yd.to_le_bytes());
                }
            }
        } else {
            // Q6_K: the codes of each chunk pair (0-1, 2-3) interleaved by 4-byte groups as
            // the tile's `unpacklo/hi_epi32` of the weight codes (see `q6k_run`)
            for t in 0..rows.len() {
                for i in 0..nb {
                    let qs = &mut panel[t * nb * Q8K_BYTES + i * Q8K_BYTES + Q8K_QS..][..QK_K];
                    let orig: [u8; QK_K] = qs[..QK_K].try_into().unwrap();
                    for p in 0..2 {
                        let (a, b) = (&orig[128 * p..128 * p + 64], &orig[128 * p + 64..128 * p + 128]);
                        for h in 0..2 {
                            for l in 0..4 {
                                for j in 0..4 {
                                    let (src, g) = (if j % 2 == 0 { a } else { b }, 4 * l + 2 * h + j / 2);
                                    let o = 128 * p + 64 * h + 16 * l + 4 * j;
                                    qs[o..o + 4].copy_from_slice(&src[4 * g..4 * g + 4]);
                                }
                            }
                        }
                    }
                }
            }
            // Q6_K: every token's `d_a` per super-block (zeros for missing tokens)
            let aux = &mut panel[rows_bytes(n_in)..rows_bytes(n_in) + nb * Q6K_AUX_BLOCK];
            aux.fill(0);
            for (t, row) in rows.iter().enumerate() {
                for (i, blk) in aux.chunks_exact_mut(Q6K_AUX_BLOCK).enumerate() {
                    let y = &row[i * Q8K_BYTES..];
                    blk[t * 4..t * 4 + 4].copy_from_slice(&y[..4]);
                }
            }
        }
    }

    pub(crate) fn pack_weights(self, n_in: usize, rows: &[&[u8]], panel: &mut [u8]) {
        copy_rows(n_in / QK_K * self.block_bytes(), ROWS, rows, panel);
    }

    /// See `gemm::Kind::tile`. `vnni`: use `vpdpwssd` (the CPU must have AVX512-VNNI).
    pub(crate) fn tile(self, vnni: bool, n_in: usize, w: &[u8], a: &[u8], n_tok: usize, out: &mut [[f32; TOKENS]; ROWS]) {
        let (nb, wrb, arb) = (n_in / QK_K, n_in / QK_K * self.block_bytes(), n_in / QK_K * Q8K_BYTES);
        assert!(super::has_avx2() && super::has_avx512() && (!vnni || super::has_avx512vnni()));
        assert!(
            n_in.is_multiple_of(QK_K) && w.len() >= ROWS * wrb && (1..=TOKENS).contains(&n_tok) && a.len() >= self.act_panel_bytes(n_in)
        );
        if self == Ty::Q6K {
            // SAFETY: the features (asserted above); `ROWS` rows of `nb` blocks at `w`, the
            // token rows `0..n_tok` of `nb` blocks each at `a` (lengths asserted above).
            unsafe {
                if vnni {
                    vnni::q6k_tile(nb, w.as_ptr(), wrb, a.as_ptr(), arb, a[rows_bytes(n_in)..].as_ptr(), n_tok, out)
                } else {
                    bw::q6k_tile(nb, w.as_ptr(), wrb, a.as_ptr(), arb, a[rows_bytes(n_in)..].as_ptr(), n_tok, out)
                }
            }
            return;
        }
        let aux = a[rows_bytes(n_in)..].as_ptr();
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
                                (Ty::Q4K, false) => bw::k4::<$T, false>(nb, wr, std::array::from_fn(ap), aux),
                                (Ty::Q5K, false) => bw::k4::<$T, true>(nb, wr, std::array::from_fn(ap), aux),
                                (Ty::Q4K, true) => vnni::k4::<$T, false>(nb, wr, std::array::from_fn(ap), aux),
                                (Ty::Q5K, true) => vnni::k4::<$T, true>(nb, wr, std::array::from_fn(ap), aux),
                                (Ty::Q6K, _) => unreachable!(),
                            };
                            o[t0..t0 + $T].copy_from_slice(&v);
                            $T
                        }};
                    }
                    by_token_count!(n_tok - t0, run)
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
    ($features:literal, $madd_acc:expr, $dot4:expr) => {
        use super::*;

        /// Per i32 lane: the dot of its 4 unsigned codes `q` (0..=63) with 4 signed bytes `y`.
        #[inline]
        #[target_feature(enable = $features)]
        fn dot4(q: __m512i, y: __m512i) -> __m512i {
            ($dot4)(q, y)
        }

        #[inline]
        #[target_feature(enable = $features)]
        fn madd_acc(acc: __m512i, s: __m512i, p: __m512i) -> __m512i {
            ($madd_acc)(acc, s, p)
        }

        /// The code/scale dot of one token (4 chunks of 64): `acc = fma(d_a * d_w, sumi, acc)`.
        #[inline(always)]
        unsafe fn k4_token(y: *const u8, yd: *const f32, dwv: __m512, sc: &[__m512i; 4], q: &[__m512i; 4], acc: &mut __m512) {
            let d = _mm512_mul_ps(_mm512_set1_ps(*yd), dwv);
            let mut sumi = _mm512_setzero_si512();
            for j in 0..4 {
                let p = _mm512_maddubs_epi16(q[j], load64(y.add(Q8K_QS + 64 * j)));
                sumi = madd_acc(sumi, sc[j], p);
            }
            *acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sumi), *acc);
        }

        /// Q4_K/Q5_K's `acc_m` step for the `T` tokens of super-block `i` (4 tokens per
        /// register, each in its own 128-bit lane: `acc_m = fma(-d_a * dmin_w, mins · q8s, acc_m)`
        /// lane for lane as the one-row kernel's 4-lane accumulator).
        #[inline(always)]
        unsafe fn k4_mins<const Q: usize>(aux: *const u8, i: usize, dmwv: __m512, mins: __m128i, acc_m: &mut [__m512; Q]) {
            let b = aux.add(i * AUX_BLOCK);
            let m4 = _mm512_broadcast_i32x4(mins);
            for g in 0..Q {
                let prod = _mm512_madd_epi16(m4, load64(b.add(AUX_Q8S + 64 * g)));
                let dmin = _mm512_mul_ps(_mm512_loadu_ps(b.add(AUX_NYD + 64 * g) as *const f32), dmwv);
                acc_m[g] = _mm512_fmadd_ps(dmin, _mm512_cvtepi32_ps(prod), acc_m[g]);
            }
        }

        /// `hsum_ps512(acc[t]) + hsum_ps128(token t's lane of acc_m)` for every token.
        #[inline(always)]
        unsafe fn k4_finish<const T: usize, const Q: usize>(acc: &[__m512; T], acc_m: &[__m512; Q]) -> [f32; T] {
            let mut m = [[0f32; 16]; 2];
            for g in 0..Q {
                _mm512_storeu_ps(m[g].as_mut_ptr(), acc_m[g]);
            }
            std::array::from_fn(|t| {
                let l = &m[t / 4][(t % 4) * 4..];
                hsum_ps512(acc[t]) + hsum_ps128(_mm_loadu_ps(l.as_ptr()))
            })
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

        /// Q4_K (`Q5` false) or Q5_K (`Q5` true) row `w` against `T` Q8_K rows and their
        /// panel's aux blocks. SAFETY: the features; `nb` blocks readable at `w` and at each
        /// `a[t]`, `nb` aux blocks at `aux`.
        #[target_feature(enable = $features)]
        pub(super) unsafe fn k4<const T: usize, const Q5: bool>(nb: usize, w: *const u8, a: [*const u8; T], aux: *const u8) -> [f32; T] {
            match T {
                1..=4 => k4_q::<T, 1, Q5>(nb, w, a, aux),
                _ => k4_q::<T, 2, Q5>(nb, w, a, aux),
            }
        }

        #[inline(always)]
        unsafe fn k4_q<const T: usize, const Q: usize, const Q5: bool>(
            nb: usize,
            w: *const u8,
            a: [*const u8; T],
            aux: *const u8,
        ) -> [f32; T] {
            // Q5_K blocks: d, dmin, scales, qh (32 bytes), then the nibbles as Q4_K's
            let (block, nibbles) = if Q5 { (176, 48) } else { (144, 16) };
            let m4 = _mm512_set1_epi8(0xF);
            let m16 = _mm512_set1_epi8(0x10);
            let mut acc = [_mm512_setzero_ps(); T];
            let mut acc_m = [_mm512_setzero_ps(); Q];
            for i in 0..nb {
                let x = w.add(i * block);
                let (dwv, dmwv) = (_mm512_set1_ps(f16_at(x)), _mm512_set1_ps(f16_at(x.add(2))));
                let (sc, mins) = k4_scales(x);
                // Q5_K: the low half of chunk j takes bit 2j of qh[l], the high half bit 2j + 1
                let mut hb = if Q5 { pair_shifted::<1>(load32(x.add(16))) } else { _mm512_setzero_si512() };
                let q: [__m512i; 4] = std::array::from_fn(|j| {
                    let q = _mm512_and_si512(pair_shifted::<4>(load32(x.add(nibbles + 32 * j))), m4);
                    if !Q5 {
                        return q;
                    }
                    let q = _mm512_or_si512(q, _mm512_and_si512(_mm512_slli_epi16::<4>(hb), m16));
                    hb = _mm512_srli_epi16::<2>(hb);
                    q
                });
                k4_mins::<Q>(aux, i, dmwv, mins, &mut acc_m);
                let yd = aux.add(i * AUX_BLOCK + AUX_YD) as *const f32;
                for t in 0..T {
                    k4_token(a[t].add(i * Q8K_BYTES), yd.add(t), dwv, &sc, &q, &mut acc[t]);
                }
            }
            k4_finish::<T, Q>(&acc, &acc_m)
        }

        /// Q6_K: a whole tile (`ROWS` rows at `w`, `wrb` bytes apart, against tokens
        /// `0..n_tok` at `a`, `arb` bytes apart), in chunks of [`Q6K_CHUNK`] super-blocks:
        /// per chunk every row runs over the chunk's blocks for all tokens (the chunk's token
        /// rows stay in L1 across the rows; each row's blocks are unpacked once per 8
        /// tokens), its accumulators kept between chunks. Each output's float steps are the
        /// one-row kernel's, in the same order (one fma per super-block, then `hsum_ps512`).
        /// SAFETY: the features; the rows and token rows hold `nb` blocks each.
        #[target_feature(enable = $features)]
        #[allow(clippy::too_many_arguments)] // one tile's pointers and strides, as the callers hold them
        pub(super) unsafe fn q6k_tile(
            nb: usize,
            w: *const u8,
            wrb: usize,
            a: *const u8,
            arb: usize,
            aux: *const u8,
            n_tok: usize,
            out: &mut [[f32; TOKENS]; ROWS],
        ) {
            let mut acc = [[_mm512_setzero_ps(); TOKENS]; ROWS];
            let mut i0 = 0;
            while i0 < nb {
                let i1 = (i0 + Q6K_CHUNK).min(nb);
                for (r, accr) in acc.iter_mut().enumerate() {
                    let wr = w.add(r * wrb);
                    let mut t0 = 0;
                    while t0 < n_tok {
                        let ap = |t: usize| a.add((t0 + t) * arb);
                        macro_rules! run {
                            ($T:literal) => {{
                                let accs: &mut [__m512; $T] = (&mut accr[t0..t0 + $T]).try_into().unwrap();
                                q6k_run::<$T>(i0, i1, wr, std::array::from_fn(ap), aux.add(t0 * 4), accs);
                                $T
                            }};
                        }
                        t0 += by_token_count!(n_tok - t0, run);
                    }
                }
                i0 = i1;
            }
            for (o, accr) in out.iter_mut().zip(&acc) {
                for t in 0..n_tok {
                    o[t] = hsum_ps512(accr[t]);
                }
            }
        }

        /// Blocks `i0..i1` of Q6_K row `w` against `T` Q8_K rows, into `accs` (`acc = fma(d_a
        /// * d_w, sumi, acc)` per block; `sumi` the one-row kernel's lane integers, its
        /// `-32 * (sc · bsums)` term folded in as a first `madd` with `-32 * sc`).
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn q6k_run<const T: usize>(i0: usize, i1: usize, w: *const u8, a: [*const u8; T], yd: *const u8, accs: &mut [__m512; T]) {
            let m3 = _mm512_set1_epi8(3);
            let m15 = _mm512_set1_epi8(15);
            let mut acc = *accs;
            for i in i0..i1 {
                let x = w.add(i * 210);
                // d_a * d_w of the T tokens (tokens past the panel's: zeros), as the one-row
                // kernel's scalar products (same bits)
                let mut dv = [0f32; 8];
                _mm256_storeu_ps(
                    dv.as_mut_ptr(),
                    _mm256_mul_ps(_mm256_loadu_ps(yd.add(i * Q6K_AUX_BLOCK) as *const f32), _mm256_set1_ps(f16_at(x.add(208)))),
                );
                let sc16 = _mm256_cvtepi8_epi16(load16(x.add(192)));
                // -32 * sc: |sc| <= 128, so it fits i16
                let scm = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16::<5>(sc16));
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
                // chunk pairs (0, 1), (2, 3): 4-code groups interleaved (`A` = groups 4L, 4L + 1
                // of each 128-bit lane L, `B` = 4L + 2, 4L + 3, chunk `ka` / `kb` alternating;
                // the panel's codes alike), so that `packs_epi32` of their 4-code dots puts
                // (D(ka, l), D(kb, l)) in output lane l's i16 pair; the scales (sc[4ka + L],
                // sc[4kb + L]) to match. |D| <= 4 * 63 * 128 fits i16: the same lane integers.
                let qa: [__m512i; 2] = std::array::from_fn(|p| _mm512_unpacklo_epi32(q[2 * p], q[2 * p + 1]));
                let qb: [__m512i; 2] = std::array::from_fn(|p| _mm512_unpackhi_epi32(q[2 * p], q[2 * p + 1]));
                let lidx = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
                let sp: [__m512i; 2] = std::array::from_fn(|p| {
                    let s8 = if p == 0 { _mm256_castsi256_si128(sc16) } else { _mm256_extracti128_si256::<1>(sc16) };
                    let pairs = _mm_unpacklo_epi16(s8, _mm_srli_si128::<8>(s8));
                    _mm512_permutexvar_epi32(lidx, _mm512_castsi128_si512(pairs))
                });
                for t in 0..T {
                    let y = a[t].add(i * Q8K_BYTES);
                    let d = _mm512_set1_ps(dv[t]);
                    // lanes 0..7: -32 * (sc[2l] * bsums[2l] + sc[2l + 1] * bsums[2l + 1]); 8..15: 0
                    // (two chains, chunks 0-1 and 2-3: the same lane integers)
                    let mut sumi = _mm512_zextsi256_si512(_mm256_madd_epi16(scm, load32(y.add(Q8K_BSUMS))));
                    let mut sumi2 = _mm512_setzero_si512();
                    for p in 0..2 {
                        let da = dot4(qa[p], load64(y.add(Q8K_QS + 128 * p)));
                        let db = dot4(qb[p], load64(y.add(Q8K_QS + 128 * p + 64)));
                        let v = _mm512_packs_epi32(da, db);
                        if p == 0 {
                            sumi = madd_acc(sumi, sp[p], v);
                        } else {
                            sumi2 = madd_acc(sumi2, sp[p], v);
                        }
                    }
                    let sumi = _mm512_add_epi32(sumi, sumi2);
                    acc[t] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sumi), acc[t]);
                }
            }
            *accs = acc;
        }
    };
}

/// AVX512F/BW/VL.
mod bw {
    kquant_tiles!(
        "avx2,fma,f16c,avx512f,avx512bw,avx512vl",
        |acc: __m512i, s: __m512i, p: __m512i| { _mm512_add_epi32(acc, _mm512_madd_epi16(s, p)) },
        |q: __m512i, y: __m512i| {
            // no saturation: 2 * 63 * 128 < 32768
            _mm512_madd_epi16(_mm512_maddubs_epi16(q, y), _mm512_set1_epi16(1))
        }
    );
}

/// AVX512F/BW/VL + VNNI (`vpdpwssd`).
mod vnni {
    kquant_tiles!(
        "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
        |acc: __m512i, s: __m512i, p: __m512i| {
            // `vpdpwssd` kept as one instruction: LLVM otherwise splits the kernels' accumulation
            // chains into `vpmaddwd` + `vpaddd` (the same integers, one more uop per 64 codes)
            let mut acc = acc;
            // SAFETY: register-only instruction; the kernels using it run with AVX512-VNNI
            // enabled and detected.
            unsafe {
                std::arch::asm!("vpdpwssd {acc}, {s}, {p}", acc = inout(zmm_reg) acc, s = in(zmm_reg) s, p = in(zmm_reg) p,
                options(pure, nomem, nostack, preserves_flags));
            }
            acc
        },
        |q: __m512i, y: __m512i| {
            let mut acc = _mm512_setzero_si512();
            // SAFETY: as above (`vpdpbusd`: unsigned `q` times signed `y`, 4 per lane, exact)
            unsafe {
                std::arch::asm!("vpdpbusd {acc}, {q}, {y}", acc = inout(zmm_reg) acc, q = in(zmm_reg) q, y = in(zmm_reg) y,
                options(pure, nomem, nostack, preserves_flags));
            }
            acc
        }
    );
}
