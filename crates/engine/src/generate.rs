//! One completion on the calling thread: its parameters, events and result, and the loop
//! that feeds a `SeqDecoder` (the service's per-request decode logic) one sequence at a time.

use crate::decode::SeqDecoder;
use crate::engine::{Engine, EngineError};
use crate::sampler::SamplingParams;
use crate::speculative::{DraftLength, SpecStats};
use quarrel_core::Backend;
use std::time::{Duration, Instant};

#[derive(Clone, Debug)]
pub struct GenerateParams {
    pub sampling: SamplingParams,
    /// Most tokens to generate (capped by the context).
    pub max_tokens: usize,
    pub stop: Vec<String>,
    /// Keep going past end-of-generation tokens.
    pub ignore_eos: bool,
    /// Added to these tokens' logits before the sampling chain (OpenAI `logit_bias`).
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for GenerateParams {
    fn default() -> Self {
        GenerateParams { sampling: SamplingParams::default(), max_tokens: 256, stop: vec![], ignore_eos: false, logit_bias: vec![] }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// End-of-generation token or a stop string.
    Stop,
    /// `max_tokens` reached.
    Length,
    /// The context is full.
    ContextFull,
    /// The caller asked to stop.
    Cancelled,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::ContextFull => "length",
            FinishReason::Cancelled => "cancelled",
        }
    }
}

/// A streamed step: the sampled token and the text it completes (may be empty while a
/// multi-byte character or a possible stop string is held back).
#[derive(Debug)]
pub struct Event<'a> {
    /// None for the final flush of held-back text.
    pub token: Option<u32>,
    pub text: &'a str,
}

#[derive(Clone, Debug, Default)]
pub struct Timings {
    pub prompt_tokens: usize,
    pub prompt_time: Duration,
    pub gen_tokens: usize,
    /// Time of the decode steps after the first token.
    pub gen_time: Duration,
    pub time_to_first_token: Duration,
    /// Speculative decoding's counts (zero without a speculator).
    pub spec: SpecStats,
}

impl Timings {
    pub fn prompt_tps(&self) -> f64 {
        self.prompt_tokens as f64 / self.prompt_time.as_secs_f64().max(1e-9)
    }

    pub fn gen_tps(&self) -> f64 {
        (self.gen_tokens.saturating_sub(1)) as f64 / self.gen_time.as_secs_f64().max(1e-9)
    }
}

#[derive(Clone, Debug)]
pub struct Completion {
    pub text: String,
    pub tokens: Vec<u32>,
    pub finish_reason: FinishReason,
    pub timings: Timings,
}

impl<B: Backend> Engine<B> {
    /// Generate a completion of `prompt` (token ids), calling `on_token` for every sampled
    /// token; returning `false` from it cancels. The KV blocks are released on every exit path.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        params: &GenerateParams,
        on_token: &mut dyn FnMut(Event<'_>) -> bool,
    ) -> Result<Completion, EngineError> {
        params.sampling.validate().map_err(EngineError::InvalidRequest)?;
        if prompt.is_empty() {
            return Err(EngineError::InvalidRequest("empty prompt".into()));
        }
        if prompt.len() >= self.opts.n_ctx {
            return Err(EngineError::PromptTooLong { prompt: prompt.len(), ctx: self.opts.n_ctx });
        }
        let mut table = vec![];
        let r = self.generate_inner(&mut table, prompt, params, on_token);
        self.pool.release(&mut table);
        r
    }

