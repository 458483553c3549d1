//! One sequence's decode logic, shared by `Engine::generate` and the service: how the next
//! token is picked (the sampling chain and its seeded draw), where the pick runs (device or
//! host), and what a picked token becomes (detokenized text, stop strings, finish rules,
//! log-probabilities).
//!
//! ```text
//!  SeqDecoder::next_pick(history) ─► RowPick ─┐
//!                                             ▼
//!       forward_picks: ForwardBatch ─► Model::forward_argmax / forward_sample (ids only)
//!                                 └──► Model::forward + host pick (a row wants its logits)
//!                                             │
//!  SeqDecoder::accept(id, logits) ◄── Picked ◄┘ ─► Accepted { token text, finish }
//!  SeqDecoder::finish(reason) ─► held-back text released (unless it completes a stop string)
//! ```

use crate::constraint::{Constraint, TokenMask};
use crate::generate::{FinishReason, GenerateParams};
use crate::sampler::{argmax, Sampler};
use crate::service::TokenLogprob;
use crate::stop::{StopMatcher, StopOutcome};
use quarrel_core::{sample_row_ref, Backend, CoreError, ForwardBatch, SampleRow};
use quarrel_models::Model;
use quarrel_tokenizer::{Detokenizer, Tokenizer};
use std::sync::Arc;

/// How one logits row becomes a token.
#[derive(Clone, Debug, PartialEq)]
pub enum Pick {
    /// Plain greedy: the first largest raw logit.
    Argmax,
    /// The request's sampling chain with this step's draw (greedy with penalties included).
    Chain(SampleRow),
}

impl Pick {
    /// The chain a device sampler runs for this pick; `Argmax` is the greedy chain without
    /// penalties, which a device computes exactly as its argmax.
    fn as_row(&self) -> SampleRow {
        match self {
            Pick::Chain(r) => r.clone(),
            Pick::Argmax => SampleRow {
                temperature: 0.0,
                top_k: 0,
                top_p: 1.0,
                min_p: 0.0,
                repeat_penalty: 1.0,
                presence_penalty: 0.0,
                frequency_penalty: 0.0,
                penalties: vec![],
                r: 0.0,
            },
        }
    }

    /// The pick over logits on the host (the reference the device matches).
    pub fn on_host(&self, logits: &[f32]) -> u32 {
        match self {
            Pick::Argmax => argmax(logits),
            Pick::Chain(r) => sample_row_ref(logits, r),
        }
    }
}

/// One logits row's pick, whether its logits must come to the host (log-probabilities), the
/// tokens a constraint allows (the others get -inf before the chain runs), and biases added to
/// some tokens' logits first.
#[derive(Clone, Debug, PartialEq)]
pub struct RowPick {
    pub pick: Pick,
    pub logits: bool,
    pub mask: Option<TokenMask>,
    pub bias: Option<Arc<[(u32, f32)]>>,
}

impl RowPick {
    /// A pick with nothing to report, mask or bias.
    pub fn plain(pick: Pick) -> RowPick {
        RowPick { pick, logits: false, mask: None, bias: None }
    }

    /// Whether the pick needs the logits on the host: reported log-probabilities, a
    /// constraint's mask or logit biases, which the host applies before the sampling chain.
    pub fn on_host(&self) -> bool {
        self.logits || self.mask.is_some() || self.bias.is_some()
    }
}

/// A picked token, with its logits row when the pick asked for it.
#[derive(Clone, Debug, PartialEq)]
pub struct Picked {
    pub id: u32,
    pub logits: Option<Vec<f32>>,
}

/// Picks over logits already on the host: `logits` holds one row of `n_vocab` per pick.
pub fn pick_on_host(logits: &[f32], n_vocab: usize, rows: &[RowPick]) -> Result<Vec<Picked>, String> {
    pick_on_host_threads(logits, n_vocab, rows, 1)
}

