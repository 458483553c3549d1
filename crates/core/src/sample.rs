//! One logits row -> one token: the sampling chain of a request as a pure function of the
//! logits, the chain's parameters, the row's allowed tokens and one uniform draw (the
//! reference twin of `Backend::sample_rows`, which a GPU backend runs on the device; the
//! engine's `Sampler` draws `r` from the request's seeded RNG and calls this).
//!
//! ```text
//!  logits ─+bias─► mask (disallowed: -inf) ─penalties─► top-k (ties: lower ids first)
//!         ─softmax─► top-p ─► min-p ─► / temperature ─softmax─► first token whose
//!         cumulative probability passes r (none: the last with a probability above 0)
//! ```
//! The order is llama.cpp's default chain (top-p and min-p on the untempered probabilities).

use crate::{argmax, TokenMask};

/// Top-k a device sampler keeps at most (`Backend::sample_rows`; larger or 0 = "all": the
/// backend may fall back to the host).
pub const SAMPLE_MAX_K: usize = 256;

/// One row's sampling chain.
#[derive(Clone, Debug, PartialEq)]
pub struct SampleRow {
    /// 0 (or below): greedy, the first largest logit after the penalties (`r` unused).
    pub temperature: f32,
    /// 0: all tokens.
    pub top_k: usize,
    /// 1.0: off.
    pub top_p: f32,
    /// 0.0: off.
    pub min_p: f32,
    /// 1.0: off. Divides positive logits / multiplies negative ones of the `penalties` tokens.
    pub repeat_penalty: f32,
    /// Subtracted once from the logit of every `penalties` token.
    pub presence_penalty: f32,
    /// Subtracted per occurrence.
    pub frequency_penalty: f32,
    /// (token, occurrences in the penalty window), each token once.
    pub penalties: Vec<(u32, u32)>,
    /// (token, bias) added to the logits first, in order (a token may repeat; ids past the
    /// row are ignored).
    pub bias: Vec<(u32, f32)>,
    /// The uniform draw in [0, 1).
    pub r: f32,
}

impl SampleRow {
    /// Greedy without penalties or biases: the first largest logit.
    pub fn greedy() -> SampleRow {
        SampleRow {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repeat_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            penalties: vec![],
            bias: vec![],
            r: 0.0,
        }
    }

    /// Whether the pick is the argmax of the raw logits (no sampling, penalties or biases).
    pub fn is_plain_argmax(&self) -> bool {
        self.temperature <= 0.0 && self.penalties.is_empty() && self.bias.is_empty()
    }

    /// Whether a device sampler bounded by `SAMPLE_MAX_K` takes this row.
    pub fn device_ok(&self) -> bool {
        self.temperature <= 0.0 || (1..=SAMPLE_MAX_K).contains(&self.top_k)
    }
}

/// `logits` with the biases of `row` added, the tokens `mask` disallows at -inf, then the
/// penalties of `row` (which leave -inf as it is).
pub fn adjusted(logits: &[f32], row: &SampleRow, mask: Option<&TokenMask>) -> Vec<f32> {
    let mut l = logits.to_vec();
    for &(t, b) in &row.bias {
        if let Some(v) = l.get_mut(t as usize) {
            *v += b;
        }
    }
    if let Some(m) = mask {
        m.apply(&mut l);
    }
    for &(t, n) in &row.penalties {
        let Some(v) = l.get_mut(t as usize) else { continue };
        if *v > 0.0 {
            *v /= row.repeat_penalty;
        } else {
            *v *= row.repeat_penalty;
        }
        *v -= n as f32 * row.frequency_penalty + row.presence_penalty;
    }
    l
}

/// Softmax in order: max, e^(x - max), a left-to-right f32 sum, each divided by the sum.
pub fn softmax_seq(x: &[f32]) -> Vec<f32> {
    let m = x.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    let e: Vec<f32> = x.iter().map(|&v| (v - m).exp()).collect();
    let s: f32 = e.iter().sum();
    e.into_iter().map(|v| v / s).collect()
}

/// The candidates top-k keeps, sorted by logit descending then id ascending (`total_cmp`
/// order; ties at the k-th place keep the lower ids).
pub fn top_k_sorted(l: &[f32], top_k: usize) -> Vec<(u32, f32)> {
    let order = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    let mut cand: Vec<(u32, f32)> = l.iter().enumerate().map(|(i, &v)| (i as u32, v)).collect();
    let k = if top_k == 0 { cand.len() } else { top_k.min(cand.len()) };
    if k == 0 {
        return cand;
    }
    if k < cand.len() {
        cand.select_nth_unstable_by(k - 1, order);
        cand.truncate(k);
    }
    cand.sort_by(order);
    cand
}