    /// The decode loop of one sequence: the `SeqDecoder` the service runs per request, fed
    /// by `forward_picks` over a batch of this one sequence (the prompt first, in chunks of
    /// `n_batch`, then one token a step, or with a speculator the last token and its drafts,
    /// one pick per position).
    fn generate_inner(
        &mut self,
        table: &mut Vec<u32>,
        prompt: &[u32],
        params: &GenerateParams,
        on_token: &mut dyn FnMut(Event<'_>) -> bool,
    ) -> Result<Completion, EngineError> {
        let mut timings = Timings { prompt_tokens: prompt.len(), ..Default::default() };
        let t0 = Instant::now();
        let mut t_first = t0;
        let mut dec = SeqDecoder::new(params, None, self.tokenizer.detokenizer());
        let mut history = prompt.to_vec();
        let mut n_computed = 0;
        let (mut text, mut tokens) = (String::new(), vec![]);
        let mut draft_len = DraftLength::default();
        let finish = 'steps: loop {
            let drafts = self.drafts(&history, n_computed, &dec, params.max_tokens, &mut draft_len)?;
            if n_computed > 0 && self.speculator.is_some() {
                timings.spec.target_steps += 1;
            }
            // one pick per checked position, each with the draw plain decoding would take there
            let mut draw_pos = vec![dec.draw_pos()];
            let mut picks = Vec::with_capacity(drafts.len() + 1);
            // the drafts ride on the history for the picks and the forward (no copy per step)
            let n_real = history.len();
            for i in 0..=drafts.len() {
                picks.push(dec.next_pick(&history));
                draw_pos.push(dec.draw_pos());
                history.extend(drafts.get(i));
            }
            let mask = dec.mask_job(0).into_iter().collect();
            let picked = self.run_sequence_picks(table, &history[n_computed..], n_computed, &picks, mask);
            history.truncate(n_real);
            let picked = picked?;
            if n_computed == 0 {
                // a model drafter reads the prompt now, as part of prompt processing
                // (a drafter that cannot hold it drafts nothing later; the text is the same)
                if let Some(spec) = self.speculator.as_mut() {
                    let _ = spec.drafter.prepare(0, &history[..n_real]);
                }
                timings.prompt_time = t0.elapsed();
                timings.time_to_first_token = t0.elapsed();
                t_first = Instant::now();
            }
            timings.spec.drafted += drafts.len();
            let accepted_before = timings.spec.accepted;
            n_computed = history.len();
            for (i, p) in picked.iter().enumerate() {
                let acc = dec.accept(&self.tokenizer, p.id, p.logits.as_deref(), history.len() + 1, self.opts.n_ctx);
                let matched = drafts.get(i) == Some(&p.id);
                if let Some((id, piece)) = acc.token {
                    history.push(id);
                    tokens.push(id);
                    text.push_str(&piece);
                    if !on_token(Event { token: Some(id), text: &piece }) {
                        break 'steps FinishReason::Cancelled;
                    }
                }
                if let Some(reason) = acc.finish {
                    break 'steps reason;
                }
                if !matched {
                    // the target's own token ends the step; the draws of later rows go back
                    dec.set_draw_pos(draw_pos[i + 1]);
                    break;
                }
                // the drafted token is the target's pick: its keys and values are already in
                timings.spec.accepted += 1;
                n_computed += 1;
            }
            draft_len.update(drafts.len(), timings.spec.accepted - accepted_before);
        };
        let (rest, finish) = dec.finish(finish);
        if !rest.is_empty() {
            text.push_str(&rest);
            on_token(Event { token: None, text: &rest });
        }
        timings.gen_tokens = tokens.len();
        timings.gen_time = t_first.elapsed();
        Ok(Completion { text, tokens, finish_reason: finish, timings })
    }

    /// The tokens to check after `history` this step: none while the prompt runs, for a
    /// constrained sequence (its masks follow the grammar one token at a time) or without a
    /// speculator; never past `max_tokens`, the context or one forward's `n_batch`.
    fn drafts(
        &mut self,
        history: &[u32],
        n_computed: usize,
        dec: &SeqDecoder,
        max_tokens: usize,
        len: &mut DraftLength,
    ) -> Result<Vec<u32>, EngineError> {
        let Some(spec) = self.speculator.as_mut() else { return Ok(vec![]) };
        if n_computed + 1 != history.len() || dec.has_constraint() {
            return Ok(vec![]);
        }
        // the step's last pick needs no draft before it: room for one token less
        let room = max_tokens
            .saturating_sub(dec.generated() + 1)
            .min(self.opts.n_ctx.saturating_sub(history.len() + 1))
            .min(self.opts.n_batch - 1);
        spec.propose(history, room.min(len.next(spec.opts.draft_max)))
    }
}
