//! x86-64 kernels: feature detection, shared helpers and the per-level dispatch tables.
//!
//! | file               | contents                                                       |
//! |--------------------|----------------------------------------------------------------|
//! | `legacy.rs`        | AVX2: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4 (1 and R rows) |
//! | `kquants.rs`       | AVX2: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K                               |
//! | `float.rs`         | AVX2 and AVX-512: F32, F16, BF16                                 |
//! | `quantize.rs`      | AVX2: Q8_0, Q8_1, Q8_K activation quantizers                     |
//! | `avx512_legacy.rs` | AVX-512 (+VNNI): the 32-element block types, 1 and R rows        |
//! | `avx512_kquants.rs`| AVX-512 (+VNNI): the K-quants                                    |
//! | `ggml_order.rs`    | Q4_0, Q4_1, Q8_0 in llama.cpp's float order (what matmul uses)   |
//! | `gemm.rs`          | GEMM tiles (prompt processing): dispatch over the files below    |
//! | `gemm_ggml.rs`     | AVX-512 VNNI GEMM tiles bit-identical to `ggml_order.rs`         |
//! | `gemm_wide.rs`     | AVX-512 VNNI 4x16 tiles, same bits as `gemm_ggml.rs`, fewer ops   |
//! | `gemm_kquants.rs`  | AVX-512 GEMM tiles bit-identical to `avx512_kquants.rs`          |
//! | `gemv_ggml.rs`     | AVX-512 VNNI decode GEMV (8 rows) bit-identical to `ggml_order.rs` |
//! | `repack.rs`        | AVX-512 VNNI tiles over 16-row interleaved Q4_0/IQ4_NL/Q4_K (`simd::repack`) |
//! | `repack_avx2.rs`   | their AVX2 twins (bit-identical)                                 |
//! | `attn.rs`          | AVX2: attention runs bit-identical to `simd::attn`'s twins       |
//! | `attn512.rs`       | AVX-512: decode attention (f16 cache), chunked, bit-identical      |
//! | `expf.rs`          | AVX-512: 16-lane `expf` bit-identical to glibc's (softmax)       |
//!
//! No `vpgatherdd`: with the gather-data-sampling microcode fix (Skylake .. Ice Lake /
//! Tiger Lake) a gather costs ~20 ns, so block scales are loaded with scalar loads. The
//! weight kernels prefetch [`PREFETCH_AHEAD`] bytes ahead (rows stream from memory; this
//! measured 20-35% faster single-row GEMV streaming on a Sapphire Rapids VM).
//!
//! Every kernel is an `unsafe fn` with `#[target_feature]`; the dispatch functions below
//! only hand out a kernel after checking (through [`Level::is_supported`]) that the CPU has
//! the features it was compiled for. Kernels check buffer lengths up front (a hard
//! `assert!`), so the raw-pointer loads inside stay within the slices.

/// `fn $name(ty) -> Option<$fn_ty>`: the listed types' kernels (`$kernel`, optionally a
/// const-generic instance), None for the others.
macro_rules! kernel_table {
    ($vis:vis fn $name:ident -> $fn_ty:ty { $($ty:ident => $kernel:ident $(::<$r:literal>)?),* $(,)? }) => {
        $vis fn $name(ty: QuantType) -> Option<$fn_ty> {
            // SAFETY (all arms): the dispatch below (`dot_fn`, `dot4_fn`) only hands a kernel
            // out at a level the CPU supports, whose features the kernel takes.
            Some(match ty {
                $(QuantType::$ty => |n, w, a| unsafe { $kernel $(::<$r>)?(n, w, a) },)*
                _ => return None,
            })
        }
    };
}

/// `dot_fn` and `dot4_fn` over the 32-element block types' kernels of the module it is used
/// in (the AVX2 ones and each AVX-512 flavour have the same names).
macro_rules! legacy_tables {
    ($vis:vis) => {
        kernel_table!($vis fn dot_fn -> DotFn {
            Q4_0 => dot_q4_0, Q4_1 => dot_q4_1, Q5_0 => dot_q5_0, Q5_1 => dot_q5_1,
            Q8_0 => dot_q8_0, IQ4_NL => dot_iq4_nl, MXFP4 => dot_mxfp4,
        });
        // four-row kernels (`R = 4` instances)
        kernel_table!($vis fn dot4_fn -> Dot4Fn {
            Q4_0 => rows_q4_0::<4>, Q4_1 => rows_q4_1::<4>, Q5_0 => rows_q5_0::<4>, Q5_1 => rows_q5_1::<4>,
            Q8_0 => rows_q8_0::<4>, IQ4_NL => rows_iq4_nl::<4>, MXFP4 => rows_mxfp4::<4>,
        });
    };
}

