//! The "legacy" 32-element block formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1.
//!
//! Each submodule exposes the same scalar reference kernels:
//! `dequantize_row(src, dst)`, `quantize_row(src, dst)` (ggml's
//! `quantize_row_*_ref`) and `vec_dot_<partner>(n, w, a)` (ggml's
//! `ggml_vec_dot_*_generic`, same float operation order). They panic on
//! inconsistent buffer sizes; the crate-level API checks sizes first.

pub mod q4_0;
pub mod q4_1;
pub mod q5_0;
pub mod q5_1;
pub mod q8_0;
pub mod q8_1;

/// Split a packed 5th-bit word: element `j` (0..16) of the low half and
/// element `j` of the high half, as ggml does (`xh_0`, `xh_1`), already
/// shifted to bit 4.
#[inline]
pub(crate) fn q5_high_bits(qh: u32, j: usize) -> (u8, u8) {
    let xh_0 = (((qh >> j) << 4) & 0x10) as u8;
    let xh_1 = ((qh >> (j + 12)) & 0x10) as u8;
    (xh_0, xh_1)
}

/// Half a 32-element block: element `j` pairs with element `j + HALF` in one byte.
const HALF: usize = 16;

/// Elements `j` and `j + 16` of a 4-bit block: the low and high nibble of `qs[j]`.
#[inline]
pub(crate) fn q4_pair(qs: &[u8], j: usize) -> (u8, u8) {
    (qs[j] & 0x0F, qs[j] >> 4)
}

/// Elements `j` and `j + 16` of a 5-bit block: the nibbles of `qs[j]` plus their `qh` bits.
#[inline]
pub(crate) fn q5_pair(qs: &[u8], qh: u32, j: usize) -> (u8, u8) {
    let (xh_0, xh_1) = q5_high_bits(qh, j);
    ((qs[j] & 0x0F) | xh_0, (qs[j] >> 4) | xh_1)
}

/// Store the 5-bit values of elements `j` (`xi0`) and `j + 16` (`xi1`): their nibbles in
/// `qs[j]`, their 5th bits in `qh` — the inverse of [`q5_pair`].
#[inline]
pub(crate) fn q5_pack(qs: &mut [u8], qh: &mut u32, j: usize, xi0: u8, xi1: u8) {
    qs[j] = (xi0 & 0x0F) | ((xi1 & 0x0F) << 4);
    *qh |= (((xi0 & 0x10) >> 4) as u32) << j;
    *qh |= (((xi1 & 0x10) >> 4) as u32) << (j + HALF);
}

/// Start a block symmetric around 0 (Q4_0, Q5_0) from its values `x`: `d = max / -levels`,
/// `max` the signed value of largest magnitude, stored as f16 first. Returns `1 / d` (0 for
/// an all-zero block).
#[inline]
pub(crate) fn symmetric_scale(x: &[f32], b: &mut [u8], levels: f32) -> f32 {
    let (_, max) = crate::scan::signed_absmax(x);
    let d = max / -levels;
    let id = crate::scan::inverse_or_zero(d);
    crate::layout::write_f16(b, 0, d);
    id
}

/// Start a scale + min block (Q4_1, Q5_1) from its values `x`: `d = (max - min) / levels`
/// and `m = min`, stored as f16 first. Returns `min` and `1 / d` (0 for a constant block).
#[inline]
pub(crate) fn scale_and_min(x: &[f32], b: &mut [u8], levels: f32) -> (f32, f32) {
    let (min, max) = crate::scan::min_max(x);
    let d = (max - min) / levels;
    let id = crate::scan::inverse_or_zero(d);
    crate::layout::write_f16(b, 0, d);
    crate::layout::write_f16(b, 2, min);
    (min, id)
}

/// One block of `y.len() == 32` values: element pair `pair(j)` through `value`.
#[inline]
pub(crate) fn dequantize_pairs(y: &mut [f32], pair: impl Fn(usize) -> (u8, u8), value: impl Fn(u8) -> f32) {
    for j in 0..HALF {
        let (x0, x1) = pair(j);
        y[j] = value(x0);
        y[j + HALF] = value(x1);
    }
}

/// One block of `x.len() == 32` values to pairs: `store(j, q(x[j]), q(x[j + 16]))`, the
/// inverse walk of [`dequantize_pairs`].
#[inline]
pub(crate) fn quantize_pairs(x: &[f32], q: impl Fn(f32) -> u8, mut store: impl FnMut(usize, u8, u8)) {
    for j in 0..HALF {
        store(j, q(x[j]), q(x[j + HALF]));
    }
}

/// ggml's `sumi0 + sumi1` of the legacy dot products: the 16 element pairs `pair(j)` of a
/// 32-element block against the `i8` quants `yq` (integer, exact).
#[inline]
pub(crate) fn dot_pairs(yq: &[u8], pair: impl Fn(usize) -> (i32, i32)) -> i32 {
    let (mut sumi0, mut sumi1) = (0i32, 0i32);
    for j in 0..HALF {
        let (x0, x1) = pair(j);
        sumi0 += x0 * yq[j] as i8 as i32;
        sumi1 += x1 * yq[j + HALF] as i8 as i32;
    }
    sumi0 + sumi1
}

/// One Q8_0 / Q8_1 block `b` (`f16 d` first, the `i8` quants from `qs_off`): `d * q`.
#[inline]
pub(crate) fn dequantize_i8(b: &[u8], qs_off: usize, y: &mut [f32]) {
    let d = crate::layout::read_f16(b, 0);
    for (o, &q) in y.iter_mut().zip(&b[qs_off..]) {
        *o = q as i8 as f32 * d;
    }
}

/// One Q8_0 / Q8_1 block `b` from the values `x`: `d = amax / 127` stored as f16 first, the
/// quants `q = round(x / d)` (half away from zero) from `qs_off`. Returns `d` (as computed,
/// before the f16 rounding) and the sum of the quants.
#[inline]
pub(crate) fn quantize_i8(x: &[f32], b: &mut [u8], qs_off: usize) -> (f32, i32) {
    let d = crate::scan::absmax_c(x) / 127.0;
    let id = crate::scan::inverse_or_zero(d);
    crate::layout::write_f16(b, 0, d);
    let mut sum = 0i32;
    for (o, &v) in b[qs_off..].iter_mut().zip(x) {
        let q = (v * id).round() as i8;
        *o = q as u8;
        sum += q as i32;
    }
    (d, sum)
}
