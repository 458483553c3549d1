//! AVX-512 decode attention over an f16 cache (llama.cpp's "vector" path) for the heads that
//! share a KV head, bit-identical per head to `simd::attn::vec_f16_run_ref`.
//!
//! llama.cpp walks the positions one by one: score, running max, `expf`, then the f16 V
//! accumulator update. Only the last step depends on the previous position, so this kernel
//! splits a run into chunks of [`CH`] positions and does, per chunk:
//!
//! ```text
//!  1. scores of all CH positions (ggml_vec_dot_f16's AVX-512 order; K chunk widened once
//!     for all heads; positions independent, so they overlap in the pipeline; the horizontal
//!     sums of four positions share one shuffle tree)
//!  2. per head: the running max m as a prefix scan over the chunk and the exp argument of
//!     each position (m_old - s at a new max, s - m otherwise), all CH exponentials at once
//!     (`expf`, 16 lanes, bit-identical to libm's), then S = S·ms + w in position order
//!  3. per 64 dims: the heads' V accumulators held in registers over the chunk's positions:
//!     acc = r16(acc·ms) at a new max, acc = r16(fma(v, w, acc)) (V chunk widened once)
//! ```
//!
//! (Helpers are `inline(always)` and use no closures: a closure would not inherit the
//! target features, and its intrinsics would become calls.) Every float operation of a head is the reference's, in the reference's order per lane.

#![allow(clippy::needless_range_loop)] // index loops over the kernel's registers

use crate::simd::attn::{multi_args, Online, Run, Scoring};
use half::f16;
use std::arch::x86_64::*;

/// Positions per chunk (one 16-lane `expf` per head).
const CH: usize = 16;

/// Round 16 lanes to f16 values (nearest even), kept as f32.
#[inline(always)]
unsafe fn r16x16(x: __m512) -> __m512 {
    _mm512_cvtph_ps(_mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x))
}

#[inline(always)]
unsafe fn widen(p: *const f16) -> __m512 {
    _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
}

/// Per-chunk factors of `G` heads: `ms` (1 unless a new max), `w` (1 at a new max).
struct Factors<const G: usize> {
    ms: [[f32; CH]; G],
    w: [[f32; CH]; G],
    new_max: [u32; G],
}

/// `simd::attn::vec_f16_run` for `G` heads sharing a KV head (`hd % 16 == 0`). `vexp`:
/// exponentials by [`super::expf::exp16`] (callers pass true only where it matches libm).
///
/// SAFETY: AVX2+FMA+F16C+AVX512F/BW/VL.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn vec_f16_run_multi_avx512<const G: usize>(
    q16: &[&[f32]],
    k: &[f16],
    v: &[f16],
    run: Run,
    sc: Scoring,
    st: &mut [Online],
    acc: &mut [&mut [f32]],
    vexp: bool,
) {
    let (hd, qp, ap) = multi_args::<G>(q16, 16, (k.len(), v.len()), &run, st, acc);
    let row = |j: usize| run.start + j * run.stride;
    let mut j0 = 0;
    while j0 < run.len {
        let n = (run.len - j0).min(CH);
        let mut s = [[0f32; CH]; G];
        let np = hd & !63;
        let mut jj = 0;
        while jj < n {
            // four positions at a time: their horizontal sums share the shuffles
            let k4 = (n - jj).min(4);
            let mut x = [[_mm512_setzero_ps(); 4]; G];
            for q in 0..k4 {
                let xs = lane_sums::<G>(&qp, k.as_ptr().add(row(j0 + jj + q)), np);
                for g in 0..G {
                    x[g][q] = xs[g];
                }
            }
            for g in 0..G {
                let mut lanes = [0f32; 16];
                _mm512_storeu_ps(lanes.as_mut_ptr(), reduce4(x[g]));
                for q in 0..k4 {
                    let kr = k.as_ptr().add(row(j0 + jj + q));
                    let mut sum = lanes[4 * q] as f64;
                    for d in np..hd {
                        sum += (*qp[g].add(d) * (*kr.add(d)).to_f32()) as f64;
                    }
                    s[g][jj + q] = sc.apply(sum as f32);
                }
            }
            jj += k4;
        }
        let mut f = Factors { ms: [[1.0; CH]; G], w: [[1.0; CH]; G], new_max: [0; G] };
        for g in 0..G {
            let st = &mut st[g];
            if vexp {
                f.new_max[g] = factors16(&s[g], n, st, &mut f.ms[g], &mut f.w[g]);
                continue;
            }
            let mut x = [0f32; CH];
            for jj in 0..n {
                let sj = s[g][jj];
                if sj > st.m {
                    x[jj] = st.m - sj;
                    st.m = sj;
                    f.new_max[g] |= 1 << jj;
                } else {
                    x[jj] = sj - st.m;
                }
            }
            x[..n].iter_mut().for_each(|e| *e = e.exp());
            for jj in 0..n {
                if f.new_max[g] >> jj & 1 != 0 {
                    f.ms[g][jj] = x[jj];
                } else {
                    f.w[g][jj] = x[jj];
                }
                // S = S*ms + vs, contracted to an FMA by ggml's compiler
                st.s = st.s.mul_add(f.ms[g][jj], f.w[g][jj]);
            }
        }
        let vrow = |jj: usize| v.as_ptr().add(row(j0 + jj));
        let mut d = 0;
        while d + 64 <= hd {
            v_update::<G, 4>(&ap, d, n, &vrow, &f);
            d += 64;
        }
        while d < hd {
            v_update::<G, 1>(&ap, d, n, &vrow, &f);
            d += 16;
        }
        j0 += n;
    }
}

