//! Speculative decoding: a drafter proposes the next few tokens, the target model checks them
//! all in one forward pass, and the output stays the target's own.
//!
//! ```text
//!  history ─► Drafter::draft ─► d1..dk ─► target forward over [last, d1..dk] ─► k+1 picks
//!                                           (one row per position, each with the pick it
//!                                            would have had decoding one token at a time)
//!  accept picks while pick(i) == d(i+1); the first pick that differs (or the pick after dk)
//!  is the target's next token; rejected positions are simply overwritten later (the paged
//!  cache's positions past the sequence's length are never read).
//! ```
//!
//! Each row's pick is the one plain decoding would make at that position: the same sampling
//! chain, the same penalties over the tokens before it and the same draw of the request's
//! seeded generator (`SeqDecoder::rewind_draws` returns the draws of rejected rows). So a
//! seeded request gives the same text with and without speculation, greedy or sampled, and
//! sampled output follows the target's distribution. Drafters:
//!
//! | drafter        | proposes |
//! |----------------|----------|
//! | `ModelDrafter` | a smaller model's greedy continuation (same vocabulary; its own KV cache) |
//! | `NgramDrafter` | prompt lookup: what followed the latest earlier occurrence of the last n tokens |

use crate::decode::{forward_picks, Pick, RowPick};
use crate::engine::{Engine, EngineError};
use quarrel_core::{Backend, ForwardBatch, SeqBatch};
use quarrel_tokenizer::Tokenizer;
use std::collections::HashMap;

/// One sequence's request for drafts: `key` names the sequence across calls (a drafter may
/// keep a cache per key), `history` is its prompt and accepted output.
pub struct DraftRequest<'a> {
    pub key: u64,
    pub history: &'a [u32],
    pub n_max: usize,
}

/// Where draft tokens come from.
pub trait Drafter: Send {
    /// Up to `n_max` tokens likely to follow `history` (prompt and accepted output).
    fn draft(&mut self, history: &[u32], n_max: usize) -> Result<Vec<u32>, EngineError> {
        let mut d = self.draft_many(&[DraftRequest { key: 0, history, n_max }])?;
        Ok(d.pop().unwrap_or_default())
    }
    /// Drafts for several sequences at once (one entry per request, in order); a model
    /// drafter runs them in shared forward passes.
    fn draft_many(&mut self, reqs: &[DraftRequest<'_>]) -> Result<Vec<Vec<u32>>, EngineError>;
    /// Take in `history` ahead of the first drafts for `key` (a model drafter runs the prompt
    /// through its cache now, with the model's own prompt processing, instead of stalling the
    /// second token).
    fn prepare(&mut self, _key: u64, _history: &[u32]) -> Result<(), EngineError> {
        Ok(())
    }
    /// Sequence `key` is over: what the drafter holds for it is released.
    fn release(&mut self, _key: u64) {}
    /// Every sequence is over.
    fn finish(&mut self) {}

    /// What the drafter is, for logs ("ngram", a model's name).
    fn describe(&self) -> String;
}

/// How much to draft.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SpecOptions {
    /// Most tokens drafted per target step.
    pub draft_max: usize,
    /// Fewer drafted tokens than this: the step runs without them.
    pub draft_min: usize,
    /// A model drafter stops drafting at a token whose probability is below this.
    pub p_min: f32,
    /// Serving many sequences: most drafted tokens in one step over all of them (0: the
    /// backend's default). Checking drafts is nearly free while a step's matmuls stay bound
    /// by reading the weights; past that, drafts cost real time and are cut.
    pub step_budget: usize,
}

impl Default for SpecOptions {
    fn default() -> Self {
        SpecOptions { draft_max: 8, draft_min: 0, p_min: 0.0, step_budget: 0 }
    }
}

/// A drafter and how much it drafts, attached to an engine (`Engine::set_speculator`).
pub struct Speculator {
    pub drafter: Box<dyn Drafter>,
    pub opts: SpecOptions,
}

impl Speculator {
    /// At most `n_max` tokens (and `draft_max`) to check after `history`; empty when fewer
    /// than `draft_min`.
    pub(crate) fn propose(&mut self, history: &[u32], n_max: usize) -> Result<Vec<u32>, EngineError> {
        let n = self.opts.draft_max.min(n_max);
        if n == 0 || n < self.opts.draft_min {
            return Ok(vec![]);
        }
        let d = self.drafter.draft(history, n)?;
        Ok(if d.len() < self.opts.draft_min.max(1) { vec![] } else { d })
    }
}

/// A sequence's next draft length: [`DRAFT_START`] at first, two more after a step whose
/// drafts were all accepted, one fewer otherwise (at least one), never above `draft_max`.
/// A step whose drafts all miss pauses drafting for a few steps, twice as many each time in a
/// row (up to [`MAX_PAUSE`]), until a draft is accepted again: a drafter that does not guess
/// this text (prompt lookup on free text) costs next to nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DraftLength {
    len: usize,
    /// Steps left without drafts, and the pause after the next failure.
    paused: usize,
    pause: usize,
}

