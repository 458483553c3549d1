//! Self-consistency of a backend's numerics (`Consistency::consistency`, `quarrel consistency`):
//! whether the logits of a position depend on how the tokens reached the model. Three
//! comparisons over seeded random token ids:
//!
//! | check | reference | compared with |
//! |---|---|---|
//! | `prefill vs prefill+decode` | all N tokens in one prefill (chunks of `n_batch`) | the first P prefilled, the rest decoded one at a time |
//! | `prefill vs decode` | the same prefill | every token decoded one at a time from the start |
//! | `batched vs alone` | each of S sequences (different lengths and tokens) alone | all S in one forward pass |
//!
//! Per compared position: the NMSE of the logits (sum of squared differences over the sum of
//! squares of the reference) and whether the greedy pick (argmax) agrees. An exact backend
//! gives 0 everywhere; one whose prefill and decode kernels sum in different float orders
//! gives roundings, which a model's random weights can amplify.

use crate::bench::random_tokens;
use quarrel_core::Backend;
use quarrel_engine::{Engine, EngineError};
use rand::{Rng, SeedableRng};

/// What [`Consistency::consistency`] runs.
#[derive(Clone, Debug)]
pub struct ConsistencyOptions {
    /// Tokens of the test sequence (BOS first when the model adds one, then random ids).
    pub n_tokens: usize,
    /// Tokens prefilled before the rest are decoded one at a time (`prefill vs prefill+decode`).
    pub n_prefill: usize,
    /// Sequences of the batch check (at most the engine's `n_seq`; 0: no batch check).
    pub n_seqs: usize,
    /// Seed of the token ids.
    pub seed: u64,
}

impl Default for ConsistencyOptions {
    fn default() -> Self {
        ConsistencyOptions { n_tokens: 64, n_prefill: 32, n_seqs: 8, seed: 1 }
    }
}

/// One comparison: NMSE and argmax agreement at every compared position.
#[derive(Clone, Debug)]
pub struct ConsistencyCheck {
    pub name: &'static str,
    pub nmse: Vec<f64>,
    /// Positions whose greedy pick differs.
    pub argmax_differ: usize,
}

impl ConsistencyCheck {
    pub fn worst(&self) -> f64 {
        self.nmse.iter().copied().fold(0.0, f64::max)
    }

    pub fn mean(&self) -> f64 {
        if self.nmse.is_empty() {
            0.0
        } else {
            self.nmse.iter().sum::<f64>() / self.nmse.len() as f64
        }
    }

    /// Positions whose logits are bit for bit the reference's (NMSE exactly 0).
    pub fn identical(&self) -> usize {
        self.nmse.iter().filter(|e| **e == 0.0).count()
    }

    fn add(&mut self, reference: &[f32], other: &[f32]) {
        self.nmse.push(nmse(reference, other));
        if argmax(reference) != argmax(other) {
            self.argmax_differ += 1;
        }
    }
}

/// Normalized mean squared error of `b` against `a` (0 when both are all zeros).
pub fn nmse(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((*x as f64) - (*y as f64)).powi(2)).sum();
    let den: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum();
    if a.len() != b.len() || num.is_nan() {
        return f64::INFINITY;
    }
    if num == 0.0 {
        0.0
    } else {
        num / den.max(f64::MIN_POSITIVE)
    }
}

fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best
}

/// The consistency checks on an [`Engine`] (`use quarrel_bench::Consistency` brings them into
/// scope).
pub trait Consistency {
    /// Run the three comparisons of the module docs. The engine's `n_batch` sets the prefill's
    /// chunks; the batch check needs `n_seq >= o.n_seqs` and every sequence within `n_ctx`.
    fn consistency(&mut self, o: &ConsistencyOptions) -> Result<Vec<ConsistencyCheck>, EngineError>;
}

