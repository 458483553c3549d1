//! AVX2 + FMA + F16C kernels for the 32-element block types: Q4_0, Q5_0, Q8_0, IQ4_NL and
//! MXFP4 against Q8_0 activations, Q4_1 and Q5_1 against Q8_1.
//!
//! Blocks go in groups of 8: each block's weights are expanded to 32 bytes and dotted with
//! the activation bytes into 8 i32 lanes (`vpmaddubsw` + `vpmaddwd`); a `vphaddd` tree
//! reduces the 8 blocks to one vector of 8 block sums, which is converted to f32 and
//! multiplied by the 8 block scales, converted (`vcvtph2ps`) eight at a time. Leftover
//! blocks (< 8) go one at a time.

use super::*;
use quarrel_quant::{E8M0_TO_FP32_HALF_BITS, KVALUES_IQ4NL, KVALUES_MXFP4};

legacy_tables!(pub(super));

pub(crate) const QK: usize = 32;

/// `[sum(p[0]), ..., sum(p[7])]`: the 8 i32 lanes of each input summed.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn hsum8_epi32(p: &[__m256i; 8]) -> __m256i {
    let h01 = _mm256_hadd_epi32(p[0], p[1]);
    let h23 = _mm256_hadd_epi32(p[2], p[3]);
    let h45 = _mm256_hadd_epi32(p[4], p[5]);
    let h67 = _mm256_hadd_epi32(p[6], p[7]);
    // per 128-bit lane: [p0, p1, p2, p3] partial sums (low lane: elements 0..4, high: 4..8)
    let q0 = _mm256_hadd_epi32(h01, h23);
    let q1 = _mm256_hadd_epi32(h45, h67);
    let lo = _mm256_permute2x128_si256(q0, q1, 0x20);
    let hi = _mm256_permute2x128_si256(q0, q1, 0x31);
    _mm256_add_epi32(lo, hi)
}

/// The 8 f16 at `base + k * stride + off` (k = 0..8) as f32. (Scalar loads: `vpgatherdd`
/// is very slow on CPUs with the gather-data-sampling microcode fix.)
///
/// SAFETY: each `base + k * stride + off .. +2` readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn f16x8_at(base: *const u8, stride: usize, off: usize) -> __m256 {
    // four u16 per u64 in general registers, then 2 vector inserts (`vpinsrw` per value
    // would put 8 shuffle uops on port 5)
    let r = |k: usize| std::ptr::read_unaligned(base.add(k * stride + off) as *const u16) as u64;
    let q = |a: usize| opaque(r(a) | r(a + 1) << 16 | r(a + 2) << 32 | r(a + 3) << 48) as i64;
    _mm256_cvtph_ps(_mm_set_epi64x(q(4), q(0)))
}

/// The 8 bytes at `base + k * stride` (k = 0..8) zero-extended to i32 lanes.
/// SAFETY: each `base + k * stride` readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn u8x8_at(base: *const u8, stride: usize) -> __m256i {
    let r = |k: usize| *base.add(k * stride) as i32;
    _mm256_setr_epi32(r(0), r(1), r(2), r(3), r(4), r(5), r(6), r(7))
}

/// `2^(e-128)` for the E8M0 byte `e` in each i32 lane (ggml's
/// `E8M0_TO_FP32_HALF`, subnormal for e < 2).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn e8m0_half8(e: __m256i) -> __m256 {
    let normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    let sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x0020_0000), e);
    let is_normal = _mm256_cmpgt_epi32(e, _mm256_set1_epi32(1));
    _mm256_castsi256_ps(_mm256_blendv_epi8(sub, normal, is_normal))
}

/// `2^(e-128)` (ggml's `E8M0_TO_FP32_HALF`).
#[inline(always)]
pub(crate) fn e8m0_half(e: u8) -> f32 {
    f32::from_bits(E8M0_TO_FP32_HALF_BITS[e as usize])
}