/// Longest pause of drafting after rejected single drafts, in steps.
pub const MAX_PAUSE: usize = 32;

/// The first draft length of a sequence.
pub const DRAFT_START: usize = 5;

impl DraftLength {
    /// How many tokens to draft now: checking drafts that fail costs the model's time, so
    /// even free drafts (prompt lookup) follow acceptance.
    pub fn next(&mut self, draft_max: usize) -> usize {
        if self.paused > 0 {
            self.paused -= 1;
            return 0;
        }
        self.len = if self.len == 0 { DRAFT_START } else { self.len }.clamp(1, draft_max.max(1));
        self.len
    }

    /// After a step that checked `drafted` tokens and accepted `accepted` of them.
    pub fn update(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        if accepted == drafted {
            self.len += 2;
            self.pause = 0;
            return;
        }
        self.len = self.len.saturating_sub(1).max(1);
        if accepted == 0 {
            self.pause = (self.pause * 2).clamp(1, MAX_PAUSE);
            self.paused = self.pause;
        } else {
            self.pause = 0;
        }
    }
}

/// Counts of one completion's speculation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpecStats {
    /// Tokens proposed by the drafter and checked by the target.
    pub drafted: usize,
    /// Drafted tokens the target accepted.
    pub accepted: usize,
    /// Target forward passes after the prompt's (counted while a speculator is attached).
    pub target_steps: usize,
}

impl SpecStats {
    pub fn acceptance(&self) -> f64 {
        self.accepted as f64 / self.drafted.max(1) as f64
    }
}

/// Prompt lookup: the tokens that followed the most recent earlier occurrence of the
/// sequence's last `n` tokens, trying the longest `n` first. No model, no cache: it pays
/// where the output copies from the prompt (edits, code, quotes).
pub struct NgramDrafter {
    pub n_min: usize,
    pub n_max: usize,
}

impl Default for NgramDrafter {
    fn default() -> Self {
        NgramDrafter { n_min: 2, n_max: 4 }
    }
}

