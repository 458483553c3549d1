//! One sequence's decode logic, shared by `Engine::generate` and the service: how the next
//! token is picked (the sampling chain and its seeded draw, logit biases, a constraint's mask),
//! where the pick runs (device or host), and what a picked token becomes (detokenized text,
//! stop strings, finish rules, log-probabilities).
//!
//! ```text
//!  SeqDecoder::next_pick(history) ─► RowPick ─┐     SeqDecoder::mask_job(row) ─► MaskJob ─┐
//!                                             ▼                                           ▼
//!  forward_picks: Model::logits (queued on a device)  ║  rayon's pool: Constraint::mask ─► RowMasks
//!                 ─► Backend::argmax_rows / sample_rows (waits for the masks, applies them)
//!                 ─► ids, and the logits of the rows that want them (log-probabilities)
//!  advance_constraints: each constraint past its pick (in parallel; a batch's sequences)
//!  SeqDecoder::accept(id, logits) ◄── Picked ◄┘ ─► Accepted { token text, finish }
//!  SeqDecoder::finish(reason) ─► held-back text released (unless it completes a stop string)
//! ```

use crate::constraint::Constraint;
use crate::generate::{FinishReason, GenerateParams};
use crate::sampler::{argmax, Sampler};
use crate::service::TokenLogprob;
use crate::stop::{StopMatcher, StopOutcome};
use quarrel_core::{sample_masked_ref, Backend, CoreError, ForwardBatch, RowMasks, SampleRow, TokenMask};
use quarrel_models::Model;
use quarrel_tokenizer::{Detokenizer, Tokenizer};

/// How one logits row becomes a token.
#[derive(Clone, Debug, PartialEq)]
pub enum Pick {
    /// Plain greedy: the first largest raw logit.
    Argmax,
    /// The request's sampling chain with this step's draw (greedy with penalties or logit
    /// biases included).
    Chain(SampleRow),
}

impl Pick {
    /// The chain a backend's sampler runs for this pick; `Argmax` is the greedy chain without
    /// penalties or biases, which a device computes exactly as its argmax.
    fn as_row(&self) -> SampleRow {
        match self {
            Pick::Chain(r) => r.clone(),
            Pick::Argmax => SampleRow::greedy(),
        }
    }

    /// The pick over logits on the host among the tokens `mask` allows (the reference the
    /// device matches).
    pub fn on_host(&self, logits: &[f32], mask: Option<&TokenMask>) -> u32 {
        match (self, mask) {
            (Pick::Argmax, None) => argmax(logits),
            (Pick::Argmax, Some(_)) => sample_masked_ref(logits, &SampleRow::greedy(), mask),
            (Pick::Chain(r), _) => sample_masked_ref(logits, r, mask),
        }
    }
}

/// One logits row's pick, and whether its logits must come to the host (log-probabilities).
#[derive(Clone, Debug, PartialEq)]
pub struct RowPick {
    pub pick: Pick,
    pub logits: bool,
}

impl RowPick {
    /// A pick with nothing to report.
    pub fn plain(pick: Pick) -> RowPick {
        RowPick { pick, logits: false }
    }
}

/// A constrained row of a batch: its index among the logits rows and the constraint whose
/// mask says which tokens it may pick (computed on a host thread while the forward runs).
pub struct MaskJob<'a> {
    pub row: usize,
    pub constraint: &'a mut Constraint,
}

/// The masks of `jobs` computed here and now, one entry per row of `rows` rows.
pub fn masks_now(rows: usize, jobs: Vec<MaskJob<'_>>) -> Vec<Option<TokenMask>> {
    let mut masks = vec![None; rows];
    for j in jobs {
        if let Some(m) = masks.get_mut(j.row) {
            *m = Some(j.constraint.mask());
        }
    }
    masks
}

/// A picked token, with its logits row when the pick asked for it.
#[derive(Clone, Debug, PartialEq)]
pub struct Picked {
    pub id: u32,
    pub logits: Option<Vec<f32>>,
}

/// Picks over logits already on the host: `logits` holds one row of `n_vocab` per pick, and
/// `masks` one entry per pick.
pub fn pick_on_host(logits: &[f32], n_vocab: usize, rows: &[RowPick], masks: &[Option<TokenMask>]) -> Result<Vec<Picked>, String> {
    if n_vocab == 0 || logits.len() != n_vocab * rows.len() || masks.len() != rows.len() {
        return Err(format!("{} logits are not {} rows of {n_vocab} ({} masks)", logits.len(), rows.len(), masks.len()));
    }
    Ok(logits
        .chunks_exact(n_vocab)
        .zip(rows)
        .zip(masks)
        // log-probabilities are of the model's distribution, before biases and the mask
        .map(|((l, r), m)| Picked { id: r.pick.on_host(l, m.as_ref()), logits: r.logits.then(|| l.to_vec()) })
        .collect())
}

