//! Block layout constants (mirroring `ggml/src/ggml-common.h`) and small
//! little-endian field readers/writers shared by all kernels.
//!
//! Blocks are handled as plain `&[u8]` of exactly `BLOCK_*_SIZE` bytes; field
//! offsets are the `*_OFF` constants below. All multi-byte fields are little
//! endian (GGUF files are little endian; ggml assumes a LE host).

use half::f16;

/// Elements per Q4_0 block.
pub const QK4_0: usize = 32;
/// Elements per Q4_1 block.
pub const QK4_1: usize = 32;
/// Elements per Q5_0 block.
pub const QK5_0: usize = 32;
/// Elements per Q5_1 block.
pub const QK5_1: usize = 32;
/// Elements per Q8_0 block.
pub const QK8_0: usize = 32;
/// Elements per Q8_1 block.
pub const QK8_1: usize = 32;
/// Elements per IQ4_NL block.
pub const QK4_NL: usize = 32;
/// Elements per MXFP4 block.
pub const QK_MXFP4: usize = 32;
/// Elements per K-quant super-block.
pub const QK_K: usize = 256;
/// Bytes of packed 6-bit scales/mins in Q4_K / Q5_K.
pub const K_SCALE_SIZE: usize = 12;

/// `block_q4_0 { f16 d; u8 qs[16]; }`
pub const BLOCK_Q4_0_SIZE: usize = 2 + QK4_0 / 2;
/// `block_q4_1 { f16 d; f16 m; u8 qs[16]; }`
pub const BLOCK_Q4_1_SIZE: usize = 4 + QK4_1 / 2;
/// `block_q5_0 { f16 d; u8 qh[4]; u8 qs[16]; }`
pub const BLOCK_Q5_0_SIZE: usize = 2 + 4 + QK5_0 / 2;
/// `block_q5_1 { f16 d; f16 m; u8 qh[4]; u8 qs[16]; }`
pub const BLOCK_Q5_1_SIZE: usize = 4 + 4 + QK5_1 / 2;
/// `block_q8_0 { f16 d; i8 qs[32]; }`
pub const BLOCK_Q8_0_SIZE: usize = 2 + QK8_0;
/// `block_q8_1 { f16 d; f16 s; i8 qs[32]; }` with `s = d * sum(qs)`.
pub const BLOCK_Q8_1_SIZE: usize = 4 + QK8_1;
/// `block_q2_K { u8 scales[16]; u8 qs[64]; f16 d; f16 dmin; }`
pub const BLOCK_Q2_K_SIZE: usize = QK_K / 16 + QK_K / 4 + 4;
/// `block_q3_K { u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d; }`
pub const BLOCK_Q3_K_SIZE: usize = QK_K / 8 + QK_K / 4 + 12 + 2;
/// `block_q4_K { f16 d; f16 dmin; u8 scales[12]; u8 qs[128]; }`
pub const BLOCK_Q4_K_SIZE: usize = 4 + K_SCALE_SIZE + QK_K / 2;
/// `block_q5_K { f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]; }`
pub const BLOCK_Q5_K_SIZE: usize = 4 + K_SCALE_SIZE + QK_K / 8 + QK_K / 2;
/// `block_q6_K { u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d; }`
pub const BLOCK_Q6_K_SIZE: usize = QK_K / 2 + QK_K / 4 + QK_K / 16 + 2;
/// `block_q8_K { f32 d; i8 qs[256]; i16 bsums[16]; }`
pub const BLOCK_Q8_K_SIZE: usize = 4 + QK_K + 2 * (QK_K / 16);
/// `block_iq4_nl { f16 d; u8 qs[16]; }`
pub const BLOCK_IQ4_NL_SIZE: usize = 2 + QK4_NL / 2;
/// `block_mxfp4 { u8 e; u8 qs[16]; }` (`e` is an E8M0 exponent).
pub const BLOCK_MXFP4_SIZE: usize = 1 + QK_MXFP4 / 2;

