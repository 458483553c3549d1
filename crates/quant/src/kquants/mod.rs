//! K-quants: 256-element super-blocks (Q2_K..Q6_K) and the Q8_K activation type.
//!
//! This module holds the shared search helpers of ggml's reference quantizers
//! (`nearest_int`, `make_qx_quants`, `make_q3_quants`, `make_qkx2_quants`) and
//! the 6-bit scale/min unpacking; each submodule has the per-type kernels
//! (`dequantize_row`, `quantize_row` = `quantize_row_*_ref`, `vec_dot_q8_k`).
//!
//! All float arithmetic mirrors the C expressions operand by operand (C
//! evaluates `a*b*c` as `(a*b)*c`, converts `int` operands to `float` first,
//! and never fuses multiply-adds in ggml-base builds), so the quantized bytes
//! are bit-identical to ggml's.

pub mod q2_k;
pub mod q3_k;
pub mod q4_k;
pub mod q5_k;
pub mod q6_k;
pub mod q8_k;

use crate::scan::signed_absmax;

/// `GROUP_MAX_EPS` in ggml-quants.c: groups whose max |x| is below are "all zero".
pub(crate) const GROUP_MAX_EPS: f32 = 1e-15;

/// ggml's `nearest_int`: round to nearest, ties to even, via the 1.5*2^23 trick.
/// Exact for |x| <= 2^22; for larger/NaN inputs it returns the same garbage as C
/// (but never panics).
#[inline]
pub fn nearest_int(fval: f32) -> i32 {
    let val = fval + 12_582_912.0;
    (val.to_bits() as i32 & 0x007f_ffff) - 0x0040_0000
}

/// The signed value of largest magnitude of a group, or None (with `l` zeroed) when the
/// group is "all zero" (below [`GROUP_MAX_EPS`]): the start of the symmetric searches.
#[inline]
fn group_max(x: &[f32], l: &mut [i8]) -> Option<f32> {
    let (amax, max) = signed_absmax(x);
    if amax < GROUP_MAX_EPS {
        l[..x.len()].fill(0);
        return None;
    }
    Some(max)
}