/// One head's factors for the chunk's `n` (1..=16) scores `s`, vectorized: the running max
/// as a prefix scan (ties keep the earlier value, NaN scores never count, as `s > m` in the
/// reference), each position's exponent argument (`m_old - s` at a new max, `s - m`
/// otherwise), 16 `expf` at once, `ms` / `w`, then `S = S·ms + w` in position order.
/// Returns the new-max positions as bits.
#[inline(always)]
unsafe fn factors16(s: &[f32; CH], n: usize, st: &mut Online, ms: &mut [f32; CH], w: &mut [f32; CH]) -> u32 {
    let valid = ((1u32 << n) - 1) as __mmask16;
    let ninf = _mm512_castps_si512(_mm512_set1_ps(f32::NEG_INFINITY));
    let sv = _mm512_loadu_ps(s.as_ptr());
    // lanes past n and NaN scores never become the max
    let ordered = _mm512_mask_cmp_ps_mask::<_CMP_ORD_Q>(valid, sv, sv);
    let mut m = _mm512_mask_blend_epi32(ordered, ninf, _mm512_castps_si512(sv));
    // inclusive prefix max: lane j combined with lane j - k; `max_ps` returns its second
    // operand (the earlier value) on ties, as the reference keeps its max unless s > m
    macro_rules! c {
        ($x:expr) => {
            _mm512_castsi512_ps($x)
        };
    }
    m = _mm512_castps_si512(_mm512_max_ps(c!(m), c!(_mm512_alignr_epi32::<15>(m, ninf))));
    m = _mm512_castps_si512(_mm512_max_ps(c!(m), c!(_mm512_alignr_epi32::<14>(m, ninf))));
    m = _mm512_castps_si512(_mm512_max_ps(c!(m), c!(_mm512_alignr_epi32::<12>(m, ninf))));
    m = _mm512_castps_si512(_mm512_max_ps(c!(m), c!(_mm512_alignr_epi32::<8>(m, ninf))));
    let m_in = _mm512_set1_ps(st.m);
    let incl = _mm512_max_ps(c!(m), m_in);
    // the max before each position
    let prev = c!(_mm512_alignr_epi32::<15>(_mm512_castps_si512(incl), _mm512_castps_si512(m_in)));
    let new_max = _mm512_mask_cmp_ps_mask::<_CMP_GT_OQ>(valid, sv, prev);
    // s - m, negated (exactly m - s: nonzero there) at a new max
    let d = _mm512_castps_si512(_mm512_sub_ps(sv, prev));
    let x = _mm512_mask_xor_epi32(d, new_max, d, _mm512_set1_epi32(i32::MIN));
    let e = super::expf::exp16(_mm512_maskz_mov_ps(valid, c!(x)));
    let one = _mm512_set1_ps(1.0);
    _mm512_storeu_ps(ms.as_mut_ptr(), _mm512_mask_blend_ps(new_max, one, e));
    _mm512_storeu_ps(w.as_mut_ptr(), _mm512_mask_blend_ps(new_max, e, one));
    let mut lanes = [0f32; CH];
    _mm512_storeu_ps(lanes.as_mut_ptr(), incl);
    st.m = lanes[n - 1];
    for jj in 0..n {
        // S = S*ms + vs, contracted to an FMA by ggml's compiler
        st.s = st.s.mul_add(ms[jj], w[jj]);
    }
    new_max as u32
}

