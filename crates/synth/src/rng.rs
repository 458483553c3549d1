//! Seeded, platform-independent random numbers for synthetic weights.
//!
//! * [`SplitMix64`] is the generator (Steele, Lea & Flood 2014): one add and a 64-bit
//!   finaliser per output, which is plenty for random weights and trivially seekable.
//! * [`derive_seed`] mixes the user seed with a tensor name (FNV-1a) and a row index, so
//!   every row of every tensor has its own independent stream: rows are generated in any
//!   order on any number of threads and the file is still byte-identical.
//! * [`SplitMix64::fill_normal`] draws N(mean, std) with the Box-Muller transform, in f32
//!   with its own `ln` and `sin`/`cos` polynomials (relative error < 1e-6): plain IEEE
//!   arithmetic, so the values are the same on every platform (no libm), and ~8x faster
//!   than calling `f64::ln` and `f64::sin_cos`.

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

    /// Fill `out` with N(mean, std) samples (Box-Muller, two samples per 64 random bits).
    /// Works in batches of pairs so the arithmetic vectorizes; the values depend only on
    /// the sequence of draws, not on the batching.
    pub fn fill_normal(&mut self, out: &mut [f32], mean: f32, std: f32) {
        const B: usize = 16;
        let mut chunks = out.chunks_exact_mut(2 * B);
        for chunk in &mut chunks {
            let mut xs = [0u64; B];
            for x in &mut xs {
                *x = self.next_u64();
            }
            let mut z = [(0f32, 0f32); B];
            for (z, &x) in z.iter_mut().zip(&xs) {
                *z = normal_pair_from_bits(x);
            }
            for (o, (a, b)) in chunk.chunks_exact_mut(2).zip(z) {
                o[0] = mean + std * a;
                o[1] = mean + std * b;
            }
        }
        let rest = chunks.into_remainder();
        let mut pairs = rest.chunks_exact_mut(2);
        for o in &mut pairs {
            let (a, b) = self.normal_pair();
            o[0] = mean + std * a;
            o[1] = mean + std * b;
        }
        if let [last] = pairs.into_remainder() {
            *last = mean + std * self.normal_pair().0;
        }
    }

    /// Two independent standard normals from the next 64-bit draw.
    #[inline]
    pub fn normal_pair(&mut self) -> (f32, f32) {
        normal_pair_from_bits(self.next_u64())
    }
}

/// Box-Muller on one 64-bit draw: 24-bit uniforms u1 in (0, 1] and u2 in [0, 1);
/// r = sqrt(-2 ln u1) (at most 5.77), angle 2 pi u2.
#[inline]
pub fn normal_pair_from_bits(x: u64) -> (f32, f32) {
    const SCALE: f32 = 1.0 / (1u32 << 24) as f32;
    let u1 = (((x >> 40) as i32) + 1) as f32 * SCALE;
    let u2 = ((x >> 8) as i32 & 0x00ff_ffff) as f32 * SCALE;
    let r = (-2.0 * ln_f32(u1)).sqrt();
    let (s, c) = sin_cos_turns(u2);
    (r * c, r * s)
}

/// Natural logarithm of a positive, normal f32 (absolute error < 2e-7 (1 + |ln x|)).
#[inline]
pub fn ln_f32(x: f32) -> f32 {
    const LN2: f32 = std::f32::consts::LN_2;
    let bits = x.to_bits();
    let m = f32::from_bits((bits & 0x007f_ffff) | 0x3f80_0000); // [1, 2)
    let big = m > std::f32::consts::SQRT_2;
    let m = if big { m * 0.5 } else { m };
    let e = ((bits >> 23) & 0xff) as i32 - 127 + big as i32;
    // ln m = 2 atanh(t) = 2 (t + t^3/3 + t^5/5 + t^7/7 + t^9/9), |t| <= 0.1716
    let t = (m - 1.0) / (m + 1.0);
    let t2 = t * t;
    let p = 1.0 + t2 * (1.0 / 3.0 + t2 * (1.0 / 5.0 + t2 * (1.0 / 7.0 + t2 * (1.0 / 9.0))));
    e as f32 * LN2 + 2.0 * t * p
}

/// `(sin 2 pi u, cos 2 pi u)` for u in [0, 1] (absolute error < 1e-6).
#[inline]
pub fn sin_cos_turns(u: f32) -> (f32, f32) {
    let x = u * 4.0; // quarter turns
    let k = (x + 0.5) as i32; // round (x >= 0)
    let a = (x - k as f32) * std::f32::consts::FRAC_PI_2; // [-pi/4, pi/4]
    let a2 = a * a;
    let s = a * (1.0 - a2 * (1.0 / 6.0 - a2 * (1.0 / 120.0 - a2 * (1.0 / 5040.0))));
    let c = 1.0 - a2 * (0.5 - a2 * (1.0 / 24.0 - a2 * (1.0 / 720.0 - a2 * (1.0 / 40320.0))));
    // rotate by k quarter turns: (s, c), (c, -s), (-s, -c), (-c, s)
    let odd = k & 1 != 0;
    let (s1, c1) = if odd { (c, s) } else { (s, c) };
    let sin = if k & 2 != 0 { -s1 } else { s1 };
    let cos = if (k + 1) & 2 != 0 { -c1 } else { c1 };
    (sin, cos)
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
    fn ln_and_sin_cos_are_accurate() {
        let mut r = SplitMix64::new(5);
        for i in 0..200_000u32 {
            let u = if i < 1000 { (i + 1) as f32 / (1u32 << 24) as f32 } else { r.next_f64_open0() as f32 };
            let want = (u as f64).ln();
            assert!((ln_f32(u) as f64 - want).abs() <= 2e-7 * (1.0 + want.abs()), "ln {u}");
            let (s, c) = sin_cos_turns(u);
            let a = std::f64::consts::TAU * u as f64;
            assert!((s as f64 - a.sin()).abs() < 1e-6 && (c as f64 - a.cos()).abs() < 1e-6, "sincos {u}");
        }
        assert_eq!(ln_f32(1.0), 0.0);
        let (s, c) = sin_cos_turns(1.0);
        assert!(s.abs() < 1e-6 && (c - 1.0).abs() < 1e-6);
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
        // tails: P(|z| > 2) = 4.55%, P(|z| > 3) = 0.27%
        let frac = |k: f32| v.iter().filter(|&&x| ((x - 1.0) / 0.5).abs() > k).count() as f64 / n;
        assert!((frac(2.0) - 0.0455).abs() < 0.003, "{}", frac(2.0));
        assert!((frac(3.0) - 0.0027).abs() < 0.0006, "{}", frac(3.0));
        assert!(v.iter().all(|x| x.is_finite()));
    }
}
