//! One completion: prompt processing, the decode loop, streaming and finish reasons.

use crate::engine::{Engine, EngineError};
use crate::sampler::{Sampler, SamplingParams};
use crate::stop::{StopMatcher, StopOutcome};
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
}

impl Default for GenerateParams {
    fn default() -> Self {
        GenerateParams { sampling: SamplingParams::default(), max_tokens: 256, stop: vec![], ignore_eos: false }
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

    fn generate_inner(
        &mut self,
        table: &mut Vec<u32>,
        prompt: &[u32],
        params: &GenerateParams,
        on_token: &mut dyn FnMut(Event<'_>) -> bool,
    ) -> Result<Completion, EngineError> {
        let mut timings = Timings { prompt_tokens: prompt.len(), ..Default::default() };
        let t0 = Instant::now();
        // picks need no logits on the host: the backend returns the token ids (plain greedy:
        // `argmax_rows`; else `sample_rows` with the chain and the draw of the request's RNG)
        let greedy = params.sampling.is_plain_greedy();
        let mut sampler = Sampler::new(params.sampling.clone());
        let mut history = prompt.to_vec();
        let mut next = if greedy {
            self.run_sequence_pick(table, prompt, 0, None)?
        } else {
            let row = sampler.row(&history);
            self.run_sequence_pick(table, prompt, 0, Some(&row))?
        };
        timings.prompt_time = t0.elapsed();
        let mut detok = self.tokenizer.detokenizer();
        let mut stops = StopMatcher::new(&params.stop);
        let mut text = String::new();
        let mut tokens = vec![];
        let mut t_first = Instant::now();
        let mut hit_stop = false;
        let finish = loop {
            let tok = next;
            if tokens.is_empty() {
                timings.time_to_first_token = t0.elapsed();
                t_first = Instant::now();
            }
            if self.tokenizer.is_eog(tok) && !params.ignore_eos {
                break FinishReason::Stop;
            }
            tokens.push(tok);
            history.push(tok);
            let piece = detok.push(&self.tokenizer, tok).unwrap_or_default();
            let emit = match stops.push(&piece) {
                StopOutcome::Continue(s) => s,
                StopOutcome::Stop(s) => {
                    hit_stop = true;
                    s
                }
            };
            text.push_str(&emit);
            if !on_token(Event { token: Some(tok), text: &emit }) {
                break FinishReason::Cancelled;
            }
            if hit_stop {
                break FinishReason::Stop;
            }
            if tokens.len() >= params.max_tokens {
                break FinishReason::Length;
            }
            let pos = history.len() - 1;
            if pos + 1 >= self.opts.n_ctx {
                break FinishReason::ContextFull;
            }
            next = if greedy {
                self.run_sequence_pick(table, &[tok], pos, None)?
            } else {
                let row = sampler.row(&history);
                self.run_sequence_pick(table, &[tok], pos, Some(&row))?
            };
        };
        if !hit_stop {
            // release what the detokenizer and the stop matcher held back
            let mut rest = match stops.push(&detok.flush()) {
                StopOutcome::Continue(s) => s,
                StopOutcome::Stop(s) => {
                    hit_stop = true;
                    s
                }
            };
            if !hit_stop {
                rest.push_str(&stops.flush());
            }
            if !rest.is_empty() {
                text.push_str(&rest);
                on_token(Event { token: None, text: &rest });
            }
        }
        timings.gen_tokens = tokens.len();
        timings.gen_time = t_first.elapsed();
        Ok(Completion { text, tokens, finish_reason: finish, timings })
    }
}