/// `make_qx_quants` for `qw == NULL` (symmetric quantization into
/// `[-nmax, nmax-1]`, stored with `+nmax` offset in `l`). Returns the scale.
pub(crate) fn make_qx_quants(nmax: i32, x: &[f32], l: &mut [i8], rmse_type: i32) -> f32 {
    let n = x.len();
    let Some(max) = group_max(x, l) else { return 0.0 };
    let clamp = |v: i32| v.clamp(-nmax, nmax - 1);
    let mut iscale = -(nmax as f32) / max;
    if rmse_type == 0 {
        for i in 0..n {
            l[i] = (nmax + clamp(nearest_int(iscale * x[i]))) as i8;
        }
        return 1.0 / iscale;
    }
    let (rmse_type, return_early) = if rmse_type < 0 { (-rmse_type, true) } else { (rmse_type, false) };
    let weight = |v: f32| -> f32 {
        match rmse_type {
            1 => v * v,
            2 => 1.0,
            3 => v.abs(),
            _ => v.abs().sqrt(),
        }
    };
    let mut sumlx = 0.0f32;
    let mut suml2 = 0.0f32;
    for i in 0..n {
        let li = clamp(nearest_int(iscale * x[i]));
        l[i] = (li + nmax) as i8;
        let w = weight(x[i]);
        sumlx += w * x[i] * li as f32;
        suml2 += w * li as f32 * li as f32;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    if return_early {
        return if suml2 > 0.0 { 0.5 * (scale + 1.0 / iscale) } else { 1.0 / iscale };
    }
    let mut best = scale * sumlx;
    for is in -9i32..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for &xi in x {
            let li = clamp(nearest_int(iscale * xi));
            let w = weight(xi);
            sumlx += w * xi * li as f32;
            suml2 += w * li as f32 * li as f32;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for i in 0..n {
                l[i] = (nmax + clamp(nearest_int(iscale * x[i]))) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// `make_q3_quants` (used by Q3_K with `do_rmse = true`): values in
/// `[-nmax, nmax-1]` stored with `+nmax` offset. Returns the scale.
pub(crate) fn make_q3_quants(nmax: i32, x: &[f32], l: &mut [i8], do_rmse: bool) -> f32 {
    let n = x.len();
    let Some(max) = group_max(x, l) else { return 0.0 };
    let clamp = |v: i32| v.clamp(-nmax, nmax - 1);
    let iscale = -(nmax as f32) / max;
    if do_rmse {
        let mut sumlx = 0.0f32;
        let mut suml2 = 0.0f32;
        for i in 0..n {
            let li = clamp(nearest_int(iscale * x[i]));
            l[i] = li as i8;
            let w = x[i] * x[i];
            sumlx += w * x[i] * li as f32;
            suml2 += w * li as f32 * li as f32;
        }
        for _itry in 0..5 {
            let mut n_changed = 0;
            for i in 0..n {
                let w = x[i] * x[i];
                let li = l[i] as f32;
                let mut slx = sumlx - w * x[i] * li;
                if slx > 0.0 {
                    let mut sl2 = suml2 - w * li * li;
                    let new_l = clamp(nearest_int(x[i] * sl2 / slx));
                    if new_l != l[i] as i32 {
                        slx += w * x[i] * new_l as f32;
                        sl2 += w * new_l as f32 * new_l as f32;
                        if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                            l[i] = new_l as i8;
                            sumlx = slx;
                            suml2 = sl2;
                            n_changed += 1;
                        }
                    }
                }
            }
            if n_changed == 0 {
                break;
            }
        }
        for v in l[..n].iter_mut() {
            *v += nmax as i8;
        }
        return if suml2 > 0.0 { sumlx / suml2 } else { 0.0 };
    }
    for i in 0..n {
        l[i] = (clamp(nearest_int(iscale * x[i])) + nmax) as i8;
    }
    1.0 / iscale
}

/// Parameters of ggml's `make_qkx2_quants` grid search.
#[derive(Clone, Copy)]
pub(crate) struct Qkx2Params {
    pub nmax: i32,
    pub rmin: f32,
    pub rdelta: f32,
    pub nstep: i32,
    pub use_mad: bool,
}

/// `make_qkx2_quants`: asymmetric quantization `x ≈ scale * l - the_min`
/// with `l` in `[0, nmax]`, weighted least squares over a small grid of
/// candidate scales. Returns `(scale, the_min)`; `the_min >= 0`.
pub(crate) fn make_qkx2_quants(x: &[f32], weights: &[f32], l: &mut [u8], laux: &mut [u8], p: Qkx2Params) -> (f32, f32) {
    let n = x.len();
    let nmax = p.nmax;
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l[..n].fill(0);
        return (0.0, -min);
    }
    let err = |diff: f32| if p.use_mad { diff.abs() } else { diff * diff };
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        let li = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l[i] = li as u8;
        let diff = scale * l[i] as f32 + min - x[i];
        best_error += weights[i] * err(diff);
    }
    if p.nstep < 1 {
        return (scale, -min);
    }
    for is in 0..=p.nstep {
        iscale = (p.rmin + p.rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            let li = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            laux[i] = li as u8;
            let w = weights[i];
            let lf = li as f32;
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        let d = sum_w * sum_l2 - sum_l * sum_l;
        if d > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / d;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / d;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for i in 0..n {
                let diff = this_scale * laux[i] as f32 + this_min - x[i];
                cur_error += weights[i] * err(diff);
            }
            if cur_error < best_error {
                l[..n].copy_from_slice(&laux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// `get_scale_min_k4`: unpack the 6-bit scale and min of sub-block `j` (0..8)
/// from the 12-byte Q4_K/Q5_K `scales` field.
#[inline]
pub fn get_scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// The (scale, min) of sub-blocks `2i` and `2i + 1` (the 64 elements of group `i`) of a
/// Q4_K / Q5_K block, times the block's `d` and `dmin`, as the dequantizers apply them.
#[inline(always)]
pub(crate) fn scaled_pair_k4(i: usize, scales: &[u8], d: f32, dmin: f32) -> [(f32, f32); 2] {
    [2 * i, 2 * i + 1].map(|j| {
        let (sc, m) = get_scale_min_k4(j, scales);
        (d * sc as f32, dmin * m as f32)
    })
}

/// Pack 8 six-bit scales and mins into the 12-byte Q4_K/Q5_K layout
/// (inverse of [`get_scale_min_k4`]), as `quantize_row_q4_K_ref` does.
pub(crate) fn pack_scale_min_k4(ls: &[u8; 8], lm: &[u8; 8], q: &mut [u8]) {
    for j in 0..8 {
        if j < 4 {
            q[j] = ls[j];
            q[j + 4] = lm[j];
        } else {
            q[j + 4] = (ls[j] & 0xF) | ((lm[j] & 0xF) << 4);
            q[j - 4] |= (ls[j] >> 4) << 6;
            q[j] |= (lm[j] >> 4) << 6;
        }
    }
}

/// Q4_K/Q5_K sub-block weights: `av_x + |x|` with `av_x = sqrt(mean(x^2))`.
pub(crate) fn rms_plus_abs_weights(x: &[f32], weights: &mut [f32]) {
    let mut sum_x2 = 0.0f32;
    for &v in x {
        sum_x2 += v * v;
    }
    let av_x = (sum_x2 / x.len() as f32).sqrt();
    for (w, &v) in weights.iter_mut().zip(x) {
        *w = av_x + v.abs();
    }
}

/// ggml's eight f32 partial sums of the K-quant dot products: lane `l` gathers the block
/// terms `d * aux32[l]`, and the lanes are added in order at the end.
#[derive(Default)]
pub(crate) struct Lanes([f32; 8]);

impl Lanes {
    #[inline]
    pub(crate) fn add(&mut self, d: f32, aux32: &[i32; 8]) {
        for (s, &v) in self.0.iter_mut().zip(aux32) {
            *s += d * v as f32;
        }
    }

    /// `sumf + lane 0 + lane 1 + ... + lane 7`, in that order.
    #[inline]
    pub(crate) fn sum_onto(self, mut sumf: f32) -> f32 {
        for s in self.0 {
            sumf += s;
        }
        sumf
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_ties_to_even() {
        assert_eq!(nearest_int(0.5), 0);
        assert_eq!(nearest_int(1.5), 2);
        assert_eq!(nearest_int(2.5), 2);
        assert_eq!(nearest_int(-1.5), -2);
        assert_eq!(nearest_int(-0.49), 0);
        assert_eq!(nearest_int(3.7), 4);
        assert_eq!(nearest_int(-4_000_000.0), -4_000_000);
        let _ = nearest_int(f32::NAN);
        let _ = nearest_int(f32::INFINITY);
    }

    #[test]
    fn scale_min_pack_roundtrip() {
        let ls = [0u8, 1, 17, 63, 32, 5, 60, 33];
        let lm = [63u8, 2, 40, 0, 18, 31, 1, 62];
        let mut q = [0u8; 12];
        pack_scale_min_k4(&ls, &lm, &mut q);
        for j in 0..8 {
            assert_eq!(get_scale_min_k4(j, &q), (ls[j], lm[j]));
        }
    }
}
