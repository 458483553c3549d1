//! AVX-512 VNNI kernels over repacked (16-row interleaved) Q4_0 / IQ4_NL / Q4_K weights: one
//! tile = one group of 16 rows x 1..=8 tokens; layout and float order in `simd::repack`
//! (whose `reference_dot` gives exactly the same bits).
//!
//! ```text
//!  per block:  8 code registers (16 rows x 4 elements each; 4 loads, nibbles split)
//!  per token:  isum = off; isum += vpdpbusd(codes_k, broadcast 4 activation bytes)  (x8)
//!              acc  = fma(cvt(isum), d_w[16] * d_a, acc)
//! ```
//!
//! The weight registers are shared by the tile's tokens; activations are read in place from
//! the quantized rows (embedded-broadcast operands), with the per-block `ActAux` beside them.

use super::super::repack::{ActAux, RepackTy, R, TILE_TOKENS};
use std::arch::x86_64::*;

/// Whether the CPU has what the kernels use.
pub(crate) fn supported() -> bool {
    super::has_avx2() && super::has_avx512() && super::has_avx512vnni()
}

/// `out[t][i]` = `repack::reference_dot(ty, n_in, group, i, acts[t].0)`, bit for bit.
/// `acts[t].1` must be `repack::act_aux` of `acts[t].0`. The AVX-512 VNNI kernels if `vnni`
/// (and the CPU has them), else the AVX2 ones (`repack_avx2.rs`). Panics on short buffers or a
/// CPU without AVX2.
pub(crate) fn tile(vnni: bool, ty: RepackTy, n_in: usize, group: &[u8], acts: &[(&[u8], &[ActAux])], out: &mut [[f32; R]]) {
    let nb = n_in / ty.qk();
    let vnni = vnni && supported();
    assert!(vnni || super::repack_avx2::supported(), "repack tile: CPU lacks AVX2");
    assert!(n_in.is_multiple_of(ty.qk()) && group.len() >= nb * ty.group_block());
    assert!((1..=TILE_TOKENS).contains(&acts.len()) && out.len() >= acts.len());
    let mut a = [std::ptr::null::<u8>(); TILE_TOKENS];
    let mut x = [std::ptr::null::<ActAux>(); TILE_TOKENS];
    for (t, (row, aux)) in acts.iter().enumerate() {
        assert!(row.len() >= nb * ty.ab() && aux.len() >= nb);
        a[t] = row.as_ptr();
        x[t] = aux.as_ptr();
    }
    let g = group.as_ptr();
    let o = out.as_mut_ptr();
    if !vnni {
        // SAFETY: AVX2 checked; buffers as asserted above.
        unsafe { super::repack_avx2::tile(ty, nb, g, &a, &x, acts.len(), o) };
        return;
    }
    macro_rules! go {
        ($iq4:expr) => {
            // SAFETY: features checked; `group` holds `nb` group blocks, every activation
            // row `nb` blocks and its aux `nb` entries, `out` `acts.len()` rows (asserted).
            unsafe {
                match acts.len() {
                    1 => kernel::<1, $iq4>(nb, g, &a, &x, o),
                    2 => kernel::<2, $iq4>(nb, g, &a, &x, o),
                    3 => kernel::<3, $iq4>(nb, g, &a, &x, o),
                    4 => kernel::<4, $iq4>(nb, g, &a, &x, o),
                    5 => kernel::<5, $iq4>(nb, g, &a, &x, o),
                    6 => kernel::<6, $iq4>(nb, g, &a, &x, o),
                    7 => kernel::<7, $iq4>(nb, g, &a, &x, o),
                    _ => kernel::<8, $iq4>(nb, g, &a, &x, o),
                }
            }
        };
    }
    match ty {
        RepackTy::Q4_0 => go!(false),
        RepackTy::IQ4_NL => go!(true),
        RepackTy::Q4_K => {
            // at most K_TOKENS tokens per kernel call (registers)
            let mut t0 = 0;
            while t0 < acts.len() {
                let n = (acts.len() - t0).min(K_TOKENS);
                let (a4, x4) = (&a[t0..], &x[t0..]);
                // SAFETY: as above (the same rows, `n` of them from `t0`).
                unsafe {
                    let o = o.add(t0);
                    match n {
                        1 => kernel_k::<1>(nb, g, a4, x4, o),
                        2 => kernel_k::<2>(nb, g, a4, x4, o),
                        3 => kernel_k::<3>(nb, g, a4, x4, o),
                        4 => kernel_k::<4>(nb, g, a4, x4, o),
                        5 => kernel_k::<5>(nb, g, a4, x4, o),
                        6 => kernel_k::<6>(nb, g, a4, x4, o),
                        7 => kernel_k::<7>(nb, g, a4, x4, o),
                        _ => kernel_k::<8>(nb, g, a4, x4, o),
                    }
                }
                t0 += n;
            }
        }
    }
}

