//! The host router, for routings the device router (`moe_dev`, every token count) does not take
//! (more than 8 experts used or 1,024 experts):
//! `quarrel_core::moe::route_reference`'s result bit for bit, but the top `n_used` by repeated
//! selection instead of a full sort per token (the same order: larger first, NaN last, ties by
//! the lower expert), and the tokens split over threads. A 512-token prefill of 128 experts
//! spent milliseconds per MoE layer in the reference's sort while the GPU waited.

use quarrel_core::moe::softmax_reference;
use quarrel_core::{CoreError, MoeRouting, Route};

/// Tokens per thread at least (fewer: one thread): a thread's start costs tens of
/// microseconds, a token's routing about one.
const MIN_TOKENS_PER_THREAD: usize = 64;
const MAX_THREADS: usize = 8;

/// `route_reference(logits, bias, p)`, fast (see the module doc).
pub fn route_fast(logits: &[f32], bias: Option<&[f32]>, p: &MoeRouting) -> quarrel_core::Result<Vec<Route>> {
    let ne = p.n_expert;
    let n_tok = quarrel_core::moe::check_route_args(logits, bias, p)?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = cores.min(MAX_THREADS).min(n_tok / MIN_TOKENS_PER_THREAD).max(1);
    if threads == 1 {
        return Ok(route_rows(logits, bias, p, 0));
    }
    let per = n_tok.div_ceil(threads);
    let parts: Vec<Vec<Route>> = std::thread::scope(|s| {
        let hs: Vec<_> = logits.chunks(per * ne).enumerate().map(|(i, c)| s.spawn(move || route_rows(c, bias, p, i * per))).collect();
        hs.into_iter().map(|h| h.join().unwrap_or_default()).collect()
    });
    let out: Vec<Route> = parts.into_iter().flatten().collect();
    if out.len() != n_tok * p.n_used {
        return Err(CoreError::Backend("MoE router thread failed".into()));
    }
    Ok(out)
}

/// a (value va, expert a) ranks before b: larger first, NaN last, ties by the lower expert.
fn before(va: f32, a: usize, vb: f32, b: usize) -> bool {
    let (na, nb) = (va.is_nan(), vb.is_nan());
    if na || nb {
        return if na == nb { a < b } else { nb };
    }
    va > vb || (va == vb && a < b)
}

fn route_rows(logits: &[f32], bias: Option<&[f32]>, p: &MoeRouting, t0: usize) -> Vec<Route> {
    let ne = p.n_expert;
    let mut out = Vec::with_capacity(logits.len() / ne * p.n_used);
    let mut probs = vec![0f32; ne];
    let mut sel = vec![0f32; ne];
    let mut taken = vec![false; ne];
    let mut chosen = Vec::with_capacity(p.n_used);
    for (t, row) in logits.chunks(ne).enumerate() {
        quarrel_core::moe::gate_probs(row, p.gating, &softmax_reference, &mut probs);
        for (e, s) in sel.iter_mut().enumerate() {
            *s = probs[e] + bias.map_or(0.0, |b| b[e]);
        }
        chosen.clear();
        for _ in 0..p.n_used {
            let mut best = usize::MAX;
            for e in 0..ne {
                if !taken[e] && (best == usize::MAX || before(sel[e], e, sel[best], best)) {
                    best = e;
                }
            }
            taken[best] = true;
            chosen.push(best);
        }
        let w = quarrel_core::moe::chosen_weights(&chosen, &probs, p, &softmax_reference);
        for (&e, &wt) in chosen.iter().zip(&w) {
            taken[e] = false;
            out.push(Route { token: (t0 + t) as u32, expert: e as u32, weight: wt });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use quarrel_core::moe::route_reference;
    use quarrel_core::Gating;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        /// Equal to the reference bit for bit: ties (values from a small set), NaN, bias,
        /// softmax, sigmoid and softmax over the chosen, renormalization, scale, one and many threads.
        #[test]
        fn fast_router_equals_reference(seed in any::<u64>(), ne in 1usize..140, used_frac in 0.0f64..1.0, n_tok in 1usize..300,
                                        gating_i in 0usize..3, norm in any::<bool>(), with_bias in any::<bool>(), scale_i in 0usize..3) {
            let n_used = ((ne as f64 * used_frac) as usize).clamp(1, ne.min(8));
            let mut s = seed | 1;
            let mut r = || { s ^= s << 13; s ^= s >> 7; s ^= s << 17; s };
            let vals = [0.0f32, -0.0, 1.5, -2.0, 3.25, f32::NAN, 1e-30, -7.0];
            let logits: Vec<f32> = (0..n_tok * ne).map(|_| {
                let v = r();
                if v % 4 == 0 { vals[(v >> 8) as usize % vals.len()] } else { ((v >> 11) as f64 / (1u64 << 53) as f64 * 16.0 - 8.0) as f32 }
            }).collect();
            let bias: Option<Vec<f32>> = with_bias.then(|| (0..ne).map(|_| ((r() >> 40) % 5) as f32 * 0.25 - 0.5).collect());
            let p = MoeRouting { n_expert: ne, n_used, gating: [Gating::Softmax, Gating::Sigmoid, Gating::SoftmaxWeight][gating_i], norm_weights: norm, scale: [0.0, 1.0, 2.5][scale_i] };
            let want = route_reference(&logits, bias.as_deref(), &p).unwrap();
            let got = route_fast(&logits, bias.as_deref(), &p).unwrap();
            prop_assert_eq!(want.len(), got.len());
            for (a, b) in want.iter().zip(&got) {
                prop_assert!(a.token == b.token && a.expert == b.expert && a.weight.to_bits() == b.weight.to_bits(), "{:?} vs {:?}", a, b);
            }
        }
    }

    #[test]
    fn bad_shapes_are_errors() {
        let p = MoeRouting { n_expert: 4, n_used: 2, gating: Gating::Softmax, norm_weights: false, scale: 0.0 };
        assert!(route_fast(&[0.0; 7], None, &p).is_err());
        assert!(route_fast(&[0.0; 8], Some(&[0.0; 3]), &p).is_err());
        assert!(route_fast(&[0.0; 8], None, &MoeRouting { n_used: 5, ..p }).is_err());
        assert_eq!(route_fast(&[], None, &p).unwrap(), vec![]);
    }
}
