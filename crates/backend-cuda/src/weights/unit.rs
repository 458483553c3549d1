//! Reference twin of the kernels' weight decoding (`load_unit` / `unit_value` in
//! `kernels/common.cuh`): the repacked device layout of `weight::repack`, read back in units of
//! 32 values as `w = s * q + o`, in plain Rust. Its property test holds it to
//! `quarrel_quant::dequantize` on random tensors of every type with a kernel, so the layout
//! and the decoding formulas are checked on machines without a GPU; the GPU tests then hold the
//! kernels to the CPU backend.

use crate::weights::DevType;

/// One decoded unit: 32 signed integers, the scales of values 0..16 and 16..32, the offset.
#[derive(Clone, Copy, Debug)]
pub struct Unit {
    pub q: [i8; 32],
    pub s0: f32,
    pub s1: f32,
    pub o: f32,
}

fn f16(b: &[u8]) -> f32 {
    half::f16::from_le_bytes([b[0], b[1]]).to_f32()
}

/// `k_scale_min` of common.cuh (ggml's get_scale_min_k4).
fn scale_min(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        ((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4))
    }
}

/// Unit `k` of row `row` (`u` units per row) of a repacked weight, as the kernels decode it.
pub fn load_unit(t: DevType, p: &[u8], m: &[u8], row: usize, k: usize, u: usize) -> Unit {
    let g = row * u + k;
    let mut q = [0i8; 32];
    let name = t.name();
    match name {
        "q4_0" | "q4_1" | "q5_0" | "q5_1" => {
            let qs = &p[g * 16..g * 16 + 16];
            let (mb, c) = match name {
                "q4_0" => (2, 8),
                "q4_1" => (4, 0),
                "q5_0" => (8, 16),
                _ => (8, 0),
            };
            let meta = &m[g * mb..g * mb + mb];
            let qh = if mb == 8 { u32::from_le_bytes([meta[4], meta[5], meta[6], meta[7]]) } else { 0 };
            for i in 0..16 {
                let hi_lo = ((qh >> i) & 1) << 4;
                let hi_hi = ((qh >> (i + 16)) & 1) << 4;
                q[i] = ((qs[i] & 0xF) as i32 | hi_lo as i32) as i8 - c;
                q[i + 16] = ((qs[i] >> 4) as i32 | hi_hi as i32) as i8 - c;
            }
            let s = f16(&meta[0..2]);
            let o = if name == "q4_1" || name == "q5_1" { f16(&meta[2..4]) } else { 0.0 };
            Unit { q, s0: s, s1: s, o }
        }
        "q8_0" => {
            for (i, v) in q.iter_mut().enumerate() {
                *v = p[g * 32 + i] as i8;
            }
            let s = f16(&m[g * 2..g * 2 + 2]);
            Unit { q, s0: s, s1: s, o: 0.0 }
        }
        "q4_K" | "q5_K" => {
            let sb = if name == "q4_K" { 144 } else { 176 };
            let b = &p[(row * (u / 8) + k / 8) * sb..][..sb];
            let j = k % 8;
            let (d, dmin) = (f16(&b[0..2]), f16(&b[2..4]));
            let (sc, mn) = scale_min(j, &b[4..16]);
            let qs = &b[if name == "q4_K" { 16 } else { 48 } + 32 * (j / 2)..][..32];
            for l in 0..32 {
                let mut v = (qs[l] >> (4 * (j & 1))) & 0xF;
                if name == "q5_K" {
                    v |= ((b[16 + l] >> j) & 1) << 4;
                }
                q[l] = v as i8;
            }
            let s = d * sc as f32;
            Unit { q, s0: s, s1: s, o: -(dmin * mn as f32) }
        }
        "q6_K" => {
            let b = &p[(row * (u / 8) + k / 8) * 224..][..224];
            let (j, n) = (k % 8, k % 8 / 4);
            let kk = j % 4;
            for l in 0..32 {
                let lo = (b[64 * n + 32 * (kk & 1) + l] >> (4 * (kk >> 1))) & 0xF;
                let hi = (b[128 + 32 * n + l] >> (2 * kk)) & 3;
                q[l] = (lo | (hi << 4)) as i8 - 32;
            }
            let d = f16(&b[208..210]);
            let sc = |i: usize| b[192 + i] as i8 as f32;
            Unit { q, s0: d * sc(8 * n + 2 * kk), s1: d * sc(8 * n + 2 * kk + 1), o: 0.0 }
        }
        other => panic!("no unit decoding for {other}"),
    }
}

/// Value `i` of a unit (`unit_value`).
#[cfg(test)]
pub fn unit_value(u: &Unit, i: usize) -> f32 {
    (if i < 16 { u.s0 } else { u.s1 }) * u.q[i] as f32 + u.o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mmq::MMQ_TYPES;
    use crate::weights::repack;
    use proptest::prelude::*;
    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        #[test]
        fn repacked_units_decode_like_the_reference(seed in any::<u64>(), rows in 1usize..4, blocks in 1usize..3, scale in 0.01f32..8.0) {
            let n_in = 256 * blocks;
            let mut s = seed | 1;
            let x: Vec<f32> = (0..rows * n_in).map(|_| {
                s ^= s << 13; s ^= s >> 7; s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
            }).collect();
            for ty in MMQ_TYPES {
                let bytes = quarrel_quant::quantize_to_vec(ty, &x).unwrap();
                let mut want = vec![0f32; x.len()];
                quarrel_quant::dequantize(ty, &bytes, &mut want).unwrap();
                let (t, p, m) = repack(ty, &bytes).unwrap();
                let m = m.unwrap_or_default();
                let u = n_in / 32;
                for row in 0..rows {
                    for k in 0..u {
                        let unit = load_unit(t, &p, &m, row, k, u);
                        for i in 0..32 {
                            let (a, b) = (unit_value(&unit, i), want[row * n_in + k * 32 + i]);
                            prop_assert!((a - b).abs() <= 1e-6 * b.abs().max(scale), "{ty} row {row} unit {k} value {i}: {a} vs {b}");
                        }
                    }
                }
            }
        }
    }
}