impl<B: Backend> Consistency for Engine<B> {
    fn consistency(&mut self, o: &ConsistencyOptions) -> Result<Vec<ConsistencyCheck>, EngineError> {
        if o.n_tokens == 0 || o.n_prefill > o.n_tokens {
            return Err(EngineError::InvalidRequest(format!(
                "consistency: {} prefill tokens of {} (need 0 <= prefill <= tokens, tokens > 0)",
                o.n_prefill, o.n_tokens
            )));
        }
        if o.n_tokens > self.opts.n_ctx {
            return Err(EngineError::PromptTooLong { prompt: o.n_tokens, ctx: self.opts.n_ctx });
        }
        if o.n_seqs > self.opts.n_seq {
            return Err(EngineError::InvalidRequest(format!(
                "consistency: {} sequences in a batch, the cache holds {}",
                o.n_seqs, self.opts.n_seq
            )));
        }
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(o.seed);
        let tokens = random_tokens(self, o.n_tokens, &mut rng);
        let reference = self.eval_all(&tokens)?;

        let mut after_prefill = ConsistencyCheck { name: "prefill vs prefill+decode", nmse: vec![], argmax_differ: 0 };
        let after = stepped(self, &tokens, o.n_prefill)?;
        reference.iter().zip(&after).for_each(|(a, b)| after_prefill.add(a, b));

        let mut from_start = ConsistencyCheck { name: "prefill vs decode", nmse: vec![], argmax_differ: 0 };
        let decoded = stepped(self, &tokens, 0)?;
        reference.iter().zip(&decoded).for_each(|(a, b)| from_start.add(a, b));

        let mut checks = vec![after_prefill, from_start];
        if o.n_seqs > 0 {
            // lengths spread over [n/4, n], each sequence its own tokens
            let seqs: Vec<Vec<u32>> = (0..o.n_seqs)
                .map(|_| {
                    let len = rng.gen_range((o.n_tokens / 4).max(1)..=o.n_tokens);
                    random_tokens(self, len, &mut rng)
                })
                .collect();
            let batched = self.forward_batch(&seqs)?;
            let mut check = ConsistencyCheck { name: "batched vs alone", nmse: vec![], argmax_differ: 0 };
            for (s, toks) in seqs.iter().enumerate() {
                let alone = self.eval_all(toks)?;
                alone.iter().zip(&batched[s]).for_each(|(a, b)| check.add(a, b));
            }
            checks.push(check);
        }
        Ok(checks)
    }
}

/// Logits at every position: the first `n_prefill` tokens in one pass (chunks of `n_batch`),
/// then one decode step per token.
fn stepped<B: Backend>(e: &mut Engine<B>, tokens: &[u32], n_prefill: usize) -> Result<Vec<Vec<f32>>, EngineError> {
    let mut table = vec![];
    let r = (|| {
        let want: Vec<usize> = (0..n_prefill).collect();
        let mut out = if n_prefill > 0 { e.eval_sequence(&mut table, &tokens[..n_prefill], 0, &want)? } else { vec![] };
        for (p, &t) in tokens.iter().enumerate().skip(n_prefill) {
            out.extend(e.eval_sequence(&mut table, &[t], p, &[0])?);
        }
        Ok(out)
    })();
    e.release_blocks(&mut table);
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nmse_and_argmax() {
        assert_eq!(nmse(&[1.0, 2.0], &[1.0, 2.0]), 0.0);
        assert!((nmse(&[3.0, 4.0], &[3.0, 3.0]) - 1.0 / 25.0).abs() < 1e-12);
        assert_eq!(nmse(&[0.0], &[0.0]), 0.0);
        assert!(nmse(&[1.0], &[f32::NAN]).is_infinite());
        assert_eq!(argmax(&[0.5, 2.0, 2.0, -1.0]), 1);
        let mut c = ConsistencyCheck { name: "t", nmse: vec![], argmax_differ: 0 };
        c.add(&[1.0, 0.0], &[0.0, 1.0]);
        c.add(&[1.0, 0.0], &[1.0, 0.0]);
        assert_eq!((c.argmax_differ, c.identical()), (1, 1));
        assert!((c.worst() - 2.0).abs() < 1e-12 && (c.mean() - 1.0).abs() < 1e-12);
    }
}