/// `dot_fn` over the K-quants' kernels of the module it is used in.
macro_rules! kquant_table {
    ($vis:vis) => {
        kernel_table!($vis fn dot_fn -> DotFn {
            Q2_K => dot_q2_k, Q3_K => dot_q3_k, Q4_K => dot_q4_k, Q5_K => dot_q5_k, Q6_K => dot_q6_k,
        });
    };
}

pub(crate) mod attn;
pub(crate) mod attn512;
mod avx512_kquants;
mod avx512_legacy;
pub(crate) mod expf;
mod float;
pub(crate) mod gemm;
mod gemm_compact;
mod gemm_float;
mod gemm_ggml;
mod gemm_kquants;
mod gemm_wide;
pub(crate) mod gemv_ggml;
pub(crate) mod ggml_order;
mod kquants;
mod legacy;
mod quantize;
pub(crate) mod repack;
mod repack_avx2;

use super::{Dot4Fn, DotFn, Level, QuantizeRowFn};
use quarrel_core::QuantType;
use std::arch::x86_64::*;

pub(super) fn has_avx2() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
}

pub(super) fn has_avx512() -> bool {
    is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw") && is_x86_feature_detected!("avx512vl")
}

pub(super) fn has_avx512vnni() -> bool {
    is_x86_feature_detected!("avx512vnni")
}

pub(super) fn feature_names() -> Vec<&'static str> {
    let mut f = vec![];
    macro_rules! probe {
        ($($name:tt),*) => {$(
            if is_x86_feature_detected!($name) {
                f.push($name);
            }
        )*};
    }
    probe!("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512vnni", "avx512bf16");
    f
}

/// The kernel of exactly `level` for `ty` or the next lower level's.
/// Callers have checked `level.is_supported()`.
pub(super) fn dot_fn(ty: QuantType, level: Level) -> Option<DotFn> {
    let mut l = level;
    loop {
        let k = match l {
            Level::Avx512Vnni => avx512_legacy::vnni::dot_fn(ty).or_else(|| avx512_kquants::vnni::dot_fn(ty)),
            Level::Avx512 => float::dot_fn_avx512(ty).or_else(|| avx512_legacy::bw::dot_fn(ty)).or_else(|| avx512_kquants::bw::dot_fn(ty)),
            Level::Avx2 => legacy::dot_fn(ty).or_else(|| kquants::dot_fn(ty)).or_else(|| float::dot_fn_avx2(ty)),
            Level::Scalar => return None,
        };
        if k.is_some() {
            return k;
        }
        l = match l {
            Level::Avx512Vnni => Level::Avx512,
            Level::Avx512 => Level::Avx2,
            _ => Level::Scalar,
        };
    }
}

/// Four-row kernels (same fallback rule as [`dot_fn`]); only the 32-element block types
/// have them (the activation side is a large share of their work).
pub(super) fn dot4_fn(ty: QuantType, level: Level) -> Option<Dot4Fn> {
    match level {
        Level::Avx512Vnni => avx512_legacy::vnni::dot4_fn(ty),
        Level::Avx512 => avx512_legacy::bw::dot4_fn(ty),
        Level::Avx2 => legacy::dot4_fn(ty),
        Level::Scalar => None,
    }
}

/// Activation quantizers: the AVX2 ones serve every level (they are a small share of the
/// matmul time). `ggml_x86` picks the flavour of ggml's x86 build for Q8_0 / Q8_1.
pub(super) fn quantize_row_fn(ty: QuantType, level: Level, ggml_x86: bool) -> Option<QuantizeRowFn> {
    match (level >= Level::Avx2, ggml_x86) {
        (false, _) => None,
        (true, false) => quantize::quantize_row_fn::<false>(ty),
        (true, true) => quantize::quantize_row_fn::<true>(ty),
    }
}

// ---------------------------------------------------------------------------------------
// Shared helpers.

/// Panic unless `w` and `a` hold `nb` blocks of `wb` / `ab` bytes (the kernels' only
/// bounds check: everything after it indexes within these lengths).
#[inline(always)]
#[track_caller]
pub(crate) fn check_len(nb: usize, w: &[u8], wb: usize, a: &[u8], ab: usize) {
    assert!(
        w.len() >= nb * wb && a.len() >= nb * ab,
        "simd dot: {nb} blocks need {} weight and {} activation bytes, got {} and {}",
        nb * wb,
        nb * ab,
        w.len(),
        a.len()
    );
}

