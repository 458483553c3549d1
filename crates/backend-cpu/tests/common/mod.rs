//! Helpers shared by the CPU backend's integration tests.
#![allow(dead_code)]

/// `n` xorshift64 values in [-scale/2, scale/2) from the state `s` (made odd).
pub fn rnd_from_state(s: u64, n: usize, scale: f32) -> Vec<f32> {
    let mut s = s | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * scale
        })
        .collect()
}

/// The same, the seed spread by the golden-ratio multiplier first (nearby seeds, unrelated rows).
pub fn rnd(seed: u64, n: usize, scale: f32) -> Vec<f32> {
    rnd_from_state(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15), n, scale)
}
