//! Element-wise math bit-compatible with ggml's x86 AVX-512 build, so that our activations
//! round exactly as llama.cpp's do (a greedy decode of a small model flips on 1-ulp changes).
//!
//! `silu` follows ggml's vectorized `ggml_v_expf` / `ggml_v_silu` (a polynomial exp with
//! `scalef`), not libm's `expf`. The AVX-512 path uses the same instructions; the scalar twin
//! performs the same operations with fused multiply-adds and is the fallback and the test oracle.

#[inline]
fn scalef(j: f32, n: f32) -> f32 {
    // j * 2^n for integral n, without overflowing the intermediate power
    let n = n as i32;
    let half = n / 2;
    j * 2f32.powi(half) * 2f32.powi(n - half)
}

/// Scalar twin of ggml's AVX-512 `ggml_v_expf`.
pub fn expf_ggml(x: f32) -> f32 {
    let r = f32::from_bits(0x4B40_0000); // 0x1.8p23
    let z = x.mul_add(f32::from_bits(0x3FB8_AA3B), r); // 0x1.715476p+0
    let n = z - r;
    let b = (-n).mul_add(f32::from_bits(0x35BF_BE8E), (-n).mul_add(f32::from_bits(0x3F31_7200), x)); // 0x1.7f7d1cp-20, 0x1.62e4p-1
    let u = b * b;
    let j = f32::from_bits(0x3C07_2010) // 0x1.0e4020p-7
        .mul_add(b, f32::from_bits(0x3D2B_9F17)) // 0x1.573e2ep-5
        .mul_add(u, f32::from_bits(0x3E2A_AF33).mul_add(b, f32::from_bits(0x3EFF_FEDB))) // 0x1.555e66p-3, 0x1.fffdb6p-2
        .mul_add(u, f32::from_bits(0x3F7F_FFF6).mul_add(b, 1.0)); // 0x1.ffffecp-1
    if n.abs() > 192.0 {
        // _mm512_mask_blend_ps(n <= 0, inf, 0): 0 for large negative, inf for large positive
        return if n <= 0.0 { 0.0 } else { f32::INFINITY };
    }
    scalef(j, n)
}

/// Scalar twin of `ggml_v_silu`: x / (1 + exp(-x)).
pub fn silu_ggml(x: f32) -> f32 {
    x / (1.0 + expf_ggml(0.0 - x))
}

/// `out[i] = silu(gate[i]) * up[i]` as ggml_vec_swiglu_f32 computes it.
pub fn swiglu(gate: &[f32], up: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("avx512dq") {
        // SAFETY: features checked above.
        unsafe { x86::swiglu_avx512(gate, up, out) };
        return;
    }
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = silu_ggml(g) * u;
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx512f,avx512dq")]
    unsafe fn v_expf(x: __m512) -> __m512 {
        let r = _mm512_set1_ps(f32::from_bits(0x4B40_0000));
        let z = _mm512_fmadd_ps(x, _mm512_set1_ps(f32::from_bits(0x3FB8_AA3B)), r);
        let n = _mm512_sub_ps(z, r);
        let b = _mm512_fnmadd_ps(
            n,
            _mm512_set1_ps(f32::from_bits(0x35BF_BE8E)),
            _mm512_fnmadd_ps(n, _mm512_set1_ps(f32::from_bits(0x3F31_7200)), x),
        );
        let d = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(_mm512_abs_ps(n), _mm512_set1_ps(192.0));
        let u = _mm512_mul_ps(b, b);
        let j = _mm512_fmadd_ps(
            _mm512_fmadd_ps(
                _mm512_fmadd_ps(_mm512_set1_ps(f32::from_bits(0x3C07_2010)), b, _mm512_set1_ps(f32::from_bits(0x3D2B_9F17))),
                u,
                _mm512_fmadd_ps(_mm512_set1_ps(f32::from_bits(0x3E2A_AF33)), b, _mm512_set1_ps(f32::from_bits(0x3EFF_FEDB))),
            ),
            u,
            _mm512_fmadd_ps(_mm512_set1_ps(f32::from_bits(0x3F7F_FFF6)), b, _mm512_set1_ps(1.0)),
        );
        let res = _mm512_scalef_ps(j, n);
        if d == 0 {
            return res;
        }
        let zero = _mm512_setzero_ps();
        let alt = _mm512_mask_blend_ps(_mm512_cmp_ps_mask::<_CMP_LE_OQ>(n, zero), _mm512_set1_ps(f32::INFINITY), zero);
        _mm512_mask_blend_ps(d, res, alt)
    }

    #[target_feature(enable = "avx512f,avx512dq")]
    pub(super) unsafe fn swiglu_avx512(gate: &[f32], up: &[f32], out: &mut [f32]) {
        let n = out.len().min(gate.len()).min(up.len());
        let mut i = 0;
        while i + 16 <= n {
            let x = _mm512_loadu_ps(gate.as_ptr().add(i));
            let e = v_expf(_mm512_sub_ps(_mm512_setzero_ps(), x));
            let s = _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0), e));
            _mm512_storeu_ps(out.as_mut_ptr().add(i), _mm512_mul_ps(s, _mm512_loadu_ps(up.as_ptr().add(i))));
            i += 16;
        }
        // ggml's leftovers use libm expf
        for k in i..n {
            out[k] = gate[k] / (1.0 + (-gate[k]).exp()) * up[k];
        }
    }
}

/// `_mm512_reduce_add_ps`'s tree over 16 lanes (8, 4, then 2+2).
#[inline(always)]
pub(crate) fn reduce16(x: &[f32; 16]) -> f32 {
    let mut t8 = [0f32; 8];
    for i in 0..8 {
        t8[i] = x[i] + x[i + 8];
    }
    let mut t4 = [0f32; 4];
    for i in 0..4 {
        t4[i] = t8[i] + t8[i + 4];
    }
    (t4[0] + t4[2]) + (t4[1] + t4[3])
}

/// `_mm512_reduce_add_ps` of four 16-lane accumulators as ggml folds them (0 += 2, 1 += 3,
/// 0 += 1, then [`reduce16`]'s lane tree).
#[inline(always)]
pub(crate) fn fold_lanes(acc: &[[f32; 16]; 4]) -> f32 {
    let mut x = [0f32; 16];
    for l in 0..16 {
        x[l] = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);
    }
    reduce16(&x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expf_is_close_to_libm() {
        for i in -2000..2000 {
            let x = i as f32 * 0.043;
            let (a, b) = (expf_ggml(x), x.exp());
            assert!((a - b).abs() <= 1e-6 * b.abs().max(1e-30), "{x}: {a} vs {b}");
        }
        assert_eq!(expf_ggml(-200.0), 0.0);
        assert_eq!(expf_ggml(200.0), f32::INFINITY);
    }

    #[test]
    fn simd_swiglu_equals_scalar_twin() {
        let g: Vec<f32> = (0..1000).map(|i| ((i * 7919 % 2003) as f32 - 1000.0) * 0.013).collect();
        let u: Vec<f32> = (0..1000).map(|i| ((i * 104729 % 997) as f32 - 498.0) * 0.007).collect();
        let mut a = vec![0f32; 1000];
        swiglu(&g, &u, &mut a);
        for i in 0..992 {
            assert_eq!(a[i].to_bits(), (silu_ggml(g[i]) * u[i]).to_bits(), "at {i}");
        }
    }
}
