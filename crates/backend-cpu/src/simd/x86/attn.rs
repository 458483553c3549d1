//! AVX2+FMA+F16C attention runs, bit-identical to the reference twins in `simd::attn`:
//! every lane does the twin's float operations in the twin's order (the 16-lane accumulators
//! of ggml's AVX-512 `ggml_vec_dot_f16` are two 8-lane registers here), K and V are read
//! straight from the cache (f16 widened in registers, exactly).

use crate::simd::attn::{multi_args, run_args, Online, Run, Scoring};
use half::f16;
use std::arch::x86_64::*;

/// A cache element type: 8 values widened to f32 lanes.
pub(crate) trait Elem: Copy {
    unsafe fn load8(p: *const Self) -> __m256;
}

impl Elem for f32 {
    #[inline(always)]
    unsafe fn load8(p: *const f32) -> __m256 {
        _mm256_loadu_ps(p)
    }
}

impl Elem for f16 {
    #[inline(always)]
    unsafe fn load8(p: *const f16) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
    }
}

/// Round 8 lanes to f16 values (nearest even), kept as f32.
#[inline(always)]
unsafe fn r16x8(x: __m256) -> __m256 {
    _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x))
}

/// `simd::attn::vec_f16_run` (`q16.len() % 8 == 0`).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn vec_f16_run(q16: &[f32], k: &[f16], v: &[f16], run: Run, sc: Scoring, st: &mut Online, acc: &mut [f32]) {
    let hd = run_args(q16, 8, (k.len(), v.len()), &run, acc);
    for j in 0..run.len {
        let at = run.start + j * run.stride;
        vec_f16_step(q16.as_ptr(), k.as_ptr().add(at), v.as_ptr().add(at), hd, sc, st, acc.as_mut_ptr());
    }
}

/// `simd::attn::vec_f16_run` for `G` queries over the same run (heads sharing a KV head),
/// position by position in lock step: the heads' dependency chains (the f16 round trip of
/// the accumulator, the running max) overlap. Each head gets exactly `vec_f16_run`'s bits.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn vec_f16_run_multi<const G: usize>(
    q16: &[&[f32]],
    k: &[f16],
    v: &[f16],
    run: Run,
    sc: Scoring,
    st: &mut [Online],
    acc: &mut [&mut [f32]],
) {
    let (hd, qp, ap) = multi_args::<G>(q16, 8, (k.len(), v.len()), &run, st, acc);
    for j in 0..run.len {
        let at = run.start + j * run.stride;
        let (kr, vr) = (k.as_ptr().add(at), v.as_ptr().add(at));
        for g in 0..G {
            vec_f16_step(qp[g], kr, vr, hd, sc, &mut st[g], ap[g]);
        }
    }
}

/// One cached position of llama.cpp's vector path for one head (`hd % 8 == 0`; `q`, `kr`,
/// `vr`, `ap` valid for `hd` elements).
#[inline(always)]
unsafe fn vec_f16_step(qp: *const f32, kr: *const f16, vr: *const f16, hd: usize, sc: Scoring, st: &mut Online, ap: *mut f32) {
    let np = hd & !63;
    // ggml_vec_dot_f16: accumulator c (of 4) lane half h at a[2c + h]
    let mut a = [_mm256_setzero_ps(); 8];
    let mut i = 0;
    while i < np {
        for (c, ac) in a.iter_mut().enumerate() {
            let o = i + c * 8;
            *ac = _mm256_fmadd_ps(_mm256_loadu_ps(qp.add(o)), f16::load8(kr.add(o)), *ac);
        }
        i += 64;
    }
    let xlo = _mm256_add_ps(_mm256_add_ps(a[0], a[4]), _mm256_add_ps(a[2], a[6]));
    let xhi = _mm256_add_ps(_mm256_add_ps(a[1], a[5]), _mm256_add_ps(a[3], a[7]));
    let t8 = _mm256_add_ps(xlo, xhi);
    let t4 = _mm_add_ps(_mm256_castps256_ps128(t8), _mm256_extractf128_ps::<1>(t8));
    let c = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));
    let mut sum = _mm_cvtss_f32(_mm_add_ss(c, _mm_shuffle_ps::<1>(c, c))) as f64;
    for d in np..hd {
        sum += (*qp.add(d) * (*kr.add(d)).to_f32()) as f64;
    }
    let score = sc.apply(sum as f32);
    let (ms, w) = if score > st.m {
        let ms = (st.m - score).exp();
        st.m = score;
        let msv = _mm256_set1_ps(ms);
        for d in (0..hd).step_by(8) {
            _mm256_storeu_ps(ap.add(d), r16x8(_mm256_mul_ps(_mm256_loadu_ps(ap.add(d)), msv)));
        }
        (ms, 1.0)
    } else {
        (1.0, (score - st.m).exp())
    };
    let wv = _mm256_set1_ps(w);
    for d in (0..hd).step_by(8) {
        let y = _mm256_fmadd_ps(f16::load8(vr.add(d)), wv, _mm256_loadu_ps(ap.add(d)));
        _mm256_storeu_ps(ap.add(d), r16x8(y));
    }
    st.s = st.s.mul_add(ms, w);
}