/// Q4_K (layout in `repack_k.rs`): per super-block and token, 8 sub-block dot products
/// (`vpdpbusd`), each times its 16 rows' scales (`vpmulld`, exact), the mins against the
/// sub-block sums (`vpdpwssd`), then the two float accumulators.
///
/// SAFETY: as [`kernel`], with `nb` super-blocks and at least T entries in `a` and `x`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn kernel_k<const T: usize>(nb: usize, g: *const u8, a: &[*const u8], x: &[*const ActAux], out: *mut [f32; R]) {
    use super::super::repack_k::{AB, D, DMIN, GROUP_BLOCK, MINS, SCALES};
    let mask = _mm512_set1_epi8(0x0f);
    let mut acc = [_mm512_setzero_ps(); T];
    let mut accm = [_mm512_setzero_ps(); T];
    for b in 0..nb {
        let gp = g.add(b * GROUP_BLOCK);
        super::prefetch(gp, GROUP_BLOCK);
        let mut isum = [_mm512_setzero_si512(); T];
        for j in 0..8 {
            let (jj, hi) = (j / 2, j % 2 == 1);
            let mut w = [_mm512_setzero_si512(); 8];
            for k in 0..8 {
                let v = _mm512_loadu_si512(gp.add((jj * 8 + k) * 64) as *const _);
                w[k] = if hi { _mm512_and_si512(_mm512_srli_epi16(v, 4), mask) } else { _mm512_and_si512(v, mask) };
            }
            let sc = _mm512_cvtepu8_epi32(_mm_loadu_si128(gp.add(SCALES + j * R) as *const __m128i));
            for t in 0..T {
                let y = a[t].add(b * AB + 4 + 32 * j);
                let mut s0 = _mm512_setzero_si512();
                let mut s1 = _mm512_setzero_si512();
                for k in 0..8 {
                    let yv = _mm512_set1_epi32((y.add(4 * k) as *const i32).read_unaligned());
                    if k % 2 == 0 {
                        s0 = _mm512_dpbusd_epi32(s0, w[k], yv);
                    } else {
                        s1 = _mm512_dpbusd_epi32(s1, w[k], yv);
                    }
                }
                isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(_mm512_add_epi32(s0, s1), sc));
            }
        }
        let dw = _mm512_cvtph_ps(_mm256_loadu_si256(gp.add(D) as *const __m256i));
        let dmw = _mm512_cvtph_ps(_mm256_loadu_si256(gp.add(DMIN) as *const __m256i));
        let mut mins = [_mm512_setzero_si512(); 4];
        for (pi, m) in mins.iter_mut().enumerate() {
            *m = _mm512_cvtepu8_epi16(_mm256_loadu_si256(gp.add(MINS + pi * 2 * R) as *const __m256i));
        }
        for t in 0..T {
            let xa = &*x[t].add(b);
            let bs = xa.bs.as_ptr() as *const i32;
            let mut imin = _mm512_setzero_si512();
            for (pi, m) in mins.iter().enumerate() {
                imin = _mm512_dpwssd_epi32(imin, *m, _mm512_set1_epi32(bs.add(pi).read_unaligned()));
            }
            let da = _mm512_set1_ps(xa.d);
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), _mm512_mul_ps(dw, da), acc[t]);
            accm[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(imin), _mm512_mul_ps(dmw, da), accm[t]);
        }
    }
    for t in 0..T {
        _mm512_storeu_ps((*out.add(t)).as_mut_ptr(), _mm512_sub_ps(acc[t], accm[t]));
    }
}