/// How many of the sorted candidates with probabilities `probs` top-p and min-p keep (>= 1).
pub fn nucleus(probs: &[f32], top_p: f32, min_p: f32) -> usize {
    let mut keep = probs.len();
    if top_p < 1.0 {
        let mut cum = 0.0f32;
        for (i, &pr) in probs.iter().enumerate() {
            cum += pr;
            if cum >= top_p {
                keep = i + 1;
                break;
            }
        }
    }
    if min_p > 0.0 && !probs.is_empty() {
        let thr = min_p * probs[0];
        keep = keep.min(probs.iter().take_while(|&&pr| pr >= thr).count().max(1));
    }
    keep.max(1)
}

/// The token `row` picks from `logits` (the reference of `Backend::sample_rows` for an
/// unconstrained row).
pub fn sample_row_ref(logits: &[f32], row: &SampleRow) -> u32 {
    sample_masked_ref(logits, row, None)
}

/// The token `row` picks from `logits` among the tokens `mask` allows (the reference of
/// `Backend::sample_rows`). A mask that allows some token always gets one of them.
pub fn sample_masked_ref(logits: &[f32], row: &SampleRow, mask: Option<&TokenMask>) -> u32 {
    if logits.is_empty() {
        return 0;
    }
    let l = adjusted(logits, row, mask);
    if row.temperature <= 0.0 {
        return argmax(&l);
    }
    let mut cand = top_k_sorted(&l, row.top_k);
    let probs = softmax_seq(&cand.iter().map(|c| c.1).collect::<Vec<_>>());
    cand.truncate(nucleus(&probs, row.top_p, row.min_p));
    let probs = softmax_seq(&cand.iter().map(|c| c.1 / row.temperature).collect::<Vec<_>>());
    let mut cum = 0.0f32;
    // a draw past the rounded total: the last token that can be drawn (a masked token, at
    // probability 0, never)
    let mut last = cand[0].0;
    for (c, &pr) in cand.iter().zip(&probs) {
        cum += pr;
        if row.r < cum {
            return c.0;
        }
        if pr > 0.0 {
            last = c.0;
        }
    }
    last
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn row(top_k: usize, top_p: f32, min_p: f32, temperature: f32, r: f32) -> SampleRow {
        SampleRow { temperature, top_k, top_p, min_p, r, ..SampleRow::greedy() }
    }

    #[test]
    fn greedy_and_top_k_one_pick_the_first_largest() {
        let l = [1.0, 3.0, 3.0, -1.0];
        assert_eq!(sample_row_ref(&l, &row(0, 1.0, 0.0, 0.0, 0.5)), 1);
        for r in [0.0, 0.5, 0.999] {
            assert_eq!(sample_row_ref(&l, &row(1, 1.0, 0.0, 2.0, r)), 1);
        }
    }

    #[test]
    fn ties_at_the_kth_place_keep_lower_ids() {
        let l = [0.0, 5.0, 2.0, 2.0, 2.0];
        let c = top_k_sorted(&l, 3);
        assert_eq!(c.iter().map(|c| c.0).collect::<Vec<_>>(), vec![1, 2, 3]);
    }

    #[test]
    fn penalties_change_the_greedy_choice() {
        let mut p = row(0, 1.0, 0.0, 0.0, 0.0);
        p.repeat_penalty = 2.0;
        p.penalties = vec![(1, 1)];
        assert_eq!(sample_row_ref(&[1.0, 1.5], &p), 0);
        let mut p = row(0, 1.0, 0.0, 0.0, 0.0);
        p.presence_penalty = 1.0;
        p.penalties = vec![(1, 3), (7, 1)]; // an id past the vocabulary is ignored
        assert_eq!(sample_row_ref(&[1.0, 1.5], &p), 0);
    }

    #[test]
    fn the_draw_walks_the_cumulative_probabilities() {
        // two equal logits: r below 0.5 picks the first, above the second
        let l = [0.0, 4.0, 4.0];
        assert_eq!(sample_row_ref(&l, &row(2, 1.0, 0.0, 1.0, 0.25)), 1);
        assert_eq!(sample_row_ref(&l, &row(2, 1.0, 0.0, 1.0, 0.75)), 2);
        // top_p = 0 keeps the top token only
        assert_eq!(sample_row_ref(&l, &row(0, 0.0, 0.0, 1.0, 0.99)), 1);
    }

    #[test]
    fn biases_come_first_then_the_mask_then_the_penalties() {
        let l = [1.0, 3.0, 2.5, 0.0];
        let mut g = SampleRow::greedy();
        g.bias = vec![(1, -100.0), (3, 2.0), (3, 0.9), (99, 5.0)];
        // token 1 banned; 0.0 + 2.0 + 0.9 > 2.5; an id outside the row is ignored
        assert_eq!(sample_row_ref(&l, &g), 3);
        let only_0_1 = TokenMask::from_words(vec![0b11]);
        // the bias lifts token 3, but the mask leaves only 0 and 1 (1 at -99)
        assert_eq!(sample_masked_ref(&l, &g, Some(&only_0_1)), 0);
        // a penalty never brings a masked token back
        let mut p = SampleRow { repeat_penalty: 2.0, frequency_penalty: -50.0, penalties: vec![(2, 1)], ..SampleRow::greedy() };
        assert_eq!(sample_masked_ref(&l, &p, Some(&only_0_1)), 1);
        p.temperature = 1.0;
        for r in [0.0, 0.5, 0.999_999_9] {
            assert_eq!(
                sample_masked_ref(&[0.0, 9.0, 0.0], &SampleRow { r, ..p.clone() }, Some(&TokenMask::from_words(vec![0b101]))) % 2,
                0
            );
        }
    }

    #[test]
    fn a_draw_past_the_rounded_total_never_lands_on_a_masked_token() {
        // seven allowed tokens, 33 masked ones with larger logits behind them (at -inf: among
        // top-k 40 at probability 0); where the allowed probabilities sum below the draw, the
        // pick is the last allowed candidate
        let mask = TokenMask::from_words(vec![0x7f]);
        let p = row(40, 1.0, 0.0, 0.7, 0.999_999_94);
        let mut checked = 0;
        for seed in 0..400u32 {
            let allowed: Vec<f32> = (0..7).map(|i| ((seed * 7 + i).wrapping_mul(2654435761) % 4000) as f32 / 1000.0 - 2.0).collect();
            let mut sorted = allowed.clone();
            sorted.sort_by(|a, b| b.total_cmp(a));
            let total: f32 = softmax_seq(&sorted.iter().map(|v| v / p.temperature).collect::<Vec<_>>()).iter().sum();
            if total > p.r {
                continue;
            }
            checked += 1;
            let l: Vec<f32> = allowed.iter().copied().chain([5.0; 33]).collect();
            let id = sample_masked_ref(&l, &p, Some(&mask));
            assert!(mask.allows(id), "seed {seed}: picked masked token {id}");
        }
        assert!(checked > 0, "no draw past the rounded total");
    }

    proptest! {
        /// A masked pick is the pick over the logits with the disallowed ones at -inf, and
        /// always an allowed token.
        #[test]
        fn masked_picks_are_allowed(l in proptest::collection::vec(-8f32..8.0, 1..200), words in proptest::collection::vec(any::<u32>(), 1..8),
                                    k in 0usize..50, top_p in 0f32..=1.0, min_p in 0f32..0.5, t in 0f32..3.0, r in 0f32..1.0) {
            let mask = TokenMask::from_words(words);
            let p = row(k, top_p, min_p, t, r);
            let id = sample_masked_ref(&l, &p, Some(&mask));
            let mut minf = l.clone();
            mask.apply(&mut minf);
            prop_assert_eq!(id, sample_row_ref(&minf, &p));
            if minf.iter().any(|v| v.is_finite()) {
                prop_assert!(mask.allows(id), "picked {} outside the mask", id);
            }
        }

        /// The pick is always a kept candidate: within the top-k, and never below min-p.
        #[test]
        fn picks_stay_in_the_kept_set(l in proptest::collection::vec(-8f32..8.0, 1..200), k in 0usize..50, top_p in 0f32..=1.0,
                                      min_p in 0f32..0.5, t in 0.05f32..3.0, r in 0f32..1.0) {
            let p = row(k, top_p, min_p, t, r);
            let id = sample_row_ref(&l, &p) as usize;
            prop_assert!(id < l.len());
            if k > 0 {
                let above = l.iter().filter(|&&v| v > l[id]).count();
                prop_assert!(above < k, "picked {} with {} larger logits, k {}", id, above, k);
            }
            let m = l.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            prop_assert!((l[id] - m).exp() >= min_p * 0.999, "picked {} below min-p", id);
        }
    }
}