/// `simd::attn::f32_run` (`q.len() % 8 == 0`) over a cache of `T`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn f32_run<T: Elem>(q: &[f32], k: &[T], v: &[T], run: Run, sc: Scoring, st: &mut Online, acc: &mut [f32]) {
    let hd = run_args(q, 8, (k.len(), v.len()), &run, acc);
    let (qp, ap) = (q.as_ptr(), acc.as_mut_ptr());
    for j in 0..run.len {
        let at = run.start + j * run.stride;
        let (kr, vr) = (k.as_ptr().add(at), v.as_ptr().add(at));
        let mut a = _mm256_setzero_ps();
        for d in (0..hd).step_by(8) {
            a = _mm256_add_ps(a, _mm256_mul_ps(_mm256_loadu_ps(qp.add(d)), T::load8(kr.add(d))));
        }
        f32_fold(a, vr, hd, sc, st, ap);
    }
}

/// `simd::attn::f32_run` for `G` queries over the same run (heads sharing a KV head), in lock
/// step: each K row is widened once for all of them, and the `G` independent dependency
/// chains overlap. Each query's lanes do exactly `f32_run`'s operations in its order.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn f32_run_multi<T: Elem, const G: usize>(
    q: &[&[f32]],
    k: &[T],
    v: &[T],
    run: Run,
    sc: Scoring,
    st: &mut [Online],
    acc: &mut [&mut [f32]],
) {
    let (hd, qp, ap) = multi_args::<G>(q, 8, (k.len(), v.len()), &run, st, acc);
    for j in 0..run.len {
        let at = run.start + j * run.stride;
        let (kr, vr) = (k.as_ptr().add(at), v.as_ptr().add(at));
        let mut a = [_mm256_setzero_ps(); G];
        for d in (0..hd).step_by(8) {
            let kv = T::load8(kr.add(d));
            for g in 0..G {
                a[g] = _mm256_add_ps(a[g], _mm256_mul_ps(_mm256_loadu_ps(qp[g].add(d)), kv));
            }
        }
        for g in 0..G {
            f32_fold(a[g], vr, hd, sc, &mut st[g], ap[g]);
        }
    }
}

/// One cached position of `simd::attn::f32_run` after its dot product: the score from the
/// 8 lanes `a` (summed in order), then the online-softmax update of `st` and of the
/// accumulator `ap` with the V row `vr` (`hd % 8 == 0`; `vr`, `ap` valid for `hd` elements).
#[inline(always)]
unsafe fn f32_fold<T: Elem>(a: __m256, vr: *const T, hd: usize, sc: Scoring, st: &mut Online, ap: *mut f32) {
    let mut lanes = [0f32; 8];
    _mm256_storeu_ps(lanes.as_mut_ptr(), a);
    let score = sc.apply(lanes.iter().sum());
    if score > st.m {
        let ms = (st.m - score).exp();
        let msv = _mm256_set1_ps(ms);
        for d in (0..hd).step_by(8) {
            let y = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(ap.add(d)), msv), T::load8(vr.add(d)));
            _mm256_storeu_ps(ap.add(d), y);
        }
        st.s = st.s * ms + 1.0;
        st.m = score;
    } else {
        let w = (score - st.m).exp();
        let wv = _mm256_set1_ps(w);
        for d in (0..hd).step_by(8) {
            let y = _mm256_add_ps(_mm256_loadu_ps(ap.add(d)), _mm256_mul_ps(T::load8(vr.add(d)), wv));
            _mm256_storeu_ps(ap.add(d), y);
        }
        st.s += w;
    }
}
