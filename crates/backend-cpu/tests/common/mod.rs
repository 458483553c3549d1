//! Helpers shared by the CPU backend's integration tests.
#![allow(dead_code)]

/// `n` xorshift64 values in [-scale/2, scale/2) from the state `s` (made odd).
pub fn rnd_from_state(s: u64, n: usize, scale: f32) -> Vec<f32> {
    xorshift(s | 1, n, scale)
}

/// `n` xorshift64 values in [-scale/2, scale/2) from the state `s` as it is.
fn xorshift(mut s: u64, n: usize, scale: f32) -> Vec<f32> {
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

/// `n` xorshift64 values in [-2, 2) from an LCG step of `seed` (the SIMD tests' rows).
pub fn random_row(seed: u64, n: usize) -> Vec<f32> {
    xorshift(seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407), n, 4.0)
}

/// Best-of-`reps` seconds of `f` (benchmarks: a warm-up call first).
pub fn best_secs(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    (0..reps)
        .map(|_| {
            let t = std::time::Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

/// `Σ(a-b)² / Σa²`.
pub fn nmse(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum();
    num / den.max(1e-30)
}

/// One sequence of `n` tokens at positions `p0..` over the cache blocks `table`.
pub fn seq_batch(p0: usize, n: usize, table: Vec<u32>) -> quarrel_core::ForwardBatch {
    quarrel_core::ForwardBatch {
        tokens: vec![0; n],
        positions: (p0..p0 + n).map(|p| p as u32).collect(),
        seqs: vec![quarrel_core::SeqBatch { start: 0, len: n, block_table: table }],
        logits_rows: vec![],
        state_slots: vec![],
    }
}
