//! Seeded, platform-independent random numbers for synthetic weights.
//!
//! * [`SplitMix64`] is the generator (Steele, Lea & Flood 2014): one add and a 64-bit
//!   finaliser per output, which is plenty for random weights and trivially seekable.
//! * [`derive_seed`] mixes the user seed with a tensor name (FNV-1a) and a row index, so
//!   every row of every tensor has its own independent stream: rows are generated in any
//!   order on any number of threads and the file is still byte-identical.
//! * [`SplitMix64::fill_normal`] draws N(mean, std) with the Box-Muller transform.

/// The SplitMix64 generator.
#[derive(Clone, Debug)]
pub struct SplitMix64 {
    state: u64,
}

const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

/// The SplitMix64 output function (a good 64-bit mixer on its own).
#[inline]
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// 64-bit FNV-1a hash of a string (stable across Rust versions, unlike `DefaultHasher`).
pub fn fnv1a(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Seed of tensor `name` for the user seed `seed`.
pub fn tensor_seed(seed: u64, name: &str) -> u64 {
    mix64(seed ^ mix64(fnv1a(name)))
}

/// Seed of row `row` of a tensor whose seed is `tensor_seed`.
pub fn row_seed(tensor_seed: u64, row: u64) -> u64 {
    mix64(tensor_seed.wrapping_add(row.wrapping_add(1).wrapping_mul(GOLDEN)))
}

/// Seed of row `row` of tensor `name` for the user seed `seed`.
pub fn derive_seed(seed: u64, name: &str, row: u64) -> u64 {
    row_seed(tensor_seed(seed, name), row)
}

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN);
        mix64(self.state)
    }

    /// Uniform in (0, 1]: never 0, so `ln` is finite.
    #[inline]
    pub fn next_f64_open0(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Fill `out` with N(mean, std) samples (Box-Muller, two samples per pair of uniforms).
    pub fn fill_normal(&mut self, out: &mut [f32], mean: f32, std: f32) {
        let mut chunks = out.chunks_exact_mut(2);
        for pair in &mut chunks {
            let (a, b) = self.normal_pair();
            pair[0] = mean + std * a;
            pair[1] = mean + std * b;
        }
        if let [last] = chunks.into_remainder() {
            *last = mean + std * self.normal_pair().0;
        }
    }

    #[inline]
    fn normal_pair(&mut self) -> (f32, f32) {
        let u1 = self.next_f64_open0();
        let u2 = self.next_f64_open0();
        let r = (-2.0 * u1.ln()).sqrt();
        let (s, c) = (std::f64::consts::TAU * u2).sin_cos();
        ((r * c) as f32, (r * s) as f32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_distinct() {
        let mut a = SplitMix64::new(derive_seed(1, "blk.0.attn_q.weight", 0));
        let mut b = SplitMix64::new(derive_seed(1, "blk.0.attn_q.weight", 0));
        assert_eq!(a.next_u64(), b.next_u64());
        assert_ne!(derive_seed(1, "a", 0), derive_seed(2, "a", 0));
        assert_ne!(derive_seed(1, "a", 0), derive_seed(1, "b", 0));
        assert_ne!(derive_seed(1, "a", 0), derive_seed(1, "a", 1));
        // the first SplitMix64 output for seed 0 (reference value of the algorithm)
        assert_eq!(SplitMix64::new(0).next_u64(), 0xe220_a839_7b1d_cdaf);
    }

    #[test]
    fn normal_moments() {
        let mut r = SplitMix64::new(42);
        let mut v = vec![0f32; 100_001];
        r.fill_normal(&mut v, 1.0, 0.5);
        let n = v.len() as f64;
        let mean = v.iter().map(|&x| x as f64).sum::<f64>() / n;
        let var = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n;
        assert!((mean - 1.0).abs() < 0.01, "{mean}");
        assert!((var.sqrt() - 0.5).abs() < 0.01, "{var}");
        assert!(v.iter().all(|x| x.is_finite()));
    }
}