/// 16-entry signed codebook broadcast to both 128-bit lanes (for `vpshufb` lookups).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn codebook256(k: &[i8; 16]) -> __m256i {
    // SAFETY: `k` is 16 readable bytes.
    let t = unsafe { _mm_loadu_si128(k.as_ptr() as *const __m128i) };
    _mm256_broadcastsi128_si256(t)
}

/// Defines an AVX2 dot kernel over 32-element blocks: `$rows::<R>` dots `R` weight rows with
/// one activation row (sharing the activation loads, offsets and scales), `$name` is the
/// one-row `DotFn`.
///
/// * `act(y)`: `(yv, off)` for the activation block at `y`: its 32 bytes and a row-independent
///   term the partial may use (e.g. `c * y` pair sums), or zero;
/// * `partial(x, yv, off)`: the block's integer dot as 8 i32 lanes;
/// * `wscales(xb)` / `ascales(yb)`: `(d, m)` of 8 weight / activation blocks as f32 (`m`: the
///   Q4_1/Q5_1 min and the Q8_1 `s`, used when `$has_m`);
/// * `wscale1(x)` / `ascale1(y)`: the same for one block, as scalars.
macro_rules! dot8_kernel {
    (
        $(#[$meta:meta])* $name:ident, $rows:ident, $wb:expr, $ab:expr, has_m: $has_m:expr,
        act: |$y:ident| $act:expr,
        partial: |$x:ident, $yv:ident, $off:ident| $partial:expr,
        wscales: |$xs:ident| $wscales:expr,
        ascales: |$ys:ident| $ascales:expr,
        wscale1: |$x1:ident| $wscale1:expr,
        ascale1: |$y1:ident| $ascale1:expr $(,)?
    ) => {
        $(#[$meta])*
        /// SAFETY: AVX2+FMA+F16C.
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(crate) unsafe fn $name(n: usize, w: &[u8], a: &[u8]) -> f32 {
            $rows::<1>(n, [w], a)[0]
        }

        /// `R` rows of the kernel above. SAFETY: AVX2+FMA+F16C.
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(crate) unsafe fn $rows<const R: usize>(n: usize, w: [&[u8]; R], a: &[u8]) -> [f32; R] {
            const WB: usize = $wb;
            const AB: usize = $ab;
            let nb = n / QK;
            for wr in &w {
                check_len(nb, wr, WB, a, AB);
            }
            let wp = w.map(|s| s.as_ptr());
            let ap = a.as_ptr();
            let mut acc = [_mm256_setzero_ps(); R];
            let mut extra = [_mm256_setzero_ps(); R];
            let mut i = 0;
            while i + 8 <= nb {
                let yb = ap.add(i * AB);
                let mut yv = [_mm256_setzero_si256(); 8];
                let mut off = [_mm256_setzero_si256(); 8];
                for k in 0..8 {
                    let $y = yb.add(k * AB);
                    (yv[k], off[k]) = $act;
                }
                let (ad, am) = {
                    let $ys = yb;
                    $ascales
                };
                for r in 0..R {
                    let xb = wp[r].add(i * WB);
                    prefetch(xb, 8 * WB);
                    let mut p = [_mm256_setzero_si256(); 8];
                    for k in 0..8 {
                        let ($x, $yv, $off) = (xb.add(k * WB), yv[k], off[k]);
                        p[k] = $partial;
                    }
                    let sums = _mm256_cvtepi32_ps(hsum8_epi32(&p));
                    let (wd, wm) = {
                        let $xs = xb;
                        $wscales
                    };
                    acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(wd, ad), sums, acc[r]);
                    if $has_m {
                        extra[r] = _mm256_fmadd_ps(wm, am, extra[r]);
                    }
                }
                i += 8;
            }
            let mut tail = [_mm256_setzero_ps(); R];
            let mut tail_extra = [0.0f32; R];
            while i < nb {
                let (ad, am): (f32, f32) = {
                    let $y1 = ap.add(i * AB);
                    $ascale1
                };
                let ($yv, $off) = {
                    let $y = ap.add(i * AB);
                    $act
                };
                for r in 0..R {
                    let $x = wp[r].add(i * WB);
                    let p = $partial;
                    let (wd, wm): (f32, f32) = {
                        let $x1 = $x;
                        $wscale1
                    };
                    tail[r] = _mm256_fmadd_ps(_mm256_set1_ps(wd * ad), _mm256_cvtepi32_ps(p), tail[r]);
                    if $has_m {
                        tail_extra[r] += wm * am;
                    }
                }
                i += 1;
            }
            let mut out = [0.0f32; R];
            for r in 0..R {
                out[r] = hsum_ps(_mm256_add_ps(acc[r], tail[r])) + (hsum_ps(extra[r]) + tail_extra[r]);
            }
            out
        }
    };
}

/// `sum((q - c) * y)` in 8 i32 lanes for unsigned codes `q` (pair sums < 2^15), given
/// `cy = vpmaddubsw(c, y)`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn dot_offset(q: __m256i, y: __m256i, cy: __m256i) -> __m256i {
    let p = _mm256_sub_epi16(_mm256_maddubs_epi16(q, y), cy);
    _mm256_madd_epi16(p, _mm256_set1_epi16(1))
}

