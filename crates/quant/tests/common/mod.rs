//! Shared helpers for the integration tests.
#![allow(dead_code)]

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Deterministic RNG for a test.
pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

/// Standard normal sample (Box-Muller; rand 0.8 without rand_distr).
pub fn normal(r: &mut StdRng) -> f32 {
    let u1: f64 = r.gen_range(f64::MIN_POSITIVE..1.0);
    let u2: f64 = r.gen();
    ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
}

/// `n` standard normal samples.
pub fn normals(r: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| normal(r)).collect()
}

/// Decode a lowercase/uppercase hex string.
pub fn hex(s: &str) -> Vec<u8> {
    assert!(s.len().is_multiple_of(2), "odd hex length");
    let nib = |c: u8| match c {
        b'0'..=b'9' => c - b'0',
        b'a'..=b'f' => c - b'a' + 10,
        b'A'..=b'F' => c - b'A' + 10,
        _ => panic!("bad hex digit {c}"),
    };
    s.as_bytes().chunks_exact(2).map(|p| (nib(p[0]) << 4) | nib(p[1])).collect()
}

/// Hex of little-endian f32 bytes -> f32 values.
pub fn hex_f32(s: &str) -> Vec<f32> {
    hex(s).chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}
