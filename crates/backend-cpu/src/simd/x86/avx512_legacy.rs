//! AVX-512 kernels for the 32-element block types, two blocks per 512-bit vector and
//! 16 blocks per step: the 8 block-pair partial dots (16 i32 lanes each) are reduced to one
//! vector of 16 block sums with an unpack/add tree, then scaled by 16 block scales loaded
//! and converted (`vcvtph2ps`) at once. Leftover blocks (< 16) go through the
//! AVX2 kernel.
//!
//! Two instantiations: `Avx512Vnni` (`vpdpbusd`; signed x signed as `(x ^ 0x80) · y - 128 · Σy`)
//! and `Avx512` (`vpmaddubsw` + `vpmaddwd`; signed x signed through the sign trick).

use super::legacy::{self, QK};
use super::*;
use quarrel_quant::{KVALUES_IQ4NL, KVALUES_MXFP4};

/// Block order of the 16 sums produced by [`reduce16`] (`ORDER16`):
/// `[0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15]`.
/// Sums of 16 blocks from 8 block-pair vectors (`p[k]` = blocks 2k | 2k+1, 8 i32 each),
/// in the block order `ORDER16` above.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
pub(crate) fn reduce16(p: &[__m512i; 8]) -> __m512i {
    let t = |a: __m512i, b: __m512i| _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
    let u = |a: __m512i, b: __m512i| _mm512_add_epi32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b));
    // per 128-bit lane l: u0 = [p0, p1, p2, p3] lane sums, u1 = [p4 .. p7]
    let u0 = u(t(p[0], p[1]), t(p[2], p[3]));
    let u1 = u(t(p[4], p[5]), t(p[6], p[7]));
    // lanes 0+1 hold the first block of each pair, lanes 2+3 the second
    let a = _mm512_shuffle_i32x4::<0b10_00_10_00>(u0, u1);
    let b = _mm512_shuffle_i32x4::<0b11_01_11_01>(u0, u1);
    _mm512_add_epi32(a, b)
}

/// The 16 f16 at `base + ORDER16[k] * stride + off` as f32 (scalar loads: `vpgatherdd` is
/// very slow on CPUs with the gather-data-sampling microcode fix).
///
/// SAFETY: each `base + b * stride + off .. +2` (b < 16) readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn f16x16_at(base: *const u8, stride: usize, off: usize) -> __m512 {
    // four u16 per u64 in general registers, then 4 vector inserts (`vpinsrw` per value
    // would put 16 shuffle uops on port 5)
    let r = |k: usize| std::ptr::read_unaligned(base.add(k * stride + off) as *const u16) as u64;
    let q = |a: usize, b: usize, c: usize, d: usize| opaque(r(a) | r(b) << 16 | r(c) << 32 | r(d) << 48) as i64;
    let v = _mm256_setr_epi64x(q(0, 2, 4, 6), q(1, 3, 5, 7), q(8, 10, 12, 14), q(9, 11, 13, 15));
    _mm512_cvtph_ps(v)
}

/// The f16 pairs `(d, m)` at the start of 16 blocks (`base + ORDER16[k] * stride`) as two
/// vectors of f32: one u32 load per block, two per general register.
///
/// SAFETY: each `base + b * stride .. +4` (b < 16) readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn dm16_at(base: *const u8, stride: usize) -> (__m512, __m512) {
    let r = |k: usize| std::ptr::read_unaligned(base.add(k * stride) as *const u32) as u64;
    let q = |a: usize, b: usize| opaque(r(a) | r(b) << 32) as i64;
    let v = _mm512_setr_epi64(q(0, 2), q(4, 6), q(1, 3), q(5, 7), q(8, 10), q(12, 14), q(9, 11), q(13, 15));
    let d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v));
    let m = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(v)));
    (d, m)
}

/// `2^(e-128)` for the 16 E8M0 bytes at `base + ORDER16[k] * stride`.
/// SAFETY: each `base + b * stride` (b < 16) readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn e8m0x16_at(base: *const u8, stride: usize) -> __m512 {
    let r = |k: usize| *base.add(k * stride) as i32;
    let e = _mm512_setr_epi32(r(0), r(2), r(4), r(6), r(1), r(3), r(5), r(7), r(8), r(10), r(12), r(14), r(9), r(11), r(13), r(15));
    let normal = _mm512_slli_epi32::<23>(_mm512_sub_epi32(e, _mm512_set1_epi32(1)));
    let sub = _mm512_sllv_epi32(_mm512_set1_epi32(0x0020_0000), e);
    let is_normal = _mm512_cmpgt_epi32_mask(e, _mm512_set1_epi32(1));
    _mm512_castsi512_ps(_mm512_mask_blend_epi32(is_normal, sub, normal))
}

