//! F16 GEMM tiles (prompt processing and encoder batches of F16 models): [`GEMM_ROWS`] weight
//! rows x [`GEMM_TOKENS`] tokens, every output with the bits of the one-row kernel
//! (`float::dot_f16_avx512` / `dot_f16_avx2`), so a text's result does not depend on how many
//! tokens share its matmul.
//!
//! The one-row kernel keeps four vector accumulators: accumulator `k` takes vector `k` of every
//! run of four vectors, then the first takes the whole vectors left over; the four are summed
//! `(a0 + a1) + (a2 + a3)` and reduced across lanes (then, on AVX2, a scalar tail). A tile runs
//! the same chains, one accumulator index at a time over a small block of (row, token) pairs, so
//! that the block's accumulators stay in registers, and keeps the four per pair until the final
//! sum. Weight panels are the rows' own bytes (F16, row after row); activation panels are
//! [`GEMM_TOKENS`] rows of f32 widened from the F16 activations (an F16 weight's activations
//! are rounded to F16 first, as ggml's `vec_dot_type` says; widening them once per panel keeps
//! the conversions out of the tiles' inner loops).

use super::*;
use crate::simd::{GEMM_ROWS, GEMM_TOKENS};
use quarrel_quant::fp16_to_f32;

/// Bytes of an activation panel of `n` values per token (a multiple of 64).
pub(crate) fn act_panel_bytes(n: usize) -> usize {
    (GEMM_TOKENS * n * 4).next_multiple_of(64)
}

/// Bytes of a weight panel of `n` values per row (a multiple of 64).
pub(crate) fn weight_panel_bytes(n: usize) -> usize {
    (GEMM_ROWS * n * 2).next_multiple_of(64)
}

/// Up to [`GEMM_TOKENS`] rows of `n` F16 activations into a panel of f32 rows (missing rows
/// zero).
pub(crate) fn pack_act(n: usize, rows: &[&[u8]], panel: &mut [u8]) {
    let rb = n * 4;
    assert!(rows.len() <= GEMM_TOKENS && panel.len() >= GEMM_TOKENS * rb, "f16 activation panel: short buffer");
    for (i, dst) in panel[..GEMM_TOKENS * rb].chunks_exact_mut(rb).enumerate() {
        match rows.get(i) {
            Some(r) => {
                for (d, h) in dst.chunks_exact_mut(4).zip(r[..n * 2].chunks_exact(2)) {
                    d.copy_from_slice(&fp16_to_f32(u16::from_le_bytes([h[0], h[1]])).to_le_bytes());
                }
            }
            None => dst.fill(0),
        }
    }
}

/// Up to `count` rows of `n` F16 values into a panel of `count` rows (missing rows zero).
pub(crate) fn pack(n: usize, rows: &[&[u8]], count: usize, panel: &mut [u8]) {
    let rb = n * 2;
    assert!(rows.len() <= count && panel.len() >= count * rb, "f16 panel: {} rows of {rb} bytes into {}", rows.len(), panel.len());
    for (i, dst) in panel[..count * rb].chunks_exact_mut(rb).enumerate() {
        match rows.get(i) {
            Some(r) => dst.copy_from_slice(&r[..rb]),
            None => dst.fill(0),
        }
    }
}

/// The tile on the detected width (`avx512`: the AVX-512 one-row kernel's order, else AVX2's).
pub(crate) fn tile(avx512: bool, n: usize, w: &[u8], a: &[u8], n_tok: usize, out: &mut [[f32; GEMM_TOKENS]; GEMM_ROWS]) {
    assert!(w.len() >= GEMM_ROWS * n * 2 && a.len() >= GEMM_TOKENS * n * 4 && n_tok <= GEMM_TOKENS, "f16 tile: short panels");
    // SAFETY: the panels hold GEMM_ROWS and GEMM_TOKENS rows of n F16 values (asserted), and
    // `Kind::for_level` hands out the kind only on CPUs with the width's features.
    unsafe {
        if avx512 {
            // as many tokens as there are: a speculative step checks a few
            let (w, a) = (w.as_ptr(), a.as_ptr());
            match n_tok {
                0 => {}
                1 => tile_512::<1>(n, w, a, out),
                2 => tile_512::<2>(n, w, a, out),
                3 => tile_512::<3>(n, w, a, out),
                4 => tile_512::<4>(n, w, a, out),
                5 => tile_512::<5>(n, w, a, out),
                6 => tile_512::<6>(n, w, a, out),
                7 => tile_512::<7>(n, w, a, out),
                _ => tile_512::<GEMM_TOKENS>(n, w, a, out),
            }
        } else {
            tile_256(n, w.as_ptr(), a.as_ptr(), n_tok, out)
        }
    }
}

