//! AVX2 activation quantizers producing the same bytes as the `quarrel-quant` reference
//! (`quantize_row_q8_0/q8_1/q8_K_ref`) for finite inputs, and a ggml-x86-build flavour of
//! Q8_0 / Q8_1 (`id = 127 / amax`, round half to even: the bytes of
//! `crate::actquant::quantize_row`).
//!
//! Rounding: Q8_0 / Q8_1 use C `roundf` (half away from zero), reproduced as
//! `t = trunc(x); t += copysign(1, x) if |x - t| >= 0.5` (`x - t` is exact); Q8_K uses ggml's
//! `nearest_int` (half to even), i.e. `vroundps` in nearest mode. The scale arithmetic
//! (`amax / 127`, `1 / d`, `-127 / max`, `1 / iscale`) is done in scalar f32 exactly as in
//! the reference, and the max search keeps the reference's tie rule (Q8_K takes the sign of
//! the first element of largest magnitude). NaN / infinite inputs give unspecified bytes.

use super::*;

/// The AVX2 quantizer of `ty`: for Q8_0 / Q8_1 the reference flavour, or with `GGML_X86`
/// the flavour of ggml's x86 build (`id = 127 / amax`, ties to even); Q8_K is the reference
/// one either way (ggml's x86 build uses the reference for it too).
pub(super) fn quantize_row_fn<const GGML_X86: bool>(ty: QuantType) -> Option<QuantizeRowFn> {
    // SAFETY (all arms): only reached at `Level::Avx2` or above.
    Some(match ty {
        QuantType::Q8_0 => |x, y| unsafe { quantize_q8::<GGML_X86, false>(x, y) },
        QuantType::Q8_1 => |x, y| unsafe { quantize_q8::<GGML_X86, true>(x, y) },
        QuantType::Q8_K => |x, y| unsafe { quantize_q8_k(x, y) },
        _ => return None,
    })
}

#[track_caller]
fn check_geometry(what: &str, qk: usize, bs: usize, n: usize, bytes: usize) {
    assert!(
        n.is_multiple_of(qk) && n / qk * bs == bytes,
        "{what}: {n} elements need a multiple of {qk} elements and {} bytes, got {bytes} bytes",
        n / qk * bs
    );
}

/// |x| of 8 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn abs_ps(x: __m256) -> __m256 {
    _mm256_andnot_ps(_mm256_set1_ps(-0.0), x)
}

/// Max of 8 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hmax_ps(v: __m256) -> f32 {
    let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let m = _mm_max_ss(m, _mm_movehdup_ps(m));
    _mm_cvtss_f32(m)
}

/// C `roundf` of 8 lanes (half away from zero), as i32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn round_away_epi32(x: __m256) -> __m256i {
    let t = _mm256_round_ps(x, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    let frac = abs_ps(_mm256_sub_ps(x, t));
    let ge = _mm256_cmp_ps(frac, _mm256_set1_ps(0.5), _CMP_GE_OQ);
    // copysign(1, x) where |frac| >= 0.5, else 0
    let one = _mm256_or_ps(_mm256_set1_ps(1.0), _mm256_and_ps(x, _mm256_set1_ps(-0.0)));
    _mm256_cvttps_epi32(_mm256_add_ps(t, _mm256_and_ps(ge, one)))
}

/// Pack 4 x 8 i32 (each within i8 range) into 32 bytes in element order.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn pack_i32x32(q: [__m256i; 4]) -> __m256i {
    let ab = _mm256_packs_epi32(q[0], q[1]);
    let cd = _mm256_packs_epi32(q[2], q[3]);
    let v = _mm256_packs_epi16(ab, cd);
    // packs interleave the 128-bit lanes: restore element order
    _mm256_permutevar8x32_epi32(v, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
}

/// Round `d` to f16 (nearest even) and store it little-endian at `p`.
/// SAFETY: `p..p+2` writable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn store_f16(p: *mut u8, d: f32) {
    let h = _mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_set_ss(d));
    std::ptr::write_unaligned(p as *mut u16, _mm_extract_epi16(h, 0) as u16);
}

