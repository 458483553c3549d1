//! Token sampling: penalties, top-k, top-p, min-p, temperature, seeded draws; greedy at T = 0.
//!
//! The chain follows llama.cpp's default order: penalties -> top-k -> top-p -> min-p ->
//! temperature -> draw; `quarrel_core::sample_row_ref` runs it (and `Backend::sample_rows` on
//! a device): the sampler turns the parameters and history into a `SampleRow` and draws `r`.

use quarrel_core::{sample_row_ref, SampleRow};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;

#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 (or below) = greedy.
    pub temperature: f32,
    /// 0 = disabled.
    pub top_k: usize,
    /// 1.0 = disabled.
    pub top_p: f32,
    /// 0.0 = disabled.
    pub min_p: f32,
    /// 1.0 = disabled. Divides positive logits / multiplies negative ones of recent tokens.
    pub repeat_penalty: f32,
    /// Subtracted once from the logit of every token seen in the window.
    pub presence_penalty: f32,
    /// Subtracted per occurrence in the window.
    pub frequency_penalty: f32,
    /// Number of recent tokens the penalties look at (0 = none, usize::MAX = all).
    pub penalty_last_n: usize,
    /// Same seed, same output.
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            penalty_last_n: 64,
            seed: 0xC0FFEE,
        }
    }
}

impl SamplingParams {
    pub fn greedy() -> Self {
        SamplingParams { temperature: 0.0, ..Default::default() }
    }

    /// Greedy with no penalties: the pick is the argmax of the raw logits (which a device
    /// backend computes without sending the logits back).
    pub fn is_plain_greedy(&self) -> bool {
        self.temperature <= 0.0
            && (self.penalty_last_n == 0 || (self.repeat_penalty == 1.0 && self.presence_penalty == 0.0 && self.frequency_penalty == 0.0))
    }

    /// Check ranges, with a message a user can act on.
    pub fn validate(&self) -> Result<(), String> {
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Err(format!("temperature must be >= 0, got {}", self.temperature));
        }
        if !(0.0..=1.0).contains(&self.top_p) || self.top_p.is_nan() {
            return Err(format!("top_p must be in [0, 1], got {}", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) || self.min_p.is_nan() {
            return Err(format!("min_p must be in [0, 1], got {}", self.min_p));
        }
        if self.repeat_penalty.is_nan() || self.repeat_penalty <= 0.0 || !self.repeat_penalty.is_finite() {
            return Err(format!("repeat_penalty must be > 0, got {}", self.repeat_penalty));
        }
        if !self.presence_penalty.is_finite() || !self.frequency_penalty.is_finite() {
            return Err("presence/frequency penalties must be finite".into());
        }
        Ok(())
    }
}

pub struct Sampler {
    pub params: SamplingParams,
    rng: ChaCha8Rng,
}

/// Index of the largest value (first on ties, like llama.cpp's greedy sampler; a NaN never
/// wins a comparison, so a NaN in front stays the answer, as in [`argmax_ref`]). Lane-wise
/// maxima first (vectorized), then the first index holding the maximum.
pub fn argmax(logits: &[f32]) -> u32 {
    let Some(&first) = logits.first() else { return 0 };
    if first.is_nan() {
        return 0;
    }
    const L: usize = 16;
    let mut lanes = [first; L];
    let mut chunks = logits.chunks_exact(L);
    for c in &mut chunks {
        for (m, &v) in lanes.iter_mut().zip(c) {
            *m = if v > *m { v } else { *m };
        }
    }
    let mut max = lanes.iter().fold(first, |m, &v| if v > m { v } else { m });
    for &v in chunks.remainder() {
        if v > max {
            max = v;
        }
    }
    logits.iter().position(|&v| v == max).unwrap_or(0) as u32
}

/// Reference twin of [`argmax`]: one pass, keep the first strictly larger value.
pub fn argmax_ref(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Sampler {
        let rng = ChaCha8Rng::seed_from_u64(params.seed);
        Sampler { params, rng }
    }

    /// Where the request's generator stands (a count of drawn words).
    pub fn draw_pos(&self) -> u128 {
        self.rng.get_word_pos()
    }

    /// Put the generator back at `pos` (from [`draw_pos`](Self::draw_pos)): a speculative
    /// step returns the draws of the rows it rejected, so the next pick takes the draw plain
    /// decoding would.
    pub fn set_draw_pos(&mut self, pos: u128) {
        self.rng.set_word_pos(pos);
    }

    /// Pick the next token from `logits` given the tokens so far (`history`, prompt included).
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        if self.params.is_plain_greedy() {
            // plain greedy: no copy of the logits
            return argmax(logits);
        }
        let row = self.row(history);
        sample_row_ref(logits, &row)
    }

