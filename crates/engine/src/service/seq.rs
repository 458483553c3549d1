//! One request's life in the step loop: its tokens, how many have KV, its blocks, its
//! decoder (the same `SeqDecoder` as `Engine::generate`), and the channel its events go to.

use super::blocks::block_hash;
use super::types::{Priority, RequestId, RequestTimings, StreamEvent, Usage};
use crate::constraint::Constraint;
use crate::decode::{MaskJob, Picked, RowPick, SeqDecoder};
use crate::generate::{FinishReason, GenerateParams};
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
    dec: SeqDecoder,
    pub cached_tokens: usize,
    /// Admitted at least once (no longer counted as queued).
    pub admitted: bool,
    pub first_scheduled: Option<Instant>,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
    pub tx: UnboundedSender<StreamEvent>,
    /// Tokens scheduled in the current step.
    pub sched: usize,
    /// The request allows speculative decoding.
    pub speculative: bool,
    /// Tokens drafted for this step, checked after the last real token.
    pub drafts: Vec<u32>,
    /// How many tokens to draft next (grows while drafts are accepted, shrinks when not).
    pub draft_len: crate::speculative::DraftLength,
    /// The decoder's generator position before each of this step's picks, and after the last.
    pub draw_marks: Vec<u128>,
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
        constraint: Option<Constraint>,
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
            dec: SeqDecoder::new(&params, logprobs, detok).with_constraint(constraint),
            cached_tokens: 0,
            admitted: false,
            first_scheduled: None,
            first_token: None,
            last_token: None,
            tx,
            sched: 0,
            speculative: true,
            drafts: vec![],
            draft_len: Default::default(),
            draw_marks: vec![],
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
        self.drafts.clear();
    }

    pub fn send(&self, ev: StreamEvent) {
        // a closed receiver is noticed by the next step's reaping
        let _ = self.tx.send(ev);
    }

    pub fn usage(&self) -> Usage {
        Usage { prompt_tokens: self.prompt_len, completion_tokens: self.dec.generated(), cached_tokens: self.cached_tokens }
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

    /// Tokens generated so far.
    pub fn generated(&self) -> usize {
        self.dec.generated()
    }

    /// How the token after the last one is picked (one call per pick: it may take a draw).
    pub fn next_pick(&mut self) -> RowPick {
        self.dec.next_pick(&self.tokens)
    }

    /// The picks of a step that checks `drafts`: one after the last token and one after each
    /// draft, each as plain decoding would make it there (penalties over the tokens before it,
    /// the next draw); `draw_marks` records the generator between them.
    pub fn draft_picks(&mut self) -> Vec<RowPick> {
        let mut seen = self.tokens.clone();
        self.draw_marks = vec![self.dec.draw_pos()];
        let mut picks = Vec::with_capacity(self.drafts.len() + 1);
        for i in 0..=self.drafts.len() {
            picks.push(self.dec.next_pick(&seen));
            self.draw_marks.push(self.dec.draw_pos());
            seen.extend(self.drafts.get(i));
        }
        picks
    }

    /// After row `i` of a drafted step ended it, the later rows' draws go back.
    pub fn return_draws(&mut self, i: usize) {
        if let Some(&p) = self.draw_marks.get(i + 1) {
            self.dec.set_draw_pos(p);
        }
    }

    /// Whether this request may draft now: decoding (its last token the only one to run),
    /// unconstrained (masks follow the grammar one token at a time), speculative.
    pub fn may_draft(&self) -> bool {
        self.speculative && self.n_computed > 0 && self.remaining() == 1 && !self.dec.has_constraint()
    }

    /// Tokens this request may still generate beyond the next one.
    pub fn room_after_next(&self, n_ctx: usize) -> usize {
        self.dec.tokens_left().saturating_sub(1).min(n_ctx.saturating_sub(self.tokens.len() + 1))
    }

    /// A constrained request's mask for its next pick, logits row `row` (None:
    /// unconstrained).
    pub fn mask_job(&mut self, row: usize) -> Option<MaskJob<'_>> {
        self.dec.mask_job(row)
    }

    /// The decoder, for steps that work on several requests' decoders at once
    /// (`decode::advance_constraints`).
    pub fn decoder(&mut self) -> &mut SeqDecoder {
        &mut self.dec
    }

    /// Take the picked token, stream it, and say whether the request is finished.
    pub fn accept(&mut self, picked: &Picked, tok: &Tokenizer, n_ctx: usize) -> Option<FinishReason> {
        let now = Instant::now();
        self.first_token.get_or_insert(now);
        self.last_token = Some(now);
        let acc = self.dec.accept(tok, picked.id, picked.logits.as_deref(), self.tokens.len() + 1, n_ctx);
        if let Some((id, text)) = acc.token {
            self.tokens.push(id);
            self.send(StreamEvent::Token { id: Some(id), text, logprob: acc.logprob });
        }
        let (rest, reason) = self.dec.finish(acc.finish?);
        if !rest.is_empty() {
            self.send(StreamEvent::Token { id: None, text: rest, logprob: None });
        }
        Some(reason)
    }
}