impl Drafter for NgramDrafter {
    fn draft_many(&mut self, reqs: &[DraftRequest<'_>]) -> Result<Vec<Vec<u32>>, EngineError> {
        Ok(reqs.iter().map(|r| ngram_lookup(r.history, self.n_min.max(1), self.n_max, r.n_max)).collect())
    }

    fn describe(&self) -> String {
        format!("ngram ({}..{} tokens)", self.n_min, self.n_max)
    }
}

/// The continuation after the latest earlier match of `history`'s last `n` tokens, for `n`
/// from `n_hi` down to `n_lo`; up to `len` tokens.
pub fn ngram_lookup(history: &[u32], n_lo: usize, n_hi: usize, len: usize) -> Vec<u32> {
    let h = history.len();
    for n in (n_lo..=n_hi.min(h.saturating_sub(1))).rev() {
        let tail = &history[h - n..];
        // latest start s < h - n with history[s..s+n] == tail
        if let Some(s) = (0..h - n).rev().find(|&s| &history[s..s + n] == tail) {
            let from = s + n;
            return history[from..(from + len).min(h)].to_vec();
        }
    }
    vec![]
}

/// A smaller model's greedy continuation. It keeps a KV cache per sequence of the tokens it
/// has seen, so each call runs only the tokens accepted since the last one plus its drafts;
/// the sequences of one call draft together, one forward pass per drafted position.
pub struct ModelDrafter<B: Backend> {
    engine: Engine<B>,
    seqs: HashMap<u64, DraftSeq>,
    p_min: f32,
    name: String,
}

/// Most tokens of one sequence a shared drafting forward catches up on.
const CATCH_UP_SHARED: usize = 32;

/// What the drafter holds for one sequence.
#[derive(Default)]
struct DraftSeq {
    table: Vec<u32>,
    /// The tokens whose keys and values are in `table`'s blocks, in order.
    cached: Vec<u32>,
}

impl<B: Backend> ModelDrafter<B> {
    /// A drafter running `engine`'s model for a target whose tokenizer is `target`; an error
    /// when the two vocabularies differ (a drafted id would mean another token).
    pub fn new(engine: Engine<B>, target: &Tokenizer, p_min: f32) -> Result<ModelDrafter<B>, EngineError> {
        check_same_vocab(&engine.tokenizer, target)?;
        if engine.n_state_slots > 0 {
            return Err(EngineError::InvalidRequest("a draft model with recurrent layers cannot step back over rejected drafts".into()));
        }
        let name = engine.path.as_ref().and_then(|p| p.file_name()).map_or("draft model".into(), |n| n.to_string_lossy().into_owned());
        Ok(ModelDrafter { engine, seqs: HashMap::new(), p_min, name })
    }

    /// Bring `s`'s cache up to all of `seq` but its last token (in `n_batch` chunks), so the
    /// shared forwards carry one or a few tokens per sequence.
    fn catch_up(&mut self, key: u64, seq: &[u32]) -> Result<(), EngineError> {
        let n_batch = self.engine.opts.n_batch;
        let s = self.seqs.entry(key).or_default();
        let keep = s.cached.iter().zip(seq).take_while(|(a, b)| a == b).count().min(seq.len() - 1);
        s.cached.truncate(keep);
        // long catch-ups (a new prompt) run alone, in chunks; short ones ride the shared forwards
        if seq.len() - 1 - keep > CATCH_UP_SHARED.min(n_batch) {
            let upto = seq.len() - 1;
            let r = self.engine.eval_sequence(&mut s.table, &seq[keep..upto], keep, &[]);
            r?;
            s.cached = seq[..upto].to_vec();
        }
        Ok(())
    }

    fn release_seq(&mut self, key: u64) {
        if let Some(mut s) = self.seqs.remove(&key) {
            self.engine.release_blocks(&mut s.table);
        }
    }
}

impl<B: Backend> Drafter for ModelDrafter<B> {
    fn prepare(&mut self, key: u64, history: &[u32]) -> Result<(), EngineError> {
        if history.len() < 2 {
            return Ok(());
        }
        let r = self.catch_up(key, history);
        if r.is_err() {
            self.release_seq(key);
        }
        r
    }