/// Run `batch` and pick one token per logits row (`rows`, in `batch.logits_rows` order;
/// `masks`: the constrained rows). The picks run where the logits are
/// (`Backend::argmax_rows` when every row is plain greedy, else `Backend::sample_rows`), so a
/// device sends back the ids, plus the logits when a row wants them. The constraints' masks
/// are computed on rayon's pool while the forward runs (one task for them all beside a
/// forward on the host's cores; one each beside a device's), and the sampler waits for them.
pub fn forward_picks<B: Backend>(
    model: &dyn Model<B>,
    be: &B,
    batch: &ForwardBatch,
    kv: &mut B::Kv,
    rows: &[RowPick],
    mut masks: Vec<MaskJob<'_>>,
) -> Result<Vec<Picked>, CoreError> {
    if rows.len() != batch.logits_rows.len() {
        return Err(CoreError::Shape(format!("{} picks for {} logits rows", rows.len(), batch.logits_rows.len())));
    }
    if rows.is_empty() {
        model.forward(be, batch, kv)?;
        return Ok(vec![]);
    }
    let n_vocab = model.info().n_vocab;
    let want_logits = rows.iter().any(|r| r.logits);
    if masks.is_empty() && !want_logits && rows.iter().all(|r| r.pick == Pick::Argmax) {
        let ids = be.argmax_rows(&model.logits(be, batch, kv)?, n_vocab)?;
        return picked(ids, rows, None, n_vocab);
    }
    let chains: Vec<SampleRow> = rows.iter().map(|r| r.pick.as_row()).collect();
    let per_task = if be.computes_on_host() { masks.len().max(1) } else { 1 };
    let (tx, row_masks) = RowMasks::pending(rows.len(), masks.len());
    let (ids, host) = rayon::in_place_scope(|sc| {
        for jobs in masks.chunks_mut(per_task) {
            let tx = tx.clone();
            // a matcher that panics sends nothing: the sampler's wait fails, the step with it
            sc.spawn(move |_| {
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    jobs.iter_mut().for_each(|j| tx.send(j.row, j.constraint.mask()));
                }));
            });
        }
        drop(tx);
        let logits = model.logits(be, batch, kv)?;
        let ids = be.sample_rows(&logits, n_vocab, &chains, row_masks)?;
        let host = if want_logits { Some(be.download(&logits)?) } else { None };
        Ok::<_, CoreError>((ids, host))
    })?;
    picked(ids, rows, host.as_deref(), n_vocab)
}

/// Advance the constraints of a batch's sequences past their picked tokens (`SeqDecoder::
/// advance_constraint`), in parallel on rayon's pool: the accepts that follow read the outcome.
pub fn advance_constraints<'a>(decs: impl Iterator<Item = (&'a mut SeqDecoder, u32)>, tok: &Tokenizer) {
    let mut decs: Vec<_> = decs.filter(|(d, _)| d.constraint.is_some()).collect();
    if decs.len() < 2 {
        decs.into_iter().for_each(|(d, id)| d.advance_constraint(tok, id));
        return;
    }
    rayon::in_place_scope(|sc| {
        for (d, id) in decs.iter_mut() {
            let id = *id;
            // a panic leaves the constraint unadvanced: the accept advances it (and meets it)
            sc.spawn(move |_| {
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| d.advance_constraint(tok, id)));
            });
        }
    });
}