/// `(y, vpmaddubsw(c, y))` for the 32 activation bytes at `p`. SAFETY: `p..p+32` readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn act_offset(p: *const u8, c: i8) -> (__m256i, __m256i) {
    let y = load32(p);
    (y, _mm256_maddubs_epi16(_mm256_set1_epi8(c), y))
}

/// `(y, 0)` for the 32 activation bytes at `p`. SAFETY: `p..p+32` readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn act_plain(p: *const u8) -> (__m256i, __m256i) {
    (load32(p), _mm256_setzero_si256())
}

/// `(d, 0)` of 8 blocks with the f16 `d` at offset 0. SAFETY: as [`f16x8_at`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn d8(b: *const u8, stride: usize) -> (__m256, __m256) {
    (f16x8_at(b, stride, 0), _mm256_setzero_ps())
}

/// `(d, m)` of 8 blocks with f16 `d` at offset 0 and `m` at 2: one u32 load per block, two
/// per general register. SAFETY: each `b + k * stride .. +4` (k < 8) readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dm8(b: *const u8, stride: usize) -> (__m256, __m256) {
    let r = |k: usize| std::ptr::read_unaligned(b.add(k * stride) as *const u32) as u64;
    let q = |a: usize| opaque(r(a) | r(a + 1) << 32) as i64;
    let v = _mm256_setr_epi64x(q(0), q(2), q(4), q(6));
    (f16x8::<false>(v), f16x8::<true>(v))
}

/// The f16 in the low (`HI = false`) or high half of each u32 lane of `v`, as 8 f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn f16x8<const HI: bool>(v: __m256i) -> __m256 {
    let (a, b) = if HI { (2, 3) } else { (0, 1) };
    // the same control in both 128-bit lanes: the four f16 into the low 8 bytes, zeros above
    let ctl = _mm256_broadcastsi128_si256(_mm_setr_epi8(a, b, a + 4, b + 4, a + 8, b + 8, a + 12, b + 12, -1, -1, -1, -1, -1, -1, -1, -1));
    let v = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(v, ctl), 0b00_00_10_00);
    _mm256_cvtph_ps(_mm256_castsi256_si128(v))
}

/// SAFETY: `p..p+32` readable.
#[inline(always)]
unsafe fn load32(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

/// 5-bit codes of a Q5 block: nibbles at `qs`, 5th bits from the u32 at `qh`.
/// SAFETY: `qs..qs+16`, `qh..qh+4` readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_codes(qs: *const u8, qh: *const u8) -> __m256i {
    let hi = _mm256_and_si256(bytes_from_bits_32(qh), _mm256_set1_epi8(0x10));
    _mm256_or_si256(nibbles_32(qs), hi)
}