/// 32 bytes at `p0` and 32 at `p1` as one vector. SAFETY: both ranges readable (the masked
/// load touches only `p1..p1+32`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn load2x32(p0: *const u8, p1: *const u8) -> __m512i {
    // merge-masked load (load + p05 uop) rather than `vinserti64x4` (load + p5 uop)
    let a = _mm512_castsi256_si512(_mm256_loadu_si256(p0 as *const __m256i));
    _mm512_mask_loadu_epi8(a, 0xFFFF_FFFF_0000_0000, p1.wrapping_sub(32) as *const i8)
}

/// Two blocks of 16 packed-nibble bytes -> 64 codes 0..=15 in element order
/// (block 0 low nibbles, block 0 high, block 1 low, block 1 high).
/// SAFETY: `p0..p0+16`, `p1..p1+16` readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn nibbles2x32(p0: *const u8, p1: *const u8) -> __m512i {
    let a = _mm512_broadcast_i32x4(_mm_loadu_si128(p0 as *const __m128i));
    let v = _mm512_mask_broadcast_i32x4(a, 0xFF00, _mm_loadu_si128(p1 as *const __m128i));
    let v = _mm512_mask_srli_epi16::<4>(v, 0xFF00_FF00, v);
    _mm512_and_si512(v, _mm512_set1_epi8(0x0F))
}

/// Add 16 to the code bytes whose bit is set in the two Q5 `qh` words at `h0`, `h1`.
/// SAFETY: `h0..h0+4`, `h1..h1+4` readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn add_q5_bits(q: __m512i, h0: *const u8, h1: *const u8) -> __m512i {
    let m0 = std::ptr::read_unaligned(h0 as *const u32) as u64;
    let m1 = std::ptr::read_unaligned(h1 as *const u32) as u64;
    _mm512_mask_add_epi8(q, m0 | (m1 << 32), q, _mm512_set1_epi8(16))
}

/// A 16-entry codebook in all four 128-bit lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
pub(crate) fn codebook512(k: &[i8; 16]) -> __m512i {
    // SAFETY: `k` is 16 readable bytes.
    _mm512_broadcast_i32x4(unsafe { _mm_loadu_si128(k.as_ptr() as *const __m128i) })
}