/// Where the 4 activation bytes of code register `k` start in a block (the AVX2 twin's
/// too): register `2j` holds the low nibbles of the group's `j`-th code vector (values
/// `4j..4j + 4` of each row), register `2j + 1` its high nibbles (values `16 + 4j..`).
pub(super) const ACT_AT: [usize; 8] = [0, 16, 4, 20, 8, 24, 12, 28];

/// Q4_0, or IQ4_NL where `IQ4` (nibbles through the codebook + 128).
///
/// SAFETY: AVX2+FMA+F16C+AVX512F/BW/VL/VNNI; `g` readable for `nb` group blocks, `a[t]`
/// for `nb` activation blocks and `x[t]` for `nb` entries (t < T), `out` writable for T rows.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn kernel<const T: usize, const IQ4: bool>(
    nb: usize,
    g: *const u8,
    a: &[*const u8; TILE_TOKENS],
    x: &[*const ActAux; TILE_TOKENS],
    out: *mut [f32; R],
) {
    let (codes, ab, aq) = (16 * R, 34usize, 2usize);
    let gb = codes + 2 * R;
    let mask = _mm512_set1_epi8(0x0f);
    let lut = _mm512_broadcast_i32x4(_mm_loadu_si128(lut_iq4nl().as_ptr() as *const __m128i));
    let mut acc = [_mm512_setzero_ps(); T];
    for b in 0..nb {
        let gp = g.add(b * gb);
        // streaming weights: ask for the blocks a little ahead
        super::prefetch(gp, gb);
        // code register `k` (its activation bytes at `ACT_AT[k]`)
        let mut w = [_mm512_setzero_si512(); 8];
        for k in 0..4 {
            let v = _mm512_loadu_si512(gp.add(64 * k) as *const _);
            w[2 * k] = _mm512_and_si512(v, mask);
            w[2 * k + 1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), mask);
            if IQ4 {
                w[2 * k] = _mm512_shuffle_epi8(lut, w[2 * k]);
                w[2 * k + 1] = _mm512_shuffle_epi8(lut, w[2 * k + 1]);
            }
        }
        let dw = _mm512_cvtph_ps(_mm256_loadu_si256(gp.add(codes) as *const __m256i));
        for t in 0..T {
            let y = a[t].add(b * ab + aq);
            let xa = &*x[t].add(b);
            let mut s0 = _mm512_set1_epi32(xa.off);
            let mut s1 = _mm512_setzero_si512();
            for k in 0..8 {
                let yv = _mm512_set1_epi32((y.add(ACT_AT[k]) as *const i32).read_unaligned());
                if k % 2 == 0 {
                    s0 = _mm512_dpbusd_epi32(s0, w[k], yv);
                } else {
                    s1 = _mm512_dpbusd_epi32(s1, w[k], yv);
                }
            }
            let isum = _mm512_add_epi32(s0, s1);
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, _mm512_set1_ps(xa.d)), acc[t]);
        }
    }
    for t in 0..T {
        _mm512_storeu_ps((*out.add(t)).as_mut_ptr(), acc[t]);
    }
}

/// Tokens per Q4_K kernel call: all of a tile's (the accumulators then spill, but they are
/// touched once per super-block, and the unpacked codes serve twice the tokens).
const K_TOKENS: usize = TILE_TOKENS;

/// `KVALUES_IQ4NL[i] + 128` as 16 unsigned bytes (the codes `vpdpbusd` multiplies).
fn lut_iq4nl() -> &'static [u8; 16] {
    static LUT: std::sync::OnceLock<[u8; 16]> = std::sync::OnceLock::new();
    LUT.get_or_init(|| std::array::from_fn(|i| (quarrel_quant::nonlinear::KVALUES_IQ4NL[i] as i32 + 128) as u8))
}
