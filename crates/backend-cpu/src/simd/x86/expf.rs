//! `expf` for 16 lanes at once (AVX-512), bit-identical to the C library's scalar `expf`
//! that llama.cpp's attention calls (and that `f32::exp` reaches), so that batching the
//! softmax exponentials keeps llama.cpp's bits.
//!
//! glibc (2.28 on) computes `expf` with the algorithm of ARM's optimized-routines, in
//! double: `k = round(x·32/ln2)`, `r = x·32/ln2 - k`, `2^(k/32) = T[k % 32] · 2^(k / 32)`,
//! a degree-3 polynomial in `r`, one rounding to float at the end. Its FMA build (what glibc
//! picks on every CPU with AVX2+FMA, where these kernels run) contracts exactly these steps
//! (read off `__expf_fma`'s code):
//!
//! ```text
//! kd = fma(InvLn2N, x, Shift)      ki = bits(kd)       kd -= Shift
//! r  = fma(InvLn2N, x, -kd)        s  = T[ki & 31] + (ki << 47)
//! z  = fma(r, C0, C1)   r2 = r·r   y = fma(r, C2, 1)   y = fma(z, r2, y)   y = y·s
//! result = (float) y
//! ```
//!
//! Inputs outside the main range (|x| >= 88, infinities, NaN) take the scalar `expf` lane by
//! lane. Whether a process's C library really computes this is checked once at run time
//! ([`matches_libm`]: a probe set compared bit for bit); where it does not, callers use the
//! scalar function.

use std::arch::x86_64::*;

/// glibc's `__exp2f_data.tab`: `bits(2^(i/32)) - (i << 47)`.
const TAB: [u64; 32] = [
    0x3ff0000000000000,
    0x3fefd9b0d3158574,
    0x3fefb5586cf9890f,
    0x3fef9301d0125b51,
    0x3fef72b83c7d517b,
    0x3fef54873168b9aa,
    0x3fef387a6e756238,
    0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715,
    0x3feef1a7373aa9cb,
    0x3feedea64c123422,
    0x3feece086061892d,
    0x3feebfdad5362a27,
    0x3feeb42b569d4f82,
    0x3feeab07dd485429,
    0x3feea47eb03a5585,
    0x3feea09e667f3bcd,
    0x3fee9f75e8ec5f74,
    0x3feea11473eb0187,
    0x3feea589994cce13,
    0x3feeace5422aa0db,
    0x3feeb737b0cdc5e5,
    0x3feec49182a3f090,
    0x3feed503b23e255d,
    0x3feee89f995ad3ad,
    0x3feeff76f2fb5e47,
    0x3fef199bdd85529c,
    0x3fef3720dcef9069,
    0x3fef5818dcfba487,
    0x3fef7c97337b9b5f,
    0x3fefa4afa2a490da,
    0x3fefd0765b6e4540,
];
/// `32 / ln 2`.
const INV_LN2_N: u64 = 0x40471547652b82fe;
/// `0x1.8p52`: adding it rounds to an integer.
const SHIFT: u64 = 0x4338000000000000;
/// The polynomial, scaled for `r` in units of 1/32.
const C0: u64 = 0x3ebc6af84b912394;
const C1: u64 = 0x3f2ebfce50fac4f3;
const C2: u64 = 0x3f962e42ff0c52d6;
/// `abstop12(x)` above this takes the scalar path (`abstop12(88.0) = 0x42b`).
const TOP_LIMIT: u32 = 0x42a;

/// 8 lanes of the main path (`x` already known to be in range).
#[inline(always)]
unsafe fn main8(x: __m256, tab: &[__m512i; 4]) -> __m256 {
    let xd = _mm512_cvtps_pd(x);
    let kd = _mm512_fmadd_pd(_mm512_set1_pd(f64::from_bits(INV_LN2_N)), xd, _mm512_set1_pd(f64::from_bits(SHIFT)));
    let ki = _mm512_castpd_si512(kd);
    let kd = _mm512_sub_pd(kd, _mm512_set1_pd(f64::from_bits(SHIFT)));
    let r = _mm512_fmsub_pd(_mm512_set1_pd(f64::from_bits(INV_LN2_N)), xd, kd);
    let lo = _mm512_permutex2var_epi64(tab[0], ki, tab[1]);
    let hi = _mm512_permutex2var_epi64(tab[2], ki, tab[3]);
    let t = _mm512_mask_blend_epi64(_mm512_test_epi64_mask(ki, _mm512_set1_epi64(16)), lo, hi);
    let s = _mm512_castsi512_pd(_mm512_add_epi64(t, _mm512_slli_epi64::<47>(ki)));
    let z = _mm512_fmadd_pd(r, _mm512_set1_pd(f64::from_bits(C0)), _mm512_set1_pd(f64::from_bits(C1)));
    let r2 = _mm512_mul_pd(r, r);
    let y = _mm512_fmadd_pd(r, _mm512_set1_pd(f64::from_bits(C2)), _mm512_set1_pd(1.0));
    let y = _mm512_fmadd_pd(z, r2, y);
    _mm512_cvtpd_ps(_mm512_mul_pd(y, s))
}