/// Defines one kernel (`$name`, one row) and its `R`-row form (`$rows::<R>`, sharing the
/// activation work): `act(y0, y1)` = `(yv, off)` for an activation block pair (the 64 bytes
/// and a row-independent term, or zero), `partial(x0, x1, yv, off)` = the weight block pair's
/// integer dots, `wscales(xb)` / `ascales(yb)` = `(d, m)` of 16 blocks in `ORDER16` (`m` used
/// when `$has_m`), `$tail` = the AVX2 `R`-row kernel for the leftover blocks.
macro_rules! dot16 {
    (
        $features:literal, $name:ident, $rows:ident, $wb:expr, $ab:expr, $tail:ident, has_m: $has_m:expr,
        act: |$y0:ident, $y1:ident| $act:expr,
        partial: |$x0:ident, $x1:ident, $yv:ident, $off:ident| $partial:expr,
        wscales: |$xs:ident| $wscales:expr,
        ascales: |$ys:ident| $ascales:expr $(,)?
    ) => {
        /// SAFETY: the CPU has the features of this module's level.
        #[target_feature(enable = $features)]
        pub(crate) unsafe fn $name(n: usize, w: &[u8], a: &[u8]) -> f32 {
            $rows::<1>(n, [w], a)[0]
        }

        /// `R` rows. SAFETY: the CPU has the features of this module's level.
        #[target_feature(enable = $features)]
        pub(crate) unsafe fn $rows<const R: usize>(n: usize, w: [&[u8]; R], a: &[u8]) -> [f32; R] {
            const WB: usize = $wb;
            const AB: usize = $ab;
            let nb = n / QK;
            for wr in &w {
                check_len(nb, wr, WB, a, AB);
            }
            let wp = w.map(|s| s.as_ptr());
            let ap = a.as_ptr();
            let mut acc = [_mm512_setzero_ps(); R];
            let mut extra = [_mm512_setzero_ps(); R];
            let mut i = 0;
            while i + 16 <= nb {
                let yb = ap.add(i * AB);
                let mut yv = [_mm512_setzero_si512(); 8];
                let mut off = [_mm512_setzero_si512(); 8];
                for k in 0..8 {
                    let ($y0, $y1) = (yb.add(2 * k * AB), yb.add((2 * k + 1) * AB));
                    (yv[k], off[k]) = $act;
                }
                let (ad, am) = {
                    let $ys = yb;
                    $ascales
                };
                for r in 0..R {
                    let xb = wp[r].add(i * WB);
                    prefetch(xb, 16 * WB);
                    let mut p = [_mm512_setzero_si512(); 8];
                    for k in 0..8 {
                        let ($x0, $x1) = (xb.add(2 * k * WB), xb.add((2 * k + 1) * WB));
                        let ($yv, $off) = (yv[k], off[k]);
                        p[k] = $partial;
                    }
                    let sums = _mm512_cvtepi32_ps(reduce16(&p));
                    let (wd, wm) = {
                        let $xs = xb;
                        $wscales
                    };
                    acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(wd, ad), sums, acc[r]);
                    if $has_m {
                        extra[r] = _mm512_fmadd_ps(wm, am, extra[r]);
                    }
                }
                i += 16;
            }
            let mut out = if i < nb { legacy::$tail::<R>((nb - i) * QK, w.map(|s| &s[i * WB..]), &a[i * AB..]) } else { [0.0; R] };
            for r in 0..R {
                out[r] += hsum_ps512(acc[r]) + hsum_ps512(extra[r]);
            }
            out
        }
    };
}