/// How far ahead of the weights being read [`prefetch`] asks for data.
pub(crate) const PREFETCH_AHEAD: usize = 1024;

/// Prefetch into L1 the `bytes` bytes (a multiple of 64 is best) starting
/// [`PREFETCH_AHEAD`] bytes past `p`. Weight rows stream from memory in order, so this
/// reaches into the rest of the row and then into the next one.
#[inline(always)]
pub(crate) fn prefetch(p: *const u8, bytes: usize) {
    let mut o = 0;
    while o < bytes {
        // SAFETY: prefetches never fault, whatever the address; `wrapping_add` keeps the
        // address computation defined past the end of the slice.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_AHEAD + o) as *const i8) };
        o += 64;
    }
}

/// Little-endian f16 at `p` widened to f32.
///
/// SAFETY: `p..p+2` must be readable; the CPU must have F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn f16_at(p: *const u8) -> f32 {
    let h = std::ptr::read_unaligned(p as *const u16);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)))
}

/// `v`, hidden from the optimizer (an empty `asm!`), so that a u64 assembled from scalar
/// loads is not turned back into a chain of `vpinsrw` (one port-5 shuffle per element).
#[inline(always)]
pub(crate) fn opaque(mut v: u64) -> u64 {
    // SAFETY: the empty template neither reads nor writes memory; `v` stays unchanged.
    unsafe { std::arch::asm!("/* {0} */", inout(reg) v, options(pure, nomem, nostack, preserves_flags)) };
    v
}

/// Little-endian f32 at `p`. SAFETY: `p..p+4` must be readable.
#[inline(always)]
pub(crate) unsafe fn f32_at(p: *const u8) -> f32 {
    std::ptr::read_unaligned(p as *const f32)
}

/// The tests' random values: xorshift64 from `seed`, uniform in [-1.5, 1.5).
#[cfg(test)]
pub(super) fn test_rnd(mut seed: u64) -> impl FnMut() -> f32 {
    move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 3.0
    }
}

/// Horizontal sum of 8 f32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn hsum_ps(v: __m256) -> f32 {
    let lo = _mm256_castps256_ps128(v);
    let hi = _mm256_extractf128_ps(v, 1);
    let s = _mm_add_ps(lo, hi);
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// Horizontal sum of 16 f32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
pub(crate) fn hsum_ps512(v: __m512) -> f32 {
    let lo = _mm512_castps512_ps256(v);
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    hsum_ps(_mm256_add_ps(lo, hi))
}

/// Horizontal sum of 4 f32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn hsum_ps128(s: __m128) -> f32 {
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// 16 bytes of packed nibbles at `p` -> 32 bytes: the low nibbles (elements 0..16) then the
/// high nibbles (elements 16..32), each 0..=15.
///
/// SAFETY: `p..p+16` must be readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn nibbles_32(p: *const u8) -> __m256i {
    let t = _mm_loadu_si128(p as *const __m128i);
    let v = _mm256_set_m128i(_mm_srli_epi16(t, 4), t);
    _mm256_and_si256(v, _mm256_set1_epi8(0x0f))
}

/// The 32 bits of the little-endian u32 at `p` spread to 32 bytes: byte `j` is 0xFF if bit
/// `j` is set, else 0.
///
/// SAFETY: `p..p+4` must be readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn bytes_from_bits_32(p: *const u8) -> __m256i {
    let x = std::ptr::read_unaligned(p as *const u32);
    // byte j <- byte j/8 of x
    let shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x as i32), shuf);
    // set every bit except bit j%8, then test for all-ones
    let others = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe);
    _mm256_cmpeq_epi8(_mm256_or_si256(bytes, others), _mm256_set1_epi64x(-1))
}

/// Signed bytes `x` times signed bytes `y`, summed in groups of 4 into 8 i32 lanes
/// (`|x| * sign(y, x)` through `vpmaddubsw`; `x` or `y` must not be -128 where the other
/// is nonzero: Q8 activations and the weight codes here are within -127..=127).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn mul_sum_i8(x: __m256i, y: __m256i) -> __m256i {
    let ax = _mm256_sign_epi8(x, x);
    let sy = _mm256_sign_epi8(y, x);
    mul_sum_u8_i8(ax, sy)
}

/// Unsigned bytes `x` (each pair product sum must fit i16) times signed bytes `y`, summed in
/// groups of 4 into 8 i32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn mul_sum_u8_i8(x: __m256i, y: __m256i) -> __m256i {
    let dot16 = _mm256_maddubs_epi16(x, y);
    _mm256_madd_epi16(dot16, _mm256_set1_epi16(1))
}