/// The picks of `rows` from the backend's `ids`, with their logits rows from `logits` (the
/// whole batch's) where wanted.
fn picked(ids: Vec<u32>, rows: &[RowPick], logits: Option<&[f32]>, n_vocab: usize) -> Result<Vec<Picked>, CoreError> {
    if ids.len() != rows.len() || logits.is_some_and(|l| l.len() != rows.len() * n_vocab) {
        return Err(CoreError::Backend(format!("the model picked {} tokens for {} rows", ids.len(), rows.len())));
    }
    Ok(ids
        .into_iter()
        .zip(rows)
        .enumerate()
        .map(|(i, (id, r))| Picked { id, logits: logits.filter(|_| r.logits).map(|l| l[i * n_vocab..(i + 1) * n_vocab].to_vec()) })
        .collect())
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
    /// (token, bias) added to the logits before the chain (empty: none).
    bias: Vec<(u32, f32)>,
    /// The constraint advanced past this token ahead of its accept: whether the grammar is
    /// done (`advance_constraint`).
    advanced: Option<(u32, bool)>,
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
            bias: params.logit_bias.clone(),
            advanced: None,
        }
    }

    /// Constrain the output to `c` (a JSON schema, a grammar, ...).
    pub fn with_constraint(mut self, c: Option<Constraint>) -> SeqDecoder {
        self.constraint = c;
        self
    }

    /// The constraint's mask for logits row `row` of the next pick (None: unconstrained);
    /// `forward_picks` computes it while the forward pass runs.
    pub fn mask_job(&mut self, row: usize) -> Option<MaskJob<'_>> {
        self.constraint.as_mut().map(|constraint| MaskJob { row, constraint })
    }

    /// Whether a constraint (structured output) masks the picks.
    pub fn has_constraint(&self) -> bool {
        self.constraint.is_some()
    }

    /// Where the request's seeded generator stands (`Sampler::draw_pos`).
    pub fn draw_pos(&self) -> u128 {
        self.sampler.draw_pos()
    }

    /// Put the generator back at `pos`: the draws of picks that were not used are returned.
    pub fn set_draw_pos(&mut self, pos: u128) {
        self.sampler.set_draw_pos(pos);
    }

    /// Tokens this sequence may still generate (`max_tokens` less those generated).
    pub fn tokens_left(&self) -> usize {
        self.max_tokens.saturating_sub(self.generated)
    }

    /// Tokens accepted so far (end-of-generation tokens not counted).
    pub fn generated(&self) -> usize {
        self.generated
    }

    /// How the next token is picked after `history` (prompt and generated tokens). Call once
    /// per pick: a sampling chain takes the next draw of the request's seeded RNG. A
    /// constrained sequence's mask comes from [`mask_job`](Self::mask_job).
    pub fn next_pick(&mut self, history: &[u32]) -> RowPick {
        let pick = if self.sampler.params.is_plain_greedy() && self.bias.is_empty() {
            Pick::Argmax
        } else {
            Pick::Chain(SampleRow { bias: self.bias.clone(), ..self.sampler.row(history) })
        };
        RowPick { pick, logits: self.logprobs.is_some() }
    }

    /// Advance the constraint past `id` ahead of `accept(id)`, which then reads the outcome
    /// (`advance_constraints` does this for a batch in parallel). Nothing for an
    /// end-of-generation token, which `accept` turns into the end of a constrained sequence.
    pub fn advance_constraint(&mut self, tok: &Tokenizer, id: u32) {
        if self.constraint.is_some() && !tok.is_eog(id) {
            let done = self.advance(id);
            self.advanced = Some((id, done));
        }
    }

    /// A token the mask let through always advances the matcher; one that breaks it ends
    /// the sequence (the grammar could not continue), as does the grammar complete: true.
    fn advance(&mut self, id: u32) -> bool {
        self.constraint.as_mut().is_some_and(|c| c.accept(id).is_err() || c.is_finished())
    }

    /// Take the picked token `id`; `seq_len` is the sequence's length with it, `logits` its
    /// row when the pick asked for it. Finish rules, in order: end of generation (unless
    /// ignored), a stop string, the constraint's grammar complete, `max_tokens`, the context
    /// full.
    pub fn accept(&mut self, tok: &Tokenizer, id: u32, logits: Option<&[f32]>, seq_len: usize, n_ctx: usize) -> Accepted {
        if tok.is_eog(id) && (!self.ignore_eos || self.constraint.is_some()) {
            return Accepted { finish: Some(FinishReason::Stop), ..Default::default() };
        }
        let grammar_done = match self.advanced.take() {
            Some((a, done)) if a == id => done,
            _ => self.advance(id),
        };
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
        let penalized = Pick::Chain(SampleRow { repeat_penalty: 4.0, penalties: vec![(0, 1)], ..SampleRow::greedy() });
        let rows = [RowPick::plain(Pick::Argmax), RowPick { logits: true, ..RowPick::plain(penalized) }];
        let got = pick_on_host(&logits, 4, &rows, &[None, None]).unwrap();
        assert_eq!(got[0], Picked { id: 1, logits: None });
        // 2.0 / 4 = 0.5 < 1.0: the penalty moves the pick to token 3
        assert_eq!(got[1], Picked { id: 3, logits: Some(logits[4..].to_vec()) });
        assert!(pick_on_host(&logits, 3, &rows, &[None, None]).is_err());
        assert!(pick_on_host(&logits, 4, &rows, &[None]).is_err());
    }

    #[test]
    fn masks_and_biases_move_the_pick_and_leave_reported_logits_alone() {
        let logits = [1.0, 3.0, 2.5, 0.0];
        let biased = Pick::Chain(SampleRow { bias: vec![(1, -100.0), (3, 2.9), (99, 5.0)], ..SampleRow::greedy() });
        let rows = [RowPick { logits: true, ..RowPick::plain(biased) }, RowPick { logits: true, ..RowPick::plain(Pick::Argmax) }];
        let only_0_2 = TokenMask::from_words(vec![0b101]);
        // row 1: token 1 banned; 0.0 + 2.9 > 2.5; an id outside the row is ignored.
        // row 2: the mask leaves 0 and 2
        let got = pick_on_host(&[logits, logits].concat(), 4, &rows, &[None, Some(only_0_2)]).unwrap();
        assert_eq!(got, vec![Picked { id: 3, logits: Some(logits.to_vec()) }, Picked { id: 2, logits: Some(logits.to_vec()) }]);
    }

    #[test]
    fn biased_requests_run_the_chain_and_plain_greedy_takes_no_draw() {
        let biased = GenerateParams { logit_bias: vec![(2, 1.0)], sampling: SamplingParams::greedy(), ..Default::default() };
        let mut d = SeqDecoder::new(&biased, None, Detokenizer::default());
        let Pick::Chain(r) = d.next_pick(&[]).pick else { panic!("a biased greedy pick runs the chain") };
        assert_eq!((r.temperature, r.bias), (0.0, vec![(2, 1.0)]));
        assert!(d.mask_job(0).is_none(), "no constraint, no mask");
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