/// Defines the 7 kernels (and their `R`-row forms) in a module for one instruction flavour:
/// `$features` is the target-feature string, `udot(u, s)` the u8 x i8 dot in 16 i32 lanes
/// (groups of 4), `sact(y)` the row-independent part of an i8 x i8 dot with activation `y`
/// and `sdot(x, y, sact)` the i8 x i8 dot.
macro_rules! legacy_kernels {
    ($features:literal, $udot:expr, $sact:expr, $sdot:expr) => {
        use super::*;

        legacy_tables!(pub(crate));

        #[inline]
        #[target_feature(enable = $features)]
        fn udot(u: __m512i, s: __m512i) -> __m512i {
            ($udot)(u, s)
        }

        /// `(y, sact(y))` for an activation block pair.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn sact(y0: *const u8, y1: *const u8) -> (__m512i, __m512i) {
            let y = load2x32(y0, y1);
            (y, ($sact)(y))
        }

        #[inline]
        #[target_feature(enable = $features)]
        fn sdot(x: __m512i, y: __m512i, sy: __m512i) -> __m512i {
            ($sdot)(x, y, sy)
        }

        /// [`sdot`] of the codebook values `k` of the nibbles at `x0`, `x1` (16 bytes each).
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn codebook_sdot(k: &[i8; 16], x0: *const u8, x1: *const u8, y: __m512i, sy: __m512i) -> __m512i {
            sdot(_mm512_shuffle_epi8(codebook512(k), nibbles2x32(x0, x1)), y, sy)
        }

        /// `(y, udot(c, y))` for the activation block pair payloads at `y0`, `y1`.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn act_offset(y0: *const u8, y1: *const u8, c: i8) -> (__m512i, __m512i) {
            let y = load2x32(y0, y1);
            (y, udot(_mm512_set1_epi8(c), y))
        }

        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn act_plain(y0: *const u8, y1: *const u8) -> (__m512i, __m512i) {
            (load2x32(y0, y1), _mm512_setzero_si512())
        }

        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn d16(b: *const u8, stride: usize) -> (__m512, __m512) {
            (f16x16_at(b, stride, 0), _mm512_setzero_ps())
        }

        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn dm16(b: *const u8, stride: usize) -> (__m512, __m512) {
            dm16_at(b, stride)
        }

        dot16!($features, dot_q4_0, rows_q4_0, 18, 34, rows_q4_0, has_m: false,
            act: |y0, y1| act_offset(y0.add(2), y1.add(2), 8),
            partial: |x0, x1, y, cy| _mm512_sub_epi32(udot(nibbles2x32(x0.add(2), x1.add(2)), y), cy),
            wscales: |xb| d16(xb, WB),
            ascales: |yb| d16(yb, AB),
        );
        dot16!($features, dot_q4_1, rows_q4_1, 20, 36, rows_q4_1, has_m: true,
            act: |y0, y1| act_plain(y0.add(4), y1.add(4)),
            partial: |x0, x1, y, _o| udot(nibbles2x32(x0.add(4), x1.add(4)), y),
            wscales: |xb| dm16(xb, WB),
            ascales: |yb| dm16(yb, AB),
        );
        dot16!($features, dot_q5_0, rows_q5_0, 22, 34, rows_q5_0, has_m: false,
            act: |y0, y1| act_offset(y0.add(2), y1.add(2), 16),
            partial: |x0, x1, y, cy| _mm512_sub_epi32(
                udot(add_q5_bits(nibbles2x32(x0.add(6), x1.add(6)), x0.add(2), x1.add(2)), y),
                cy,
            ),
            wscales: |xb| d16(xb, WB),
            ascales: |yb| d16(yb, AB),
        );
        dot16!($features, dot_q5_1, rows_q5_1, 24, 36, rows_q5_1, has_m: true,
            act: |y0, y1| act_plain(y0.add(4), y1.add(4)),
            partial: |x0, x1, y, _o| udot(add_q5_bits(nibbles2x32(x0.add(8), x1.add(8)), x0.add(4), x1.add(4)), y),
            wscales: |xb| dm16(xb, WB),
            ascales: |yb| dm16(yb, AB),
        );
        dot16!($features, dot_q8_0, rows_q8_0, 34, 34, rows_q8_0, has_m: false,
            act: |y0, y1| sact(y0.add(2), y1.add(2)),
            partial: |x0, x1, y, sy| sdot(load2x32(x0.add(2), x1.add(2)), y, sy),
            wscales: |xb| d16(xb, WB),
            ascales: |yb| d16(yb, AB),
        );
        dot16!($features, dot_iq4_nl, rows_iq4_nl, 18, 34, rows_iq4_nl, has_m: false,
            act: |y0, y1| sact(y0.add(2), y1.add(2)),
            partial: |x0, x1, y, sy| codebook_sdot(&KVALUES_IQ4NL, x0.add(2), x1.add(2), y, sy),
            wscales: |xb| d16(xb, WB),
            ascales: |yb| d16(yb, AB),
        );
        dot16!($features, dot_mxfp4, rows_mxfp4, 17, 34, rows_mxfp4, has_m: false,
            act: |y0, y1| sact(y0.add(2), y1.add(2)),
            partial: |x0, x1, y, sy| codebook_sdot(&KVALUES_MXFP4, x0.add(1), x1.add(1), y, sy),
            wscales: |xb| (e8m0x16_at(xb, WB), _mm512_setzero_ps()),
            ascales: |yb| d16(yb, AB),
        );
    };
}

/// AVX512F/BW/VL without VNNI.
pub(crate) mod bw {
    legacy_kernels!(
        "avx2,fma,f16c,avx512f,avx512bw,avx512vl",
        |u: __m512i, s: __m512i| _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1)),
        |_y: __m512i| _mm512_setzero_si512(),
        |x: __m512i, y: __m512i, _sy: __m512i| {
            // |x| * (y with the sign of x); x, y within -127..=127
            let neg = _mm512_movepi8_mask(x);
            let sy = _mm512_mask_sub_epi8(y, neg, _mm512_setzero_si512(), y);
            udot(_mm512_abs_epi8(x), sy)
        }
    );
}

/// AVX512F/BW/VL + VNNI.
pub(crate) mod vnni {
    legacy_kernels!(
        "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
        |u: __m512i, s: __m512i| _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, s),
        // (x + 128) · y - 128 · Σy
        |y: __m512i| _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(-128), y),
        |x: __m512i, y: __m512i, sy: __m512i| { _mm512_sub_epi32(udot(_mm512_xor_si512(x, _mm512_set1_epi8(-128)), y), sy) }
    );
}