/// One 32-element block of Q8_0/Q8_1: returns `(d, quants as i32 x 4 vectors)`.
/// `GGML_X86 = false`: the reference (`id = 1 / d`, `roundf`); `true`: ggml's x86 build
/// (`id = 127 / amax`, round half to even).
/// SAFETY: `x..x+32` readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block32<const GGML_X86: bool>(x: *const f32) -> (f32, [__m256i; 4]) {
    let v = [_mm256_loadu_ps(x), _mm256_loadu_ps(x.add(8)), _mm256_loadu_ps(x.add(16)), _mm256_loadu_ps(x.add(24))];
    let m = _mm256_max_ps(_mm256_max_ps(abs_ps(v[0]), abs_ps(v[1])), _mm256_max_ps(abs_ps(v[2]), abs_ps(v[3])));
    let amax = hmax_ps(m);
    let d = amax / 127.0;
    let id = if GGML_X86 {
        _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 })
    } else {
        _mm256_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 })
    };
    let round = |v: __m256| {
        let x = _mm256_mul_ps(v, id);
        if GGML_X86 {
            _mm256_cvtps_epi32(_mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC))
        } else {
            round_away_epi32(x)
        }
    };
    (d, [round(v[0]), round(v[1]), round(v[2]), round(v[3])])
}

/// Q8_0 row, or with `SUM` Q8_1's (Q8_0 plus `s = f16(sum(q) * d)` after `d`); see
/// [`block32`] for `GGML_X86`. SAFETY: AVX2+FMA+F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn quantize_q8<const GGML_X86: bool, const SUM: bool>(src: &[f32], dst: &mut [u8]) {
    let (what, bs) = if SUM { ("q8_1", 36) } else { ("q8_0", 34) };
    check_geometry(what, 32, bs, src.len(), dst.len());
    let (xp, yp) = (src.as_ptr(), dst.as_mut_ptr());
    for i in 0..src.len() / 32 {
        let (d, q) = block32::<GGML_X86>(xp.add(32 * i));
        let y = yp.add(bs * i);
        store_f16(y, d);
        if SUM {
            let s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
            let s = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
            let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
            let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
            store_f16(y.add(2), _mm_cvtsi128_si32(s) as f32 * d);
        }
        _mm256_storeu_si256(y.add(bs - 32) as *mut __m256i, pack_i32x32(q));
    }
}

/// `quantize_row_q8_K_ref`. SAFETY: AVX2+FMA+F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn quantize_q8_k(src: &[f32], dst: &mut [u8]) {
    check_geometry("q8_K", 256, 292, src.len(), dst.len());
    let (xp, yp) = (src.as_ptr(), dst.as_mut_ptr());
    for i in 0..src.len() / 256 {
        let x = xp.add(256 * i);
        let y = yp.add(292 * i);
        // amax over the block; `max_ps(new, acc)` skips NaN lanes like the reference's `>`
        let mut m = _mm256_setzero_ps();
        for k in 0..32 {
            m = _mm256_max_ps(abs_ps(_mm256_loadu_ps(x.add(8 * k))), m);
        }
        let amax = hmax_ps(m);
        if amax == 0.0 {
            std::ptr::write_bytes(y, 0, 292);
            continue;
        }
        // the first element of magnitude amax gives the sign
        let am = _mm256_set1_ps(amax);
        let mut max = amax;
        for k in 0..32 {
            let eq = _mm256_movemask_ps(_mm256_cmp_ps(abs_ps(_mm256_loadu_ps(x.add(8 * k))), am, _CMP_EQ_OQ));
            if eq != 0 {
                max = *x.add(8 * k + eq.trailing_zeros() as usize);
                break;
            }
        }
        let iscale = -127.0 / max;
        let is = _mm256_set1_ps(iscale);
        let c127 = _mm256_set1_epi32(127);
        for g in 0..8 {
            let mut q = [_mm256_setzero_si256(); 4];
            for (k, qk) in q.iter_mut().enumerate() {
                let v = _mm256_mul_ps(is, _mm256_loadu_ps(x.add(32 * g + 8 * k)));
                let r = _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                *qk = _mm256_min_epi32(_mm256_cvttps_epi32(r), c127);
            }
            // bsums of the two 16-element groups
            let s0 = _mm256_add_epi32(q[0], q[1]);
            let s1 = _mm256_add_epi32(q[2], q[3]);
            let h = _mm256_hadd_epi32(s0, s1); // [s0 pairs | s1 pairs] per 128-bit lane
            let h = _mm256_hadd_epi32(h, h);
            let lo = _mm256_castsi256_si128(h);
            let hi = _mm256_extracti128_si256(h, 1);
            let t = _mm_add_epi32(lo, hi); // [sum0, sum1, sum0, sum1]
            let b0 = _mm_cvtsi128_si32(t) as i16;
            let b1 = _mm_extract_epi32(t, 1) as i16;
            std::ptr::write_unaligned(y.add(260 + 4 * g) as *mut i16, b0);
            std::ptr::write_unaligned(y.add(262 + 4 * g) as *mut i16, b1);
            _mm256_storeu_si256(y.add(4 + 32 * g) as *mut __m256i, pack_i32x32(q));
        }
        std::ptr::write_unaligned(y as *mut f32, 1.0 / iscale);
    }
}