/// [`pick_on_host`] with the rows spread over up to `threads` threads (each row's pick is
/// independent: the same picks whatever the thread count).
pub fn pick_on_host_threads(logits: &[f32], n_vocab: usize, rows: &[RowPick], threads: usize) -> Result<Vec<Picked>, String> {
    if n_vocab == 0 || logits.len() != n_vocab * rows.len() {
        return Err(format!("{} logits are not {} rows of {n_vocab}", logits.len(), rows.len()));
    }
    let per_thread = rows.len().div_ceil(threads.max(1)).max(1);
    if per_thread >= rows.len() {
        return Ok(pick_rows(logits, n_vocab, rows));
    }
    std::thread::scope(|sc| {
        let parts: Vec<_> = logits
            .chunks(per_thread * n_vocab)
            .zip(rows.chunks(per_thread))
            .map(|(l, r)| sc.spawn(move || pick_rows(l, n_vocab, r)))
            .collect();
        parts.into_iter().try_fold(Vec::with_capacity(rows.len()), |mut out, p| {
            out.extend(p.join().map_err(|_| "a host pick failed".to_string())?);
            Ok(out)
        })
    })
}

fn pick_rows(logits: &[f32], n_vocab: usize, rows: &[RowPick]) -> Vec<Picked> {
    logits
        .chunks_exact(n_vocab)
        .zip(rows)
        .map(|(l, r)| {
            let id = if r.mask.is_some() || r.bias.is_some() {
                let mut adjusted = l.to_vec();
                for &(t, b) in r.bias.iter().flat_map(|b| b.iter()) {
                    if let Some(x) = adjusted.get_mut(t as usize) {
                        *x += b;
                    }
                }
                if let Some(m) = &r.mask {
                    m.apply(&mut adjusted);
                }
                r.pick.on_host(&adjusted)
            } else {
                r.pick.on_host(l)
            };
            // log-probabilities are of the model's distribution, before the mask
            Picked { id, logits: r.logits.then(|| l.to_vec()) }
        })
        .collect()
}

/// Run `batch` and pick one token per logits row (`rows`, in `batch.logits_rows` order). The
/// picks run where the logits are: on the backend (`Backend::argmax_rows` when every row is
/// plain greedy, else `Backend::sample_rows`), so a device sends back ids only; when a row
/// wants its logits (log-probabilities) or carries a constraint's mask, the logits of the
/// batch are downloaded and every row is picked on the host by the reference chain.
pub fn forward_picks<B: Backend>(
    model: &dyn Model<B>,
    be: &B,
    batch: &ForwardBatch,
    kv: &mut B::Kv,
    rows: &[RowPick],
) -> Result<Vec<Picked>, CoreError> {
    if rows.len() != batch.logits_rows.len() {
        return Err(CoreError::Shape(format!("{} picks for {} logits rows", rows.len(), batch.logits_rows.len())));
    }
    if rows.is_empty() || rows.iter().any(RowPick::on_host) {
        let logits = model.forward(be, batch, kv)?;
        return pick_on_host(&logits, model.info().n_vocab, rows).map_err(CoreError::Backend);
    }
    let ids = if rows.iter().all(|r| r.pick == Pick::Argmax) {
        model.forward_argmax(be, batch, kv)?
    } else {
        let chains: Vec<SampleRow> = rows.iter().map(|r| r.pick.as_row()).collect();
        model.forward_sample(be, batch, kv, &chains)?
    };
    if ids.len() != rows.len() {
        return Err(CoreError::Backend(format!("the model picked {} tokens for {} rows", ids.len(), rows.len())));
    }
    Ok(ids.into_iter().map(|id| Picked { id, logits: None }).collect())
}

/// What an accepted token gives the caller.
#[derive(Debug, Default)]
pub struct Accepted {
    /// The token to stream (None: an end-of-generation token, which is not part of the
    /// output) with the text it completes (empty while text is held back).
    pub token: Option<(u32, String)>,
    pub logprob: Option<TokenLogprob>,
    /// Set when the sequence is finished; then call `SeqDecoder::finish`.
    pub finish: Option<FinishReason>,
}

/// One sequence's sampler, detokenizer, stop matcher and finish rules.
pub struct SeqDecoder {
    sampler: Sampler,
    detok: Detokenizer,
    stops: StopMatcher,
    max_tokens: usize,
    ignore_eos: bool,
    /// `Some(n)`: log-probabilities of each token and the `n` most likely ones.
    logprobs: Option<usize>,
    generated: usize,
    /// A stop string matched: nothing more is released.
    stopped: bool,
    /// Structured output: the grammar the tokens must follow.
    constraint: Option<Constraint>,
    bias: Option<Arc<[(u32, f32)]>>,
}

