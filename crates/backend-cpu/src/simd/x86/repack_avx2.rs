//! AVX2 twins of `repack.rs` (CPUs without AVX-512 VNNI, or `QUARREL_SIMD=avx2|avx512`):
//! the same 16-row groups, one 8-row half per pass (16 ymm registers), integer block sums
//! through `vpmaddubsw` + `vpmaddwd` (exact: Q4 codes 0..=15; IQ4_NL values through the sign
//! trick, so no `- 128·Σy` correction), then the float operations of the VNNI kernel lane
//! for lane, so the results are bit-identical to it and to `repack::reference_dot`.

use super::super::repack::{ActAux, RepackTy, R, TILE_TOKENS};
use std::arch::x86_64::*;

/// Whether the CPU has what the kernels use.
pub(crate) fn supported() -> bool {
    super::has_avx2()
}

/// As `repack::tile` (checked by the caller: features, buffer lengths, 1..=8 tokens).
///
/// SAFETY: AVX2+FMA+F16C; `group` holds `nb` group blocks, `a[t]`/`x[t]` `nb` blocks /
/// entries for t < n, `out` n rows.
pub(crate) unsafe fn tile(
    ty: RepackTy,
    nb: usize,
    g: *const u8,
    a: &[*const u8; TILE_TOKENS],
    x: &[*const ActAux; TILE_TOKENS],
    n: usize,
    out: *mut [f32; R],
) {
    let mut t0 = 0;
    while t0 < n {
        let k = (n - t0).min(2);
        for half in 0..2 {
            let (a2, x2, o) = (&a[t0..], &x[t0..], out.add(t0));
            match (ty, k) {
                (RepackTy::Q4_0, 1) => half_legacy::<1, false>(nb, g, half, a2, x2, o),
                (RepackTy::Q4_0, _) => half_legacy::<2, false>(nb, g, half, a2, x2, o),
                (RepackTy::IQ4_NL, 1) => half_legacy::<1, true>(nb, g, half, a2, x2, o),
                (RepackTy::IQ4_NL, _) => half_legacy::<2, true>(nb, g, half, a2, x2, o),
                (RepackTy::Q4_K, 1) => half_k::<1>(nb, g, half, a2, x2, o),
                (RepackTy::Q4_K, _) => half_k::<2>(nb, g, half, a2, x2, o),
            }
        }
        t0 += k;
    }
}

/// 32 unsigned codes (each pair's products within i16) times 32 signed activation bytes,
/// summed in groups of 4 into 8 i32 lanes (exact).
#[inline(always)]
unsafe fn dot_u8(w: __m256i, y: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(w, y), _mm256_set1_epi16(1))
}

/// Signed codes (-128..=127) times activations (-127..=127), as [`dot_u8`] (exact).
#[inline(always)]
unsafe fn dot_i8(w: __m256i, y: __m256i) -> __m256i {
    dot_u8(_mm256_sign_epi8(w, w), _mm256_sign_epi8(y, w))
}