/// `expf` of 16 lanes, each bit-identical to glibc's FMA `expf` (see the module doc).
///
/// SAFETY: AVX-512F.
#[inline]
#[target_feature(enable = "avx2,fma,avx512f")]
pub(crate) unsafe fn exp16(x: __m512) -> __m512 {
    let p = TAB.as_ptr();
    let tab = [
        _mm512_loadu_si512(p as *const _),
        _mm512_loadu_si512(p.add(8) as *const _),
        _mm512_loadu_si512(p.add(16) as *const _),
        _mm512_loadu_si512(p.add(24) as *const _),
    ];
    let lo = main8(_mm512_castps512_ps256(x), &tab);
    let hi = main8(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(x))), &tab);
    let y = _mm512_castpd_ps(_mm512_insertf64x4::<1>(_mm512_castps_pd(_mm512_castps256_ps512(lo)), _mm256_castps_pd(hi)));
    let top = _mm512_and_si512(_mm512_srli_epi32::<20>(_mm512_castps_si512(x)), _mm512_set1_epi32(0x7ff));
    let out_of_range = _mm512_cmpgt_epu32_mask(top, _mm512_set1_epi32(TOP_LIMIT as i32));
    if out_of_range == 0 {
        return y;
    }
    let (mut xs, mut ys) = ([0f32; 16], [0f32; 16]);
    _mm512_storeu_ps(xs.as_mut_ptr(), x);
    _mm512_storeu_ps(ys.as_mut_ptr(), y);
    for l in 0..16 {
        if out_of_range & (1 << l) != 0 {
            ys[l] = xs[l].exp();
        }
    }
    _mm512_loadu_ps(ys.as_ptr())
}

/// `exp16` over a slice (`x.len() <= 16`; missing lanes are computed from 0 and dropped).
///
/// SAFETY: AVX-512F.
#[target_feature(enable = "avx2,fma,avx512f")]
pub(crate) unsafe fn exp_slice(x: &mut [f32]) {
    assert!(x.len() <= 16);
    let m: __mmask16 = ((1u32 << x.len()) - 1) as __mmask16;
    let v = _mm512_maskz_loadu_ps(m, x.as_ptr());
    _mm512_mask_storeu_ps(x.as_mut_ptr(), m, exp16(v));
}

/// Whether the CPU has the instructions and [`exp16`] reproduces this process's scalar
/// `f32::exp` on a probe set (checked once; the C library decides what `expf` computes).
pub(crate) fn matches_libm() -> bool {
    static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OK.get_or_init(|| {
        if !(super::has_avx2() && super::has_avx512()) {
            return false;
        }
        let mut s = 0x2545_f491_4f6c_dd1du64;
        let mut probe: Vec<f32> = (0..4096)
            .map(|i| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                match i % 3 {
                    // the softmax range, and anywhere in range, and any bits
                    0 => -((s >> 40) as f32 / (1u64 << 24) as f32) * 30.0,
                    1 => ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 200.0,
                    _ => f32::from_bits(s as u32),
                }
            })
            .collect();
        probe.extend([0.0, -0.0, 1.0, -1.0, f32::NEG_INFINITY, f32::INFINITY, f32::NAN, -103.5, -88.5, 88.7, -87.9]);
        probe.chunks(16).all(|c| {
            let mut y = c.to_vec();
            // SAFETY: the features were checked above.
            unsafe { exp_slice(&mut y) };
            c.iter().zip(&y).all(|(x, y)| x.exp().to_bits() == y.to_bits() || (x.exp().is_nan() && y.is_nan()))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(xs: &[f32]) {
        for c in xs.chunks(16) {
            let mut y = c.to_vec();
            unsafe { exp_slice(&mut y) };
            for (x, y) in c.iter().zip(&y) {
                let want = x.exp();
                assert!(want.to_bits() == y.to_bits() || (want.is_nan() && y.is_nan()), "expf({x:e}) = {want:e}, vector {y:e}");
            }
        }
    }

    #[test]
    fn bit_identical_to_libm_on_a_sweep() {
        if !matches_libm() {
            eprintln!("skipped: the vector expf is not this libm's (or no AVX-512)");
            return;
        }
        // every 61st float of [-104, 89] (both signs), plus the neighbours of the limits
        let mut xs = vec![];
        for top in [0u32, 0x8000_0000] {
            let mut b = 0u32;
            while b < 0x42b2_0000 {
                xs.push(f32::from_bits(top | b));
                b += 61;
            }
        }
        for lim in [88.0f32, -88.0, 88.72283, -103.97208, -103.27892, 0.0] {
            for d in -40i32..40 {
                xs.push(f32::from_bits((lim.to_bits() as i32 + d) as u32));
            }
        }
        check(&xs);
    }

    #[test]
    #[ignore = "exhaustive over all 2^32 floats: minutes; run by hand"]
    fn bit_identical_to_libm_everywhere() {
        if !matches_libm() {
            return;
        }
        let mut buf = Vec::with_capacity(1 << 16);
        for hi in 0u32..(1 << 16) {
            buf.clear();
            buf.extend((0u32..(1 << 16)).map(|lo| f32::from_bits(hi << 16 | lo)));
            check(&buf);
        }
    }
}