dot8_kernel!(
    /// Q4_0 · Q8_0: `d * sum((nibble - 8) * y)`.
    dot_q4_0, rows_q4_0, 18, 34, has_m: false,
    act: |y| act_offset(y.add(2), 8),
    partial: |x, y, cy| dot_offset(nibbles_32(x.add(2)), y, cy),
    wscales: |xb| d8(xb, WB),
    ascales: |yb| d8(yb, AB),
    wscale1: |x| (f16_at(x), 0.0),
    ascale1: |y| (f16_at(y), 0.0),
);

dot8_kernel!(
    /// Q4_1 · Q8_1: `dx * dy * sum(nibble * y) + m * s`.
    dot_q4_1, rows_q4_1, 20, 36, has_m: true,
    act: |y| act_plain(y.add(4)),
    partial: |x, y, _o| mul_sum_u8_i8(nibbles_32(x.add(4)), y),
    wscales: |xb| dm8(xb, WB),
    ascales: |yb| dm8(yb, AB),
    wscale1: |x| (f16_at(x), f16_at(x.add(2))),
    ascale1: |y| (f16_at(y), f16_at(y.add(2))),
);

dot8_kernel!(
    /// Q5_0 · Q8_0: `d * sum((code - 16) * y)`.
    dot_q5_0, rows_q5_0, 22, 34, has_m: false,
    act: |y| act_offset(y.add(2), 16),
    partial: |x, y, cy| dot_offset(q5_codes(x.add(6), x.add(2)), y, cy),
    wscales: |xb| d8(xb, WB),
    ascales: |yb| d8(yb, AB),
    wscale1: |x| (f16_at(x), 0.0),
    ascale1: |y| (f16_at(y), 0.0),
);

dot8_kernel!(
    /// Q5_1 · Q8_1: `dx * dy * sum(code * y) + m * s`.
    dot_q5_1, rows_q5_1, 24, 36, has_m: true,
    act: |y| act_plain(y.add(4)),
    partial: |x, y, _o| mul_sum_u8_i8(q5_codes(x.add(8), x.add(4)), y),
    wscales: |xb| dm8(xb, WB),
    ascales: |yb| dm8(yb, AB),
    wscale1: |x| (f16_at(x), f16_at(x.add(2))),
    ascale1: |y| (f16_at(y), f16_at(y.add(2))),
);

dot8_kernel!(
    /// Q8_0 · Q8_0.
    dot_q8_0, rows_q8_0, 34, 34, has_m: false,
    act: |y| act_plain(y.add(2)),
    partial: |x, y, _o| mul_sum_i8(load32(x.add(2)), y),
    wscales: |xb| d8(xb, WB),
    ascales: |yb| d8(yb, AB),
    wscale1: |x| (f16_at(x), 0.0),
    ascale1: |y| (f16_at(y), 0.0),
);

dot8_kernel!(
    /// IQ4_NL · Q8_0: nibbles looked up in the codebook with `vpshufb`.
    dot_iq4_nl, rows_iq4_nl, 18, 34, has_m: false,
    act: |y| act_plain(y.add(2)),
    partial: |x, y, _o| mul_sum_i8(_mm256_shuffle_epi8(codebook256(&KVALUES_IQ4NL), nibbles_32(x.add(2))), y),
    wscales: |xb| d8(xb, WB),
    ascales: |yb| d8(yb, AB),
    wscale1: |x| (f16_at(x), 0.0),
    ascale1: |y| (f16_at(y), 0.0),
);

dot8_kernel!(
    /// MXFP4 · Q8_0: E2M1 codebook (doubled) with the halved E8M0 scale.
    dot_mxfp4, rows_mxfp4, 17, 34, has_m: false,
    act: |y| act_plain(y.add(2)),
    partial: |x, y, _o| mul_sum_i8(_mm256_shuffle_epi8(codebook256(&KVALUES_MXFP4), nibbles_32(x.add(1))), y),
    wscales: |xb| (e8m0_half8(u8x8_at(xb, WB)), _mm256_setzero_ps()),
    ascales: |yb| d8(yb, AB),
    wscale1: |x| (e8m0_half(*x), 0.0),
    ascale1: |y| (f16_at(y), 0.0),
);
