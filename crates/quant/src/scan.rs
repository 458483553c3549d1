//! Block statistics the reference quantizers share, each written the way ggml's
//! `quantize_row_*_ref` computes it (comparison order, NaN behaviour), so the bytes stay
//! bit-identical.

/// `(amax, max)`: the largest magnitude and the value that has it, sign kept (the first on
/// ties; NaN never wins). ggml's `amax`/`max` loop of the symmetric quantizers.
#[inline]
pub(crate) fn signed_absmax(x: &[f32]) -> (f32, f32) {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    (amax, max)
}

/// The largest magnitude with ggml's `MAX(a, b) = a > b ? a : b` (a NaN propagates as in C).
#[inline]
pub(crate) fn absmax_c(x: &[f32]) -> f32 {
    let mut amax = 0.0f32;
    for &v in x {
        amax = if amax > v.abs() { amax } else { v.abs() };
    }
    amax
}

/// `(min, max)` as the asymmetric quantizers find them (starting from `±f32::MAX`).
#[inline]
pub(crate) fn min_max(x: &[f32]) -> (f32, f32) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

/// `1 / d`, or 0 for a zero scale (an all-zero block quantizes to zeros).
#[inline]
pub(crate) fn inverse_or_zero(d: f32) -> f32 {
    if d != 0.0 {
        1.0 / d
    } else {
        0.0
    }
}