// Sizes as asserted by ggml-common.h.
const _: () = assert!(BLOCK_Q4_0_SIZE == 18);
const _: () = assert!(BLOCK_Q4_1_SIZE == 20);
const _: () = assert!(BLOCK_Q5_0_SIZE == 22);
const _: () = assert!(BLOCK_Q5_1_SIZE == 24);
const _: () = assert!(BLOCK_Q8_0_SIZE == 34);
const _: () = assert!(BLOCK_Q8_1_SIZE == 36);
const _: () = assert!(BLOCK_Q2_K_SIZE == 84);
const _: () = assert!(BLOCK_Q3_K_SIZE == 110);
const _: () = assert!(BLOCK_Q4_K_SIZE == 144);
const _: () = assert!(BLOCK_Q5_K_SIZE == 176);
const _: () = assert!(BLOCK_Q6_K_SIZE == 210);
const _: () = assert!(BLOCK_Q8_K_SIZE == 292);
const _: () = assert!(BLOCK_IQ4_NL_SIZE == 18);
const _: () = assert!(BLOCK_MXFP4_SIZE == 17);

/// Field offsets inside Q2_K blocks.
pub const Q2_K_SCALES_OFF: usize = 0;
pub const Q2_K_QS_OFF: usize = QK_K / 16;
pub const Q2_K_D_OFF: usize = QK_K / 16 + QK_K / 4;
pub const Q2_K_DMIN_OFF: usize = Q2_K_D_OFF + 2;
/// Field offsets inside Q3_K blocks.
pub const Q3_K_HMASK_OFF: usize = 0;
pub const Q3_K_QS_OFF: usize = QK_K / 8;
pub const Q3_K_SCALES_OFF: usize = QK_K / 8 + QK_K / 4;
pub const Q3_K_D_OFF: usize = Q3_K_SCALES_OFF + 12;
/// Field offsets inside Q4_K blocks.
pub const Q4_K_D_OFF: usize = 0;
pub const Q4_K_DMIN_OFF: usize = 2;
pub const Q4_K_SCALES_OFF: usize = 4;
pub const Q4_K_QS_OFF: usize = 4 + K_SCALE_SIZE;
/// Field offsets inside Q5_K blocks.
pub const Q5_K_D_OFF: usize = 0;
pub const Q5_K_DMIN_OFF: usize = 2;
pub const Q5_K_SCALES_OFF: usize = 4;
pub const Q5_K_QH_OFF: usize = 4 + K_SCALE_SIZE;
pub const Q5_K_QS_OFF: usize = Q5_K_QH_OFF + QK_K / 8;
/// Field offsets inside Q6_K blocks.
pub const Q6_K_QL_OFF: usize = 0;
pub const Q6_K_QH_OFF: usize = QK_K / 2;
pub const Q6_K_SCALES_OFF: usize = QK_K / 2 + QK_K / 4;
pub const Q6_K_D_OFF: usize = Q6_K_SCALES_OFF + QK_K / 16;
/// Field offsets inside Q8_K blocks.
pub const Q8_K_D_OFF: usize = 0;
pub const Q8_K_QS_OFF: usize = 4;
pub const Q8_K_BSUMS_OFF: usize = 4 + QK_K;

const _: () = assert!(Q2_K_DMIN_OFF + 2 == BLOCK_Q2_K_SIZE);
const _: () = assert!(Q3_K_D_OFF + 2 == BLOCK_Q3_K_SIZE);
const _: () = assert!(Q4_K_QS_OFF + QK_K / 2 == BLOCK_Q4_K_SIZE);
const _: () = assert!(Q5_K_QS_OFF + QK_K / 2 == BLOCK_Q5_K_SIZE);
const _: () = assert!(Q6_K_D_OFF + 2 == BLOCK_Q6_K_SIZE);
const _: () = assert!(Q8_K_BSUMS_OFF + 2 * (QK_K / 16) == BLOCK_Q8_K_SIZE);

/// A block module's `QK` (elements per block) and `BLOCK_BYTES` (bytes per block): those of
/// its row `$ty` of the type table.
macro_rules! block_geometry {
    ($ty:ident) => {
        /// Elements per block.
        pub const QK: usize = $crate::QuantType::$ty.info().block_size;
        /// Bytes per block.
        pub const BLOCK_BYTES: usize = $crate::QuantType::$ty.info().type_size;
    };
}
pub(crate) use block_geometry;