/// The `G` heads' 16-lane partial dot products with the K row at `kr` over its first `np`
/// (a multiple of 64) dims: `ggml_vec_dot_f16`'s four 16-lane accumulators per head, folded
/// as ggml's AVX-512 build folds them ((0 + 2) + (1 + 3)).
#[inline(always)]
unsafe fn lane_sums<const G: usize>(qp: &[*const f32; G], kr: *const f16, np: usize) -> [__m512; G] {
    let mut a = [[_mm512_setzero_ps(); 4]; G];
    let mut i = 0;
    while i < np {
        let mut kw = [_mm512_setzero_ps(); 4];
        for c in 0..4 {
            kw[c] = widen(kr.add(i + 16 * c));
        }
        for g in 0..G {
            for c in 0..4 {
                a[g][c] = _mm512_fmadd_ps(_mm512_loadu_ps(qp[g].add(i + 16 * c)), kw[c], a[g][c]);
            }
        }
        i += 64;
    }
    let mut out = [_mm512_setzero_ps(); G];
    for g in 0..G {
        out[g] = _mm512_add_ps(_mm512_add_ps(a[g][0], a[g][2]), _mm512_add_ps(a[g][1], a[g][3]));
    }
    out
}

/// `_mm512_reduce_add_ps`'s tree (as ggml folds a 16-lane sum: 8 + 8, 4 + 4, then
/// (0 + 2) + (1 + 3)) of four vectors at once: element `4q` of the result is vector `q`'s
/// sum, with the reference's additions pairing the same lanes.
#[inline(always)]
unsafe fn reduce4(x: [__m512; 4]) -> __m512 {
    // [x0 lo256 + hi256 | x1 lo256 + hi256], [x2 .. | x3 ..]
    let a01 = _mm512_add_ps(_mm512_shuffle_f32x4::<0x44>(x[0], x[1]), _mm512_shuffle_f32x4::<0xEE>(x[0], x[1]));
    let a23 = _mm512_add_ps(_mm512_shuffle_f32x4::<0x44>(x[2], x[3]), _mm512_shuffle_f32x4::<0xEE>(x[2], x[3]));
    // 128-bit lane q: vector q's low 128 + high 128 of its 256-bit sum
    let t4 = _mm512_add_ps(_mm512_shuffle_f32x4::<0x88>(a01, a23), _mm512_shuffle_f32x4::<0xDD>(a01, a23));
    // per lane: (0 + 2, 1 + 3), then their sum in element 0
    let c = _mm512_add_ps(t4, _mm512_permute_ps::<0xEE>(t4));
    _mm512_add_ps(c, _mm512_permute_ps::<0x01>(c))
}

/// Dims `d..d + 16·C` of the heads' accumulators over the chunk's `n` positions, held in
/// registers (`vrow(jj)`: the V row of position `jj`).
#[inline(always)]
unsafe fn v_update<const G: usize, const C: usize>(
    ap: &[*mut f32; G],
    d: usize,
    n: usize,
    vrow: impl Fn(usize) -> *const f16,
    f: &Factors<G>,
) {
    let mut a = [[_mm512_setzero_ps(); C]; G];
    for g in 0..G {
        for c in 0..C {
            a[g][c] = _mm512_loadu_ps(ap[g].add(d + 16 * c));
        }
    }
    for jj in 0..n {
        let vr = vrow(jj).add(d);
        let mut vw = [_mm512_setzero_ps(); C];
        for c in 0..C {
            vw[c] = widen(vr.add(16 * c));
        }
        for g in 0..G {
            if f.new_max[g] >> jj & 1 != 0 {
                let m = _mm512_set1_ps(f.ms[g][jj]);
                for c in 0..C {
                    a[g][c] = r16x16(_mm512_mul_ps(a[g][c], m));
                }
            }
            let w = _mm512_set1_ps(f.w[g][jj]);
            for c in 0..C {
                a[g][c] = r16x16(_mm512_fmadd_ps(vw[c], w, a[g][c]));
            }
        }
    }
    for g in 0..G {
        for c in 0..C {
            _mm512_storeu_ps(ap[g].add(d + 16 * c), a[g][c]);
        }
    }
}