    fn draft_many(&mut self, reqs: &[DraftRequest<'_>]) -> Result<Vec<Vec<u32>>, EngineError> {
        let mut out = vec![vec![]; reqs.len()];
        // (request index, tokens so far: history then drafts)
        let mut live: Vec<(usize, Vec<u32>)> = vec![];
        for (i, r) in reqs.iter().enumerate() {
            let n_max = r.n_max.min(self.engine.n_ctx().saturating_sub(r.history.len()));
            if r.history.is_empty() || n_max == 0 {
                continue;
            }
            // a sequence the drafter cannot hold gets no drafts; the others go on
            if self.catch_up(r.key, r.history).is_err() {
                self.release_seq(r.key);
                continue;
            }
            live.push((i, r.history.to_vec()));
        }
        let pick = RowPick { pick: Pick::Argmax, logits: self.p_min > 0.0 };
        while !live.is_empty() {
            let mut batch = ForwardBatch::default();
            let mut ran = vec![];
            for (i, seq) in live.drain(..) {
                let key = reqs[i].key;
                let Some(s) = self.seqs.get_mut(&key) else { continue };
                let n = s.cached.len();
                if self.engine.reserve_blocks(&mut s.table, seq.len()).is_err() {
                    self.release_seq(key);
                    continue;
                }
                let start = batch.tokens.len();
                batch.tokens.extend_from_slice(&seq[n..]);
                batch.positions.extend((n..seq.len()).map(|p| p as u32));
                batch.seqs.push(SeqBatch { start, len: seq.len() - n, block_table: s.table.clone() });
                batch.logits_rows.push(batch.tokens.len() - 1);
                ran.push((i, seq));
            }
            if ran.is_empty() {
                break;
            }
            let picks = vec![pick.clone(); ran.len()];
            let e = &mut self.engine;
            let picked = match forward_picks(&*e.model, &e.backend, &batch, &mut e.kv, &picks, vec![]) {
                Ok(p) => p,
                Err(err) => {
                    for (i, _) in &ran {
                        self.release_seq(reqs[*i].key);
                    }
                    return Err(err.into());
                }
            };
            for ((i, mut seq), p) in ran.into_iter().zip(picked) {
                if let Some(s) = self.seqs.get_mut(&reqs[i].key) {
                    s.cached.clone_from(&seq);
                }
                if p.logits.as_deref().is_some_and(|l| top_probability(l) < self.p_min) {
                    continue;
                }
                out[i].push(p.id);
                seq.push(p.id);
                let r = &reqs[i];
                if out[i].len() < r.n_max.min(self.engine.n_ctx().saturating_sub(r.history.len())) {
                    live.push((i, seq));
                }
            }
        }
        Ok(out)
    }

    fn release(&mut self, key: u64) {
        self.release_seq(key);
    }

    fn finish(&mut self) {
        let keys: Vec<u64> = self.seqs.keys().copied().collect();
        keys.into_iter().for_each(|k| self.release_seq(k));
    }

    fn describe(&self) -> String {
        self.name.clone()
    }
}

/// The softmax probability of the largest logit.
fn top_probability(logits: &[f32]) -> f32 {
    let m = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let z: f64 = logits.iter().map(|&v| ((v - m) as f64).exp()).sum();
    (1.0 / z) as f32
}

/// A drafter's ids must mean the target's tokens: the same vocabulary size (llama.cpp allows
/// a few padding ids more or less; so do we), the same token texts where both have them and
/// the same BOS / EOS.
pub fn check_same_vocab(draft: &Tokenizer, target: &Tokenizer) -> Result<(), EngineError> {
    let (nd, nt) = (draft.n_vocab(), target.n_vocab());
    let mismatch = |what: String| EngineError::InvalidRequest(format!("the draft model's vocabulary differs from the target's: {what}"));
    if nd.abs_diff(nt) > 128 {
        return Err(mismatch(format!("{nd} tokens vs {nt}")));
    }
    if draft.kind() != target.kind() {
        return Err(mismatch(format!("{:?} vs {:?}", draft.kind(), target.kind())));
    }
    if draft.bos_id() != target.bos_id() || draft.eos_id() != target.eos_id() {
        return Err(mismatch(format!(
            "BOS / EOS {:?} / {:?} vs {:?} / {:?}",
            draft.bos_id(),
            draft.eos_id(),
            target.bos_id(),
            target.eos_id()
        )));
    }
    if let Some(i) = (0..nd.min(nt) as u32).find(|&i| draft.token_text(i) != target.token_text(i)) {
        return Err(mismatch(format!("token {i} is {:?} vs {:?}", draft.token_text(i), target.token_text(i))));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_takes_the_latest_longest_match() {
        // ... 1 2 3 [9 9] ... 1 2 3 [7 7] ... 1 2 3  -> the latest earlier "1 2 3" is followed by 7 7
        let h = [1, 2, 3, 9, 9, 5, 1, 2, 3, 7, 7, 6, 1, 2, 3];
        assert_eq!(ngram_lookup(&h, 1, 3, 2), vec![7, 7]);
        assert_eq!(ngram_lookup(&h, 1, 3, 10), vec![7, 7, 6, 1, 2, 3]);
        // no 4-gram match: falls back to the 3-gram
        assert_eq!(ngram_lookup(&h, 3, 4, 1), vec![7]);
        // the longest match wins over a later shorter one: tail "4 1" matches only at 0
        let h = [4, 1, 8, 3, 1, 9, 4, 1];
        assert_eq!(ngram_lookup(&h, 1, 2, 2), vec![8, 3]);
        assert_eq!(ngram_lookup(&h, 1, 1, 2), vec![9, 4], "1-gram: the latest earlier 1");
        assert!(ngram_lookup(&[1, 2, 3], 1, 3, 4).is_empty());
        assert!(ngram_lookup(&[], 1, 3, 4).is_empty());
        assert!(ngram_lookup(&[5], 1, 3, 4).is_empty());
    }

    #[test]
    fn proposals_below_the_minimum_are_dropped() {
        let mut s = Speculator {
            drafter: Box::new(NgramDrafter { n_min: 1, n_max: 2 }),
            opts: SpecOptions { draft_max: 8, draft_min: 3, p_min: 0.0, step_budget: 0 },
        };
        assert_eq!(s.propose(&[1, 2, 1], 8).unwrap(), Vec::<u32>::new(), "one token drafted, three wanted");
        assert_eq!(s.propose(&[1, 2, 3, 4, 1], 8).unwrap(), vec![2, 3, 4, 1]);
        assert_eq!(s.propose(&[1, 2, 3, 4, 1], 2).unwrap(), Vec::<u32>::new(), "room for 2 < draft_min");
        s.opts.draft_min = 0;
        assert_eq!(s.propose(&[1, 2, 3, 4, 1], 2).unwrap(), vec![2, 3]);
    }

    #[test]
    fn draft_length_follows_acceptance_and_pauses_after_misses() {
        let mut d = DraftLength::default();
        assert_eq!(d.next(16), DRAFT_START);
        d.update(5, 5);
        assert_eq!(d.next(16), 7, "all accepted: two more");
        assert_eq!(d.next(6), 6, "never above draft_max");
        d.update(6, 2);
        assert_eq!(d.next(16), 5, "a partial miss: one fewer, no pause");
        d.update(5, 0);
        assert_eq!((d.next(16), d.next(16)), (0, 4), "a complete miss: one fewer and a pause of one step");
        d.update(4, 0);
        assert_eq!((d.next(16), d.next(16), d.next(16)), (0, 0, 3), "then two");
        d.update(3, 1);
        assert_eq!(d.next(16), 2, "an accepted draft ends the pauses");
        d.update(2, 0);
        assert_eq!((d.next(16), d.next(16)), (0, 1), "pauses start again at one step");
        // misses in a row: the pauses double up to MAX_PAUSE and stay there
        let mut pauses = vec![];
        for _ in 0..8 {
            d.update(1, 0);
            let mut n = 0;
            while d.next(16) == 0 {
                n += 1;
            }
            pauses.push(n);
        }
        assert_eq!(pauses, [2, 4, 8, 16, 32, 32, 32, 32]);
        d.update(0, 0);
        assert_eq!(d.next(16), 1, "an undrafted step changes nothing");
    }

    #[test]
    fn top_probability_is_the_softmax_maximum() {
        assert!((top_probability(&[0.0, 0.0]) - 0.5).abs() < 1e-6);
        assert!(top_probability(&[10.0, 0.0, 0.0]) > 0.99);
    }
}