/// Read a little-endian f16 at `off` and widen it to f32 (exact).
#[inline]
pub fn read_f16(b: &[u8], off: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[off], b[off + 1]])).to_f32()
}

/// Round `v` to f16 (round-to-nearest-even, like `GGML_FP32_TO_FP16`) and store it.
#[inline]
pub fn write_f16(b: &mut [u8], off: usize, v: f32) {
    b[off..off + 2].copy_from_slice(&f16::from_f32(v).to_bits().to_le_bytes());
}

/// Read a little-endian f32 at `off`.
#[inline]
pub fn read_f32(b: &[u8], off: usize) -> f32 {
    f32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// Store a little-endian f32 at `off`.
#[inline]
pub fn write_f32(b: &mut [u8], off: usize, v: f32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}

/// Read a little-endian u32 at `off`.
#[inline]
pub fn read_u32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// Read a little-endian i16 at `off`.
#[inline]
pub fn read_i16(b: &[u8], off: usize) -> i16 {
    i16::from_le_bytes([b[off], b[off + 1]])
}

/// Panic with a clear message unless `n_elem` elements of a type with
/// `qk`-element / `bs`-byte blocks exactly fill `n_bytes` bytes.
/// Used by the per-type kernels (the top-level API validates first and
/// returns `Err` instead, so it never reaches these panics).
#[inline]
#[track_caller]
pub(crate) fn assert_geometry(what: &str, qk: usize, bs: usize, n_elem: usize, n_bytes: usize) {
    assert!(
        n_elem.is_multiple_of(qk) && n_elem / qk * bs == n_bytes,
        "{what}: {n_elem} elements need a multiple of {qk} elements and {} bytes, got {n_bytes} bytes",
        n_elem / qk * bs
    );
}

/// The blocks of `src` paired with the `qk` values each decodes to in `dst` (a dequantize
/// loop); panics as [`assert_geometry`] unless `src` holds exactly `dst.len()` elements.
#[inline]
#[track_caller]
pub(crate) fn decode_blocks<'a>(
    what: &str,
    qk: usize,
    bs: usize,
    src: &'a [u8],
    dst: &'a mut [f32],
) -> impl Iterator<Item = (&'a [u8], &'a mut [f32])> {
    assert_geometry(what, qk, bs, dst.len(), src.len());
    src.chunks_exact(bs).zip(dst.chunks_exact_mut(qk))
}

/// The `qk` values of `src` paired with the block each encodes to in `dst` (a quantize
/// loop); panics as [`assert_geometry`] unless `dst` holds exactly `src.len()` elements.
#[inline]
#[track_caller]
pub(crate) fn encode_blocks<'a>(
    what: &str,
    qk: usize,
    bs: usize,
    src: &'a [f32],
    dst: &'a mut [u8],
) -> impl Iterator<Item = (&'a [f32], &'a mut [u8])> {
    assert_geometry(what, qk, bs, src.len(), dst.len());
    src.chunks_exact(qk).zip(dst.chunks_exact_mut(bs))
}

/// The (weight block, activation block) pairs of an `n`-element dot product, each operand
/// given as `(bytes, qk, block bytes)`; panics as [`assert_geometry`] (`what` names the
/// weight and the activation) unless both hold exactly `n` elements.
#[inline]
#[track_caller]
pub(crate) fn dot_blocks<'a>(
    what: [&str; 2],
    n: usize,
    (w, w_qk, w_bs): (&'a [u8], usize, usize),
    (a, a_qk, a_bs): (&'a [u8], usize, usize),
) -> impl Iterator<Item = (&'a [u8], &'a [u8])> {
    assert_geometry(what[0], w_qk, w_bs, n, w.len());
    assert_geometry(what[1], a_qk, a_bs, n, a.len());
    w.chunks_exact(w_bs).zip(a.chunks_exact(a_bs))
}