impl SeqDecoder {
    pub fn new(params: &GenerateParams, logprobs: Option<usize>, detok: Detokenizer) -> SeqDecoder {
        SeqDecoder {
            sampler: Sampler::new(params.sampling.clone()),
            detok,
            stops: StopMatcher::new(&params.stop),
            max_tokens: params.max_tokens,
            ignore_eos: params.ignore_eos,
            logprobs,
            generated: 0,
            stopped: false,
            constraint: None,
            bias: (!params.logit_bias.is_empty()).then(|| params.logit_bias.as_slice().into()),
        }
    }

    /// Constrain the output to `c` (a JSON schema, a grammar, ...).
    pub fn with_constraint(mut self, c: Option<Constraint>) -> SeqDecoder {
        self.constraint = c;
        self
    }

    /// The tokens the constraint allows next (None: unconstrained).
    pub fn mask(&mut self) -> Option<TokenMask> {
        self.constraint.as_mut().map(Constraint::mask)
    }

    pub fn is_constrained(&self) -> bool {
        self.constraint.is_some()
    }

    /// Tokens accepted so far (end-of-generation tokens not counted).
    pub fn generated(&self) -> usize {
        self.generated
    }

    /// How the next token is picked after `history` (prompt and generated tokens). Call once
    /// per pick: a sampling chain takes the next draw of the request's seeded RNG. A
    /// constrained sequence's mask comes from [`mask`](Self::mask), which the caller may
    /// compute while the forward pass runs.
    pub fn next_pick(&mut self, history: &[u32]) -> RowPick {
        let pick = if self.sampler.params.is_plain_greedy() { Pick::Argmax } else { Pick::Chain(self.sampler.row(history)) };
        RowPick { pick, logits: self.logprobs.is_some(), mask: None, bias: self.bias.clone() }
    }

    /// Take the picked token `id`; `seq_len` is the sequence's length with it, `logits` its
    /// row when the pick asked for it. Finish rules, in order: end of generation (unless
    /// ignored), a stop string, the constraint's grammar complete, `max_tokens`, the context
    /// full.
    pub fn accept(&mut self, tok: &Tokenizer, id: u32, logits: Option<&[f32]>, seq_len: usize, n_ctx: usize) -> Accepted {
        if tok.is_eog(id) && (!self.ignore_eos || self.constraint.is_some()) {
            return Accepted { finish: Some(FinishReason::Stop), ..Default::default() };
        }
        // a token the mask let through always advances the matcher; one that breaks it
        // ends the sequence (the grammar could not continue)
        let grammar_done = self.constraint.as_mut().is_some_and(|c| c.accept(id).is_err() || c.is_finished());
        let logprob = self.logprobs.zip(logits).map(|(n, l)| token_logprob(l, id, n, tok));
        self.generated += 1;
        let piece = self.detok.push(tok, id).unwrap_or_default();
        let text = match self.stops.push(&piece) {
            StopOutcome::Continue(s) => s,
            StopOutcome::Stop(s) => {
                self.stopped = true;
                s
            }
        };
        let finish = if self.stopped || grammar_done {
            Some(FinishReason::Stop)
        } else if self.generated >= self.max_tokens {
            Some(FinishReason::Length)
        } else if seq_len >= n_ctx {
            Some(FinishReason::ContextFull)
        } else {
            None
        };
        Accepted { token: Some((id, text)), logprob, finish }
    }

    /// The end of the sequence for `reason`: the text the detokenizer and the stop matcher
    /// still hold (none after a stop string), and the final reason (`Stop` when that text
    /// completes a stop string).
    pub fn finish(&mut self, reason: FinishReason) -> (String, FinishReason) {
        if self.stopped {
            return (String::new(), reason);
        }
        let tail = self.detok.flush();
        match self.stops.push(&tail) {
            StopOutcome::Stop(s) => {
                self.stopped = true;
                (s, FinishReason::Stop)
            }
            StopOutcome::Continue(mut s) => {
                s.push_str(&self.stops.flush());
                (s, reason)
            }
        }
    }
}