/// Rows per block of the AVX-512 tile: 2 rows x 8 tokens = 16 accumulators in registers, two
/// weight conversions per 16 multiply-adds.
const ROWS_512: usize = 2;

/// The first `NT` tokens' outputs.
/// SAFETY: AVX-512 F/BW/VL + F16C + FMA; `w` holds GEMM_ROWS rows of `n` F16, `a`
/// GEMM_TOKENS rows of `n` f32; NT <= GEMM_TOKENS.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn tile_512<const NT: usize>(n: usize, w: *const u8, a: *const u8, out: &mut [[f32; GEMM_TOKENS]; GEMM_ROWS]) {
    let (wrb, arb) = (n * 2, n * 4);
    let runs = n / 64;
    let load_w = |p: *const u8, m: __mmask16| _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p as *const i16));
    let load_a = |p: *const u8, m: __mmask16| _mm512_maskz_loadu_ps(m, p as *const f32);
    for r0 in (0..GEMM_ROWS).step_by(ROWS_512) {
        // the four accumulators of every (row, token) of the block
        let mut parts = [[[_mm512_setzero_ps(); NT]; ROWS_512]; 4];
        for (k, part) in parts.iter_mut().enumerate() {
            let mut acc = [[_mm512_setzero_ps(); NT]; ROWS_512];
            for j in 0..runs {
                let i = j * 64 + 16 * k;
                let wv: [__m512; ROWS_512] = std::array::from_fn(|r| load_w(w.add((r0 + r) * wrb + i * 2), 0xFFFF));
                for t in 0..NT {
                    let av = load_a(a.add(t * arb + i * 4), 0xFFFF);
                    for r in 0..ROWS_512 {
                        acc[r][t] = _mm512_fmadd_ps(wv[r], av, acc[r][t]);
                    }
                }
            }
            if k == 0 {
                // whole and partial vectors after the last run go to the first accumulator
                let mut i = runs * 64;
                while i < n {
                    let left = n - i;
                    let m: __mmask16 = if left >= 16 { 0xFFFF } else { (1u16 << left) - 1 };
                    let wv: [__m512; ROWS_512] = std::array::from_fn(|r| load_w(w.add((r0 + r) * wrb + i * 2), m));
                    for t in 0..NT {
                        let av = load_a(a.add(t * arb + i * 4), m);
                        for r in 0..ROWS_512 {
                            acc[r][t] = _mm512_fmadd_ps(wv[r], av, acc[r][t]);
                        }
                    }
                    i += 16;
                }
            }
            *part = acc;
        }
        for r in 0..ROWS_512 {
            for t in 0..NT {
                let s = _mm512_add_ps(_mm512_add_ps(parts[0][r][t], parts[1][r][t]), _mm512_add_ps(parts[2][r][t], parts[3][r][t]));
                out[r0 + r][t] = hsum_ps512(s);
            }
        }
    }
}

/// Tokens per block of the AVX2 tile: 4 rows x 2 tokens = 8 accumulators (16 ymm registers).
const TOK_256: usize = 2;

