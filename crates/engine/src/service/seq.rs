//! One request's life in the step loop: its tokens, how many have KV, its blocks, its
//! sampler and text state, and the channel its events go to.

use super::blocks::block_hash;
use super::types::{Priority, RequestId, RequestTimings, StreamEvent, TokenLogprob, Usage};
use crate::generate::{FinishReason, GenerateParams};
use crate::sampler::Sampler;
use crate::stop::{StopMatcher, StopOutcome};
use quarrel_tokenizer::{Detokenizer, Tokenizer};
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;

pub(crate) struct Seq {
    pub id: RequestId,
    pub priority: Priority,
    /// Arrival order (older first).
    pub order: u64,
    pub submitted: Instant,
    pub deadline: Option<Instant>,
    /// Prompt then generated tokens.
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    /// Leading tokens whose KV is in the cache.
    pub n_computed: usize,
    pub table: Vec<u32>,
    /// Hashes of the leading full blocks already registered (or found) in the prefix cache.
    pub hashes: Vec<u64>,
    pub params: GenerateParams,
    pub logprobs: Option<usize>,
    sampler: Sampler,
    detok: Detokenizer,
    stops: StopMatcher,
    pub generated: usize,
    pub cached_tokens: usize,
    /// Admitted at least once (no longer counted as queued).
    pub admitted: bool,
    pub first_scheduled: Option<Instant>,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
    pub tx: UnboundedSender<StreamEvent>,
    /// Tokens scheduled in the current step.
    pub sched: usize,
}

impl Seq {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: RequestId,
        order: u64,
        prompt: Vec<u32>,
        params: GenerateParams,
        priority: Priority,
        logprobs: Option<usize>,
        deadline: Option<Instant>,
        detok: Detokenizer,
        tx: UnboundedSender<StreamEvent>,
    ) -> Seq {
        Seq {
            id,
            priority,
            order,
            submitted: Instant::now(),
            deadline,
            prompt_len: prompt.len(),
            tokens: prompt,
            n_computed: 0,
            table: vec![],
            hashes: vec![],
            sampler: Sampler::new(params.sampling.clone()),
            stops: StopMatcher::new(&params.stop),
            params,
            logprobs,
            detok,
            generated: 0,
            cached_tokens: 0,
            admitted: false,
            first_scheduled: None,
            first_token: None,
            last_token: None,
            tx,
            sched: 0,
        }
    }

    /// Tokens still to run through the model (at least 1 while the request lives).
    pub fn remaining(&self) -> usize {
        self.tokens.len() - self.n_computed
    }

    /// (hash, tokens) of the full blocks the prefix cache may supply: those entirely before
    /// the last token, which must always be computed to get logits.
    pub fn cacheable_chain(&self, bs: usize) -> Vec<(u64, &[u32])> {
        let n_full = (self.tokens.len() - 1) / bs;
        let mut parent = 0;
        self.tokens[..n_full * bs]
            .chunks_exact(bs)
            .map(|c| {
                parent = block_hash(parent, c);
                (parent, c)
            })
            .collect()
    }

    /// Forget the KV (preemption): everything is recomputed on re-admission.
    pub fn reset_kv(&mut self) {
        self.n_computed = 0;
        self.hashes.clear();
        self.sched = 0;
    }

    pub fn send(&self, ev: StreamEvent) {
        // a closed receiver is noticed by the next step's reaping
        let _ = self.tx.send(ev);
    }

    pub fn usage(&self) -> Usage {
        Usage { prompt_tokens: self.prompt_len, completion_tokens: self.generated, cached_tokens: self.cached_tokens }
    }

    pub fn timings(&self) -> RequestTimings {
        let first_sched = self.first_scheduled.unwrap_or(self.submitted);
        let first_tok = self.first_token.unwrap_or(first_sched);
        RequestTimings {
            queued: first_sched.saturating_duration_since(self.submitted),
            ttft: first_tok.saturating_duration_since(self.submitted),
            prompt: first_tok.saturating_duration_since(first_sched),
            gen: self.last_token.unwrap_or(first_tok).saturating_duration_since(first_tok),
        }
    }

    /// Sample from the logits of the last token, stream it, and say whether the request is
    /// finished. Mirrors `Engine::generate` so that a request gives the same tokens in both.
    pub fn accept(&mut self, logits: &[f32], tok: &Tokenizer, n_ctx: usize) -> Option<FinishReason> {
        let id = self.sampler.sample(logits, &self.tokens);
        let now = Instant::now();
        if self.first_token.is_none() {
            self.first_token = Some(now);
        }
        self.last_token = Some(now);
        if tok.is_eog(id) && !self.params.ignore_eos {
            return Some(self.finish_text(tok, FinishReason::Stop));
        }
        let logprob = self.logprobs.map(|n| token_logprob(logits, id, n, tok));
        self.tokens.push(id);
        self.generated += 1;
        let piece = self.detok.push(tok, id).unwrap_or_default();
        let (text, hit_stop) = match self.stops.push(&piece) {
            StopOutcome::Continue(s) => (s, false),
            StopOutcome::Stop(s) => (s, true),
        };
        self.send(StreamEvent::Token { id: Some(id), text, logprob });
        if hit_stop {
            return Some(FinishReason::Stop);
        }
        if self.generated >= self.params.max_tokens {
            return Some(self.finish_text(tok, FinishReason::Length));
        }
        if self.tokens.len() >= n_ctx {
            return Some(self.finish_text(tok, FinishReason::ContextFull));
        }
        None
    }

    /// Release held-back text at the end (unless it completes a stop string).
    fn finish_text(&mut self, _tok: &Tokenizer, reason: FinishReason) -> FinishReason {
        let tail = self.detok.flush();
        let (mut rest, hit) = match self.stops.push(&tail) {
            StopOutcome::Continue(s) => (s, false),
            StopOutcome::Stop(s) => (s, true),
        };
        if !hit {
            rest.push_str(&self.stops.flush());
        }
        if !rest.is_empty() {
            self.send(StreamEvent::Token { id: None, text: rest, logprob: None });
        }
        if hit {
            FinishReason::Stop
        } else {
            reason
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