/// The chosen token's log-probability and the `n` best alternatives.
fn token_logprob(logits: &[f32], id: u32, n: usize, tok: &Tokenizer) -> TokenLogprob {
    let m = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = m + logits.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln();
    let lp = |i: usize| (logits[i] as f64 - lse) as f32;
    let text = |i: u32| String::from_utf8_lossy(&tok.token_to_piece(i, true)).into_owned();
    let mut top: Vec<u32> = (0..logits.len() as u32).collect();
    let n = n.min(top.len());
    if n > 0 && n < top.len() {
        top.select_nth_unstable_by(n - 1, |&a, &b| logits[b as usize].total_cmp(&logits[a as usize]));
    }
    top.truncate(n);
    top.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]).then(a.cmp(&b)));
    TokenLogprob {
        token: id,
        text: text(id),
        logprob: lp(id as usize),
        top: top.into_iter().map(|i| (i, text(i), lp(i as usize))).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::SamplingParams;

    #[test]
    fn host_picks_follow_each_row_and_keep_only_wanted_logits() {
        let logits = [1.0, 3.0, 3.0, 0.0, /* row 2 */ 2.0, 0.5, 0.0, 1.0];
        let penalized = Pick::Chain(SampleRow { repeat_penalty: 4.0, penalties: vec![(0, 1)], ..Pick::Argmax.as_row() });
        let rows = [RowPick::plain(Pick::Argmax), RowPick { logits: true, ..RowPick::plain(penalized) }];
        let got = pick_on_host(&logits, 4, &rows).unwrap();
        assert_eq!(got[0], Picked { id: 1, logits: None });
        // 2.0 / 4 = 0.5 < 1.0: the penalty moves the pick to token 3
        assert_eq!(got[1], Picked { id: 3, logits: Some(logits[4..].to_vec()) });
        assert!(pick_on_host(&logits, 3, &rows).is_err());
    }

    #[test]
    fn host_picks_are_the_same_on_any_number_of_threads() {
        let n_vocab = 97;
        let logits: Vec<f32> = (0..13 * n_vocab).map(|i| ((i * 7919) % 101) as f32 * 0.1).collect();
        let rows: Vec<RowPick> = (0..13)
            .map(|i| match i % 3 {
                0 => RowPick::plain(Pick::Argmax),
                1 => RowPick { logits: true, ..RowPick::plain(Pick::Argmax) },
                _ => RowPick { bias: Some(vec![(i as u32, 50.0)].into()), ..RowPick::plain(Pick::Argmax) },
            })
            .collect();
        let one = pick_on_host(&logits, n_vocab, &rows).unwrap();
        for t in [2, 3, 5, 13, 64] {
            assert_eq!(pick_on_host_threads(&logits, n_vocab, &rows, t).unwrap(), one, "{t} threads");
        }
    }

    #[test]
    fn logit_biases_move_the_pick_on_the_host_and_leave_reported_logits_alone() {
        let logits = [1.0, 3.0, 2.5, 0.0];
        let bias: Arc<[(u32, f32)]> = vec![(1, -100.0), (3, 2.9), (99, 5.0)].into();
        let row = RowPick { logits: true, bias: Some(bias.clone()), ..RowPick::plain(Pick::Argmax) };
        assert!(row.on_host());
        // token 1 banned; 0.0 + 2.9 > 2.5; an id outside the row is ignored
        assert_eq!(pick_on_host(&logits, 4, &[row]).unwrap()[0], Picked { id: 3, logits: Some(logits.to_vec()) });
        let params = GenerateParams { logit_bias: vec![(2, 1.0)], sampling: SamplingParams::greedy(), ..Default::default() };
        let mut d = SeqDecoder::new(&params, None, Detokenizer::default());
        assert_eq!(d.next_pick(&[]).bias.as_deref(), Some(&[(2, 1.0)][..]));
    }

    #[test]
    fn plain_greedy_takes_no_draw_and_sampling_one_per_pick() {
        let g = GenerateParams { sampling: SamplingParams::greedy(), ..Default::default() };
        let dummy = Detokenizer::default;
        let mut d = SeqDecoder::new(&g, None, dummy());
        assert_eq!(d.next_pick(&[1, 2]), RowPick::plain(Pick::Argmax));
        let s = GenerateParams { sampling: SamplingParams { seed: 7, ..Default::default() }, ..Default::default() };
        let (mut a, mut b) = (SeqDecoder::new(&s, Some(2), dummy()), SeqDecoder::new(&s, None, dummy()));
        let (pa, pb) = (a.next_pick(&[1]), b.next_pick(&[1]));
        assert!(pa.logits && !pb.logits, "logprobs need the logits on the host");
        assert_eq!(pa.pick, pb.pick, "logprobs do not change the chain or its draw");
        let Pick::Chain(r1) = a.next_pick(&[1]).pick else { panic!("sampled requests run the chain") };
        let Pick::Chain(r0) = pa.pick else { panic!() };
        assert_ne!(r0.r, r1.r, "each pick takes the next draw");
    }
}
