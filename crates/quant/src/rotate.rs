//! Orthonormal Walsh–Hadamard rotations (32 to 256 points), for quantized KV caches.
//!
//! A 4-bit block format spends its scale on the block's largest value; keys carry a few
//! outlier channels, so the other 31 values of such a block lose most of their bits. The
//! normalized Hadamard matrix `H` (n x n, entries ±1/√n) is orthonormal and symmetric
//! (`H = Hᵀ = H⁻¹`): storing `H·x` spreads an outlier over the whole block before
//! quantization, and applying `H` again after dequantization gives `x` back up to the
//! quantization error. Dot products are unchanged by the rotation (`Hq·Hk = q·k`), and the
//! error energy of an outlier block drops by about the block size.

/// The smallest rotation (the Q8_0 / Q4_0 block) and the largest one supported.
pub const ROT_BLOCK: usize = 32;
pub const ROT_MAX: usize = 256;

/// The rotation size for vectors of `n` elements: the largest power of two that divides `n`,
/// at most [`ROT_MAX`]; `None` when that is below [`ROT_BLOCK`].
pub fn rotation_size(n: usize) -> Option<usize> {
    if n == 0 {
        return None;
    }
    let r = (1usize << n.trailing_zeros()).min(ROT_MAX);
    (r >= ROT_BLOCK).then_some(r)
}

/// Apply the normalized Walsh–Hadamard transform to `x` in place (its own inverse);
/// `x.len()` must be a power of two.
pub fn hadamard(x: &mut [f32]) {
    let n = x.len();
    debug_assert!(n.is_power_of_two());
    let mut h = 1;
    while h < n {
        let mut i = 0;
        while i < n {
            for j in i..i + h {
                let (a, b) = (x[j], x[j + h]);
                x[j] = a + b;
                x[j + h] = a - b;
            }
            i += 2 * h;
        }
        h *= 2;
    }
    let norm = 1.0 / (n as f32).sqrt();
    for v in x.iter_mut() {
        *v *= norm;
    }
}

/// The 32-point transform (see [`hadamard`]).
pub fn hadamard32(x: &mut [f32; ROT_BLOCK]) {
    hadamard(x);
}

/// Rotate every `r`-element block of `x` (`r` a power of two; a ragged tail is left as it is).
pub fn hadamard_blocks(x: &mut [f32], r: usize) {
    for c in x.chunks_exact_mut(r) {
        hadamard(c);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition: H[i][j] = (-1)^popcount(i & j) / √n.
    fn reference(x: &[f32]) -> Vec<f32> {
        let n = x.len();
        (0..n)
            .map(|i| {
                let s: f64 = (0..n).map(|j| if (i & j).count_ones() % 2 == 0 { x[j] as f64 } else { -(x[j] as f64) }).sum();
                (s / (n as f64).sqrt()) as f32
            })
            .collect()
    }

    fn pseudo(seed: u32) -> [f32; 32] {
        let mut s = seed.wrapping_mul(2654435761) | 1;
        core::array::from_fn(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s >> 8) as f32 / (1u32 << 24) as f32 * 8.0 - 4.0
        })
    }

    #[test]
    fn matches_the_matrix_definition_and_is_its_own_inverse() {
        for seed in 0..64 {
            let x = pseudo(seed);
            let mut y = x;
            hadamard32(&mut y);
            let want = reference(&x);
            for (a, b) in y.iter().zip(&want) {
                assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()), "{a} vs {b}");
            }
            hadamard32(&mut y);
            for (a, b) in y.iter().zip(&x) {
                assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()), "round trip {a} vs {b}");
            }
        }
    }

    #[test]
    fn every_size_matches_the_definition() {
        for n in [32usize, 64, 128, 256] {
            let x: Vec<f32> = (0..n / 32).flat_map(|s| pseudo(s as u32 + 100)).collect();
            let mut y = x.clone();
            hadamard(&mut y);
            for (a, b) in y.iter().zip(reference(&x)) {
                assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "n={n}: {a} vs {b}");
            }
        }
        assert_eq!(rotation_size(64), Some(64));
        assert_eq!(rotation_size(96), Some(32));
        assert_eq!(rotation_size(1024), Some(256));
        assert_eq!(rotation_size(48), None);
    }

    #[test]
    fn preserves_dot_products_and_spreads_an_outlier() {
        let (mut q, mut k) = (pseudo(1), pseudo(2));
        let dot = |a: &[f32; 32], b: &[f32; 32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
        let before = dot(&q, &k);
        hadamard32(&mut q);
        hadamard32(&mut k);
        assert!((dot(&q, &k) - before).abs() < 1e-4 * (1.0 + before.abs()));
        let mut spike = [0f32; 32];
        spike[7] = 32f32.sqrt();
        hadamard32(&mut spike);
        assert!(spike.iter().all(|v| (v.abs() - 1.0).abs() < 1e-6));
    }
}