/// SAFETY: AVX2 + F16C + FMA; `w` holds GEMM_ROWS rows of `n` F16, `a` GEMM_TOKENS rows
/// of `n` f32.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_256(n: usize, w: *const u8, a: *const u8, n_tok: usize, out: &mut [[f32; GEMM_TOKENS]; GEMM_ROWS]) {
    let (rb, arb) = (n * 2, n * 4);
    let runs = n / 32;
    let whole = n / 8 * 8;
    let load = |p: *const u8| _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i));
    let load_a = |p: *const u8| _mm256_loadu_ps(p as *const f32);
    let half = |p: *const u8, i: usize| fp16_to_f32(u16::from_le_bytes([*p.add(2 * i), *p.add(2 * i + 1)]));
    let single = |p: *const u8, i: usize| f32::from_le_bytes([*p.add(4 * i), *p.add(4 * i + 1), *p.add(4 * i + 2), *p.add(4 * i + 3)]);
    for t0 in (0..n_tok).step_by(TOK_256) {
        let mut parts = [[[_mm256_setzero_ps(); TOK_256]; GEMM_ROWS]; 4];
        for (k, part) in parts.iter_mut().enumerate() {
            let mut acc = [[_mm256_setzero_ps(); TOK_256]; GEMM_ROWS];
            for j in 0..runs {
                let off = (j * 32 + 8 * k) * 2;
                let wv: [__m256; GEMM_ROWS] = std::array::from_fn(|r| load(w.add(r * rb + off)));
                let av: [__m256; TOK_256] = std::array::from_fn(|t| load_a(a.add((t0 + t) * arb + off * 2)));
                for r in 0..GEMM_ROWS {
                    for t in 0..TOK_256 {
                        acc[r][t] = _mm256_fmadd_ps(wv[r], av[t], acc[r][t]);
                    }
                }
            }
            if k == 0 {
                let mut i = runs * 32;
                while i < whole {
                    let wv: [__m256; GEMM_ROWS] = std::array::from_fn(|r| load(w.add(r * rb + i * 2)));
                    let av: [__m256; TOK_256] = std::array::from_fn(|t| load_a(a.add((t0 + t) * arb + i * 4)));
                    for r in 0..GEMM_ROWS {
                        for t in 0..TOK_256 {
                            acc[r][t] = _mm256_fmadd_ps(wv[r], av[t], acc[r][t]);
                        }
                    }
                    i += 8;
                }
            }
            *part = acc;
        }
        for r in 0..GEMM_ROWS {
            for t in 0..TOK_256.min(n_tok - t0) {
                let s = _mm256_add_ps(_mm256_add_ps(parts[0][r][t], parts[1][r][t]), _mm256_add_ps(parts[2][r][t], parts[3][r][t]));
                let mut sum = hsum_ps(s);
                // the one-row kernel's scalar tail, in order
                for i in whole..n {
                    sum += half(w.add(r * rb), i) * single(a.add((t0 + t) * arb), i);
                }
                out[r][t0 + t] = sum;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use quarrel_quant::f32_to_fp16;

    fn f16_rows(vals: &[f32]) -> Vec<u8> {
        vals.iter().flat_map(|&v| f32_to_fp16(v).to_le_bytes()).collect()
    }

    /// Every output of a tile equals the one-row kernel's dot of its row and token, bit for bit.
    fn check(avx512: bool, n: usize, n_tok: usize, seed: u64) {
        if !has_avx2() || (avx512 && !has_avx512()) {
            return;
        }
        let mut s = seed | 1;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0
        };
        let w: Vec<f32> = (0..GEMM_ROWS * n).map(|_| next()).collect();
        let x: Vec<f32> = (0..n_tok * n).map(|_| next()).collect();
        let wb = f16_rows(&w);
        let xb = f16_rows(&x);
        let rows: Vec<&[u8]> = xb.chunks(n * 2).collect();
        let mut a_panel = vec![0u8; act_panel_bytes(n)];
        pack_act(n, &rows, &mut a_panel);
        let mut out = [[f32::NAN; GEMM_TOKENS]; GEMM_ROWS];
        tile(avx512, n, &wb, &a_panel, n_tok, &mut out);
        for r in 0..GEMM_ROWS {
            for t in 0..n_tok {
                let (wr, ar) = (&wb[r * n * 2..(r + 1) * n * 2], &xb[t * n * 2..(t + 1) * n * 2]);
                // SAFETY: the features were checked above.
                let want = unsafe {
                    if avx512 {
                        super::super::float::dot_f16_avx512(n, wr, ar)
                    } else {
                        super::super::float::dot_f16_avx2(n, wr, ar)
                    }
                };
                assert_eq!(out[r][t].to_bits(), want.to_bits(), "n {n} row {r} token {t}: {} vs {want}", out[r][t]);
            }
            for t in n_tok..GEMM_TOKENS {
                assert!(out[r][t].is_nan(), "entry beyond n_tok written");
            }
        }
    }

    #[test]
    fn tiles_have_the_one_row_kernels_bits_at_model_widths() {
        for n in [64, 768, 3072, 2048 + 16, 100, 7, 1] {
            for n_tok in [1, 3, 4, 5, 8] {
                check(true, n, n_tok, n as u64 * 31 + n_tok as u64);
                check(false, n, n_tok, n as u64 * 17 + n_tok as u64);
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn tiles_have_the_one_row_kernels_bits(n in 1usize..300, n_tok in 1usize..=GEMM_TOKENS, seed in any::<u64>()) {
            check(true, n, n_tok, seed);
            check(false, n, n_tok, seed);
        }
    }
}
