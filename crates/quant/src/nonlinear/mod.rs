//! Codebook ("non-linear") 4-bit formats with 32-element blocks:
//! IQ4_NL (f16 scale, [`KVALUES_IQ4NL`] codebook) and MXFP4 (E8M0 shared
//! exponent, E2M1 codebook [`KVALUES_MXFP4`]). Both pair with Q8_0 in dot
//! products. Element `j` (0..16) is the low nibble of `qs[j]`, `j + 16` the high one.

pub mod iq4_nl;
pub mod mxfp4;

/// IQ4_NL codebook (`kvalues_iq4nl` in ggml-common.h).
pub const KVALUES_IQ4NL: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

/// MXFP4 codebook: E2M1 values doubled (`kvalues_mxfp4` in ggml-common.h);
/// pair it with [`e8m0_to_fp32_half`] which halves the scale.
pub const KVALUES_MXFP4: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// Bits of `2^(x-127)` (`ggml_e8m0_to_fp32`; `x = 0` gives the subnormal 2^-127;
/// ggml ignores the E8M0 NaN encoding, so `x = 255` yields +inf, as here).
const fn e8m0_bits(x: u8) -> u32 {
    if x == 0 {
        0x0040_0000
    } else {
        (x as u32) << 23
    }
}

/// Bits of `2^(x-128)` (`ggml_e8m0_to_fp32_half`).
const fn e8m0_half_bits(x: u8) -> u32 {
    if x < 2 {
        0x0020_0000 << x
    } else {
        ((x - 1) as u32) << 23
    }
}

const fn build_table(half: bool) -> [u32; 256] {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = if half { e8m0_half_bits(i as u8) } else { e8m0_bits(i as u8) };
        i += 1;
    }
    t
}

/// `E8M0_TO_FP32_BITS[e]` = f32 bits of `2^(e-127)` for every E8M0 byte.
pub const E8M0_TO_FP32_BITS: [u32; 256] = build_table(false);
/// `E8M0_TO_FP32_HALF_BITS[e]` = f32 bits of `2^(e-128)` for every E8M0 byte.
pub const E8M0_TO_FP32_HALF_BITS: [u32; 256] = build_table(true);

/// `ggml_e8m0_to_fp32`: E8M0 exponent byte -> `2^(x-127)`.
#[inline]
pub fn e8m0_to_fp32(x: u8) -> f32 {
    f32::from_bits(E8M0_TO_FP32_BITS[x as usize])
}

/// `ggml_e8m0_to_fp32_half`: E8M0 exponent byte -> `2^(x-128)` (half the scale,
/// to match the doubled [`KVALUES_MXFP4`]).
#[inline]
pub fn e8m0_to_fp32_half(x: u8) -> f32 {
    f32::from_bits(E8M0_TO_FP32_HALF_BITS[x as usize])
}

/// ggml's `best_index_int8`: index of the codebook entry nearest to `x`
/// (`val` sorted ascending; ties go to the upper entry).
#[inline]
pub fn best_index_int8(val: &[i8; 16], x: f32) -> usize {
    let n = val.len();
    if x <= val[0] as f32 {
        return 0;
    }
    if x >= val[n - 1] as f32 {
        return n - 1;
    }
    let (mut ml, mut mu) = (0usize, n - 1);
    while mu - ml > 1 {
        let mav = (ml + mu) / 2;
        if x < val[mav] as f32 {
            mu = mav;
        } else {
            ml = mav;
        }
    }
    if x - (val[mu - 1] as f32) < (val[mu] as f32) - x {
        mu - 1
    } else {
        mu
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e8m0() {
        assert_eq!(e8m0_to_fp32(127), 1.0);
        assert_eq!(e8m0_to_fp32_half(127), 0.5);
        assert_eq!(e8m0_to_fp32_half(128), 1.0);
        assert_eq!(e8m0_to_fp32(0), 2f32.powi(-127));
        assert_eq!(e8m0_to_fp32_half(0), 2f32.powi(-128));
        assert_eq!(e8m0_to_fp32_half(1), 2f32.powi(-127));
        assert_eq!(e8m0_to_fp32_half(2), 2f32.powi(-126));
        for e in 2..=255u8 {
            assert_eq!(e8m0_to_fp32_half(e) * 2.0, e8m0_to_fp32(e), "{e}");
        }
    }

    #[test]
    fn best_index() {
        assert_eq!(best_index_int8(&KVALUES_IQ4NL, -200.0), 0);
        assert_eq!(best_index_int8(&KVALUES_IQ4NL, 200.0), 15);
        assert_eq!(best_index_int8(&KVALUES_IQ4NL, 0.0), 8);
        assert_eq!(best_index_int8(&KVALUES_IQ4NL, 7.0), 9); // tie 1/13 -> upper
        assert_eq!(best_index_int8(&KVALUES_IQ4NL, -100.0), 1);
        let _ = best_index_int8(&KVALUES_IQ4NL, f32::NAN);
    }
}