/// Rows `8 * half .. 8 * half + 8` of a Q4_0 group, or an IQ4_NL one where `IQ4` (the
/// codebook's signed values through the sign trick, no `- 128·Σy` term).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn half_legacy<const T: usize, const IQ4: bool>(
    nb: usize,
    g: *const u8,
    half: usize,
    a: &[*const u8],
    x: &[*const ActAux],
    out: *mut [f32; R],
) {
    let (codes, ab, aq) = (16 * R, 34usize, 2usize);
    let gb = codes + 2 * R;
    let mask = _mm256_set1_epi8(0x0f);
    let lut = _mm256_broadcastsi128_si256(_mm_loadu_si128(quarrel_quant::nonlinear::KVALUES_IQ4NL.as_ptr() as *const __m128i));
    let mut acc = [_mm256_setzero_ps(); T];
    for b in 0..nb {
        let gp = g.add(b * gb);
        let mut w = [_mm256_setzero_si256(); 8];
        for k in 0..4 {
            let v = _mm256_loadu_si256(gp.add(64 * k + 32 * half) as *const __m256i);
            w[2 * k] = _mm256_and_si256(v, mask);
            w[2 * k + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
            if IQ4 {
                w[2 * k] = _mm256_shuffle_epi8(lut, w[2 * k]);
                w[2 * k + 1] = _mm256_shuffle_epi8(lut, w[2 * k + 1]);
            }
        }
        let dw = _mm256_cvtph_ps(_mm_loadu_si128(gp.add(codes + 16 * half) as *const __m128i));
        for t in 0..T {
            let y = a[t].add(b * ab + aq);
            let xa = &*x[t].add(b);
            // IQ4_NL sums `x·y` directly (no `- 128·Σy` term)
            let mut s = _mm256_set1_epi32(if IQ4 { 0 } else { xa.off });
            for k in 0..8 {
                let yv = _mm256_set1_epi32((y.add(super::repack::ACT_AT[k]) as *const i32).read_unaligned());
                let d = if IQ4 { dot_i8(w[k], yv) } else { dot_u8(w[k], yv) };
                s = _mm256_add_epi32(s, d);
            }
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dw, _mm256_set1_ps(xa.d)), acc[t]);
        }
    }
    for t in 0..T {
        _mm256_storeu_ps((*out.add(t)).as_mut_ptr().add(8 * half), acc[t]);
    }
}

/// Rows `8 * half .. 8 * half + 8` of a Q4_K group (order as `repack::kernel_k`).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn half_k<const T: usize>(nb: usize, g: *const u8, half: usize, a: &[*const u8], x: &[*const ActAux], out: *mut [f32; R]) {
    use super::super::repack_k::{AB, D, DMIN, GROUP_BLOCK, MINS, SCALES};
    let mask = _mm256_set1_epi8(0x0f);
    let mut acc = [_mm256_setzero_ps(); T];
    let mut accm = [_mm256_setzero_ps(); T];
    for b in 0..nb {
        let gp = g.add(b * GROUP_BLOCK);
        let mut isum = [_mm256_setzero_si256(); T];
        for j in 0..8 {
            let (jj, hi) = (j / 2, j % 2 == 1);
            let mut w = [_mm256_setzero_si256(); 8];
            for k in 0..8 {
                let v = _mm256_loadu_si256(gp.add((jj * 8 + k) * 64 + 32 * half) as *const __m256i);
                w[k] = if hi { _mm256_and_si256(_mm256_srli_epi16(v, 4), mask) } else { _mm256_and_si256(v, mask) };
            }
            let sc = _mm256_cvtepu8_epi32(_mm_loadl_epi64(gp.add(SCALES + j * R + 8 * half) as *const __m128i));
            for t in 0..T {
                let y = a[t].add(b * AB + 4 + 32 * j);
                let mut s = _mm256_setzero_si256();
                for k in 0..8 {
                    s = _mm256_add_epi32(s, dot_u8(w[k], _mm256_set1_epi32((y.add(4 * k) as *const i32).read_unaligned())));
                }
                isum[t] = _mm256_add_epi32(isum[t], _mm256_mullo_epi32(s, sc));
            }
        }
        let dw = _mm256_cvtph_ps(_mm_loadu_si128(gp.add(D + 16 * half) as *const __m128i));
        let dmw = _mm256_cvtph_ps(_mm_loadu_si128(gp.add(DMIN + 16 * half) as *const __m128i));
        for t in 0..T {
            let xa = &*x[t].add(b);
            let bs = xa.bs.as_ptr() as *const i32;
            let mut imin = _mm256_setzero_si256();
            for p in 0..4 {
                let m = _mm256_cvtepu8_epi16(_mm_loadu_si128(gp.add(MINS + p * 2 * R + 16 * half) as *const __m128i));
                imin = _mm256_add_epi32(imin, _mm256_madd_epi16(m, _mm256_set1_epi32(bs.add(p).read_unaligned())));
            }
            let da = _mm256_set1_ps(xa.d);
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_mul_ps(dw, da), acc[t]);
            accm[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(imin), _mm256_mul_ps(dmw, da), accm[t]);
        }
    }
    for t in 0..T {
        _mm256_storeu_ps((*out.add(t)).as_mut_ptr().add(8 * half), _mm256_sub_ps(acc[t], accm[t]));
    }
}