    /// The chain for the next pick given `history` (`Backend::sample_rows` / `sample_row_ref`):
    /// the penalty window's token counts and, when it samples (temperature > 0), the next
    /// uniform draw of the request's RNG. One call per pick keeps the draws in step with
    /// `sample`.
    pub fn row(&mut self, history: &[u32]) -> SampleRow {
        let p = &self.params;
        let mut penalties = vec![];
        if p.penalty_last_n > 0 && (p.repeat_penalty != 1.0 || p.presence_penalty != 0.0 || p.frequency_penalty != 0.0) {
            let window = &history[history.len().saturating_sub(p.penalty_last_n)..];
            let mut counts: HashMap<u32, u32> = HashMap::new();
            for &t in window {
                *counts.entry(t).or_default() += 1;
            }
            penalties = counts.into_iter().collect();
            penalties.sort_unstable();
        }
        let r = if p.temperature > 0.0 { self.rng.gen() } else { 0.0 };
        SampleRow {
            temperature: p.temperature,
            top_k: p.top_k,
            top_p: p.top_p,
            min_p: p.min_p,
            repeat_penalty: p.repeat_penalty,
            presence_penalty: p.presence_penalty,
            frequency_penalty: p.frequency_penalty,
            penalties,
            bias: vec![],
            r,
        }
    }
}

/// Numerically stable softmax.
pub fn softmax(x: &[f32]) -> Vec<f32> {
    let m = x.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    let e: Vec<f32> = x.iter().map(|&v| (v - m).exp()).collect();
    let s: f32 = e.iter().sum();
    e.into_iter().map(|v| v / s).collect()
}

/// Log-softmax of one row, in f64 (perplexity).
pub fn log_softmax_at(x: &[f32], idx: usize) -> f64 {
    let m = x.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    let s: f64 = x.iter().map(|&v| (v as f64 - m).exp()).sum();
    x[idx] as f64 - m - s.ln()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn greedy_picks_max_first_on_ties() {
        let mut s = Sampler::new(SamplingParams::greedy());
        assert_eq!(s.sample(&[1.0, 3.0, 3.0, -1.0], &[]), 1);
    }

    #[test]
    fn repeat_penalty_changes_greedy_choice() {
        let mut p = SamplingParams::greedy();
        p.repeat_penalty = 2.0;
        let mut s = Sampler::new(p);
        assert_eq!(s.sample(&[1.0, 1.5], &[1]), 0);
        let mut p = SamplingParams::greedy();
        p.presence_penalty = 1.0;
        let mut s = Sampler::new(p);
        assert_eq!(s.sample(&[1.0, 1.5], &[1]), 0);
    }

    #[test]
    fn top_k_one_is_greedy() {
        let p = SamplingParams { top_k: 1, temperature: 5.0, ..Default::default() };
        let mut s = Sampler::new(p);
        for _ in 0..20 {
            assert_eq!(s.sample(&[0.1, 0.3, 0.2], &[]), 1);
        }
    }

    #[test]
    fn min_p_excludes_unlikely_tokens() {
        let mut p = SamplingParams { top_k: 0, top_p: 1.0, min_p: 0.5, temperature: 1.0, ..Default::default() };
        p.seed = 3;
        let mut s = Sampler::new(p);
        for _ in 0..200 {
            assert_ne!(s.sample(&[5.0, 0.0, 5.0], &[]), 1);
        }
    }

    proptest! {
        #[test]
        fn same_seed_same_tokens(seed in any::<u64>(), logits in proptest::collection::vec(-10f32..10.0, 2..50)) {
            let p = SamplingParams { seed, temperature: 1.0, ..Default::default() };
            let (mut a, mut b) = (Sampler::new(p.clone()), Sampler::new(p));
            for _ in 0..10 {
                let (x, y) = (a.sample(&logits, &[]), b.sample(&logits, &[]));
                prop_assert_eq!(x, y);
                prop_assert!((x as usize) < logits.len());
            }
        }

        #[test]
        fn top_p_keeps_only_nucleus(logits in proptest::collection::vec(-5f32..5.0, 2..30), seed in any::<u64>()) {
            let p = SamplingParams { seed, temperature: 1.0, top_k: 0, top_p: 0.0, min_p: 0.0, ..Default::default() };
            let mut s = Sampler::new(p);
            // top_p = 0 keeps one token: the argmax
            prop_assert_eq!(s.sample(&logits, &[]), argmax(&logits));
        }
    }

    proptest::proptest! {
        /// The vectorized argmax picks what the one-pass reference picks, ties and NaNs included.
        #[test]
        fn argmax_matches_reference(v in proptest::collection::vec(proptest::prop_oneof![
            -4i8..4i8, proptest::strategy::Just(i8::MIN)], 0..100)) {
            // few distinct values (many ties); i8::MIN stands for a NaN
            let logits: Vec<f32> = v.iter().map(|&x| if x == i8::MIN { f32::NAN } else { x as f32 }).collect();
            proptest::prop_assert_eq!(argmax(&logits), argmax_ref(&logits));
        }
    }
}
