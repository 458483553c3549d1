//! What every API shares on the way to the engine: sampling knobs -> a validated engine
//! `Request`, submission to the chosen model, and a `Tracked` stream that records the
//! latency and token metrics as events pass. Dropping a `Tracked` drops the engine's
//! `RequestStream`, which cancels the request and frees its KV pages within one step.

use crate::error::ApiError;
use crate::registry::Loaded;
use crate::state::AppState;
use crate::tools::{plan, ChatPlan, ToolRequest};
use quarrel_engine::{
    ConstraintSpec, FinishReason, GenerateParams, Prompt, Request, RequestStream, RequestTimings, SamplingParams, StreamEvent,
    TokenLogprob, Usage,
};
use std::sync::Arc;
use std::time::Instant;

/// Sampling and length options as the APIs spell them (all optional).
#[derive(Clone, Debug, Default)]
pub struct Knobs {
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub max_tokens: Option<i64>,
    pub seed: Option<i64>,
    pub stop: Vec<String>,
    pub repeat_penalty: Option<f64>,
    pub repeat_last_n: Option<i64>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    /// Report log-probabilities with this many alternatives.
    pub logprobs: Option<usize>,
    /// Default temperature when none is given (OpenAI: 1.0; ollama: 0.8).
    pub default_temperature: f64,
    /// Structured output (`response_format`, `grammar`, `format`, ...).
    pub constraint: Option<ConstraintSpec>,
    /// Tools the model may call (chat prompts).
    pub tools: Option<ToolRequest>,
    /// Generate past the end-of-generation token (benchmarks, tests).
    pub ignore_eos: bool,
    /// Token id -> bias added to its logit (OpenAI `logit_bias`, -100..=100).
    pub logit_bias: Vec<(u32, f32)>,
    /// `false`: no speculative decoding for this request (default: the server's setting).
    pub speculative: Option<bool>,
}

fn range(name: &str, v: Option<f64>, lo: f64, hi: f64) -> Result<Option<f32>, ApiError> {
    match v {
        None => Ok(None),
        Some(x) if x.is_finite() && x >= lo && x <= hi => Ok(Some(x as f32)),
        Some(x) => Err(ApiError::invalid(format!("{name} must be between {lo} and {hi}, got {x}"))),
    }
}

impl Knobs {
    /// Validate and build the engine's parameters.
    pub fn params(&self, n_ctx: usize) -> Result<(GenerateParams, Option<usize>), ApiError> {
        let mut s = SamplingParams {
            temperature: range("temperature", self.temperature, 0.0, 2.0)?.unwrap_or(self.default_temperature as f32),
            ..Default::default()
        };
        if let Some(p) = range("top_p", self.top_p, 0.0, 1.0)? {
            s.top_p = p;
        }
        if let Some(p) = range("min_p", self.min_p, 0.0, 1.0)? {
            s.min_p = p;
        }
        match self.top_k {
            Some(k) if k < 0 => return Err(ApiError::invalid(format!("top_k must be >= 0, got {k}"))),
            Some(k) => s.top_k = k as usize,
            None => {}
        }
        if let Some(p) = range("repeat_penalty", self.repeat_penalty, 1e-6, 10.0)? {
            s.repeat_penalty = p;
        }
        if let Some(p) = range("presence_penalty", self.presence_penalty, -2.0, 2.0)? {
            s.presence_penalty = p;
        }
        if let Some(p) = range("frequency_penalty", self.frequency_penalty, -2.0, 2.0)? {
            s.frequency_penalty = p;
        }
        match self.repeat_last_n {
            Some(n) if n < -1 => return Err(ApiError::invalid(format!("repeat_last_n must be >= -1, got {n}"))),
            Some(-1) => s.penalty_last_n = usize::MAX,
            Some(n) => s.penalty_last_n = n as usize,
            None => {}
        }
        s.seed = match self.seed {
            Some(x) => x as u64,
            None => rand::random(),
        };
        let max_tokens = match self.max_tokens {
            Some(n) if n < 0 => return Err(ApiError::invalid(format!("max_tokens must be >= 0, got {n}"))),
            Some(0) => return Err(ApiError::invalid("max_tokens must be at least 1")),
            Some(n) => (n as usize).min(n_ctx),
            None => n_ctx,
        };
        if self.stop.len() > 16 {
            return Err(ApiError::invalid("at most 16 stop sequences"));
        }
        let stop = self.stop.iter().filter(|s| !s.is_empty()).cloned().collect();
        if let Some(n) = self.logprobs {
            if n > 20 {
                return Err(ApiError::invalid(format!("top_logprobs must be between 0 and 20, got {n}")));
            }
        }
        if let Some(&(_, b)) = self.logit_bias.iter().find(|(_, b)| !(-100.0..=100.0).contains(b)) {
            return Err(ApiError::invalid(format!("logit_bias values must be between -100 and 100, got {b}")));
        }
        let logit_bias = self.logit_bias.clone();
        Ok((GenerateParams { sampling: s, max_tokens, stop, ignore_eos: self.ignore_eos, logit_bias }, self.logprobs))
    }
}

/// Reject empty and oversized prompts before tokenizing.
pub fn check_prompt(state: &AppState, prompt: &Prompt) -> Result<(), ApiError> {
    let chars = match prompt {
        Prompt::Text(t) => {
            if t.trim().is_empty() {
                return Err(ApiError::invalid("the prompt is empty"));
            }
            t.len()
        }
        Prompt::Tokens(t) => {
            if t.is_empty() {
                return Err(ApiError::invalid("the prompt is empty"));
            }
            0
        }
        Prompt::Chat { messages: m, .. } => {
            if m.is_empty() {
                return Err(ApiError::invalid("messages must not be empty"));
            }
            if m.iter().all(|m| m.content.trim().is_empty() && m.tool_calls.is_empty()) {
                return Err(ApiError::invalid("every message is empty"));
            }
            m.iter().map(|m| m.content.len()).sum()
        }
    };
    if chars > state.config.max_prompt_bytes {
        return Err(ApiError::new(
            axum::http::StatusCode::PAYLOAD_TOO_LARGE,
            "prompt_too_large",
            "invalid_request_error",
            format!("the prompt is {chars} bytes; the limit is {}", state.config.max_prompt_bytes),
        ));
    }
    Ok(())
}

/// A request running on a model.
pub struct Started {
    pub model: Arc<Loaded>,
    pub stream: Tracked,
    /// How to read the output back (tool calls, reasoning).
    pub plan: ChatPlan,
}

/// Validate, pick the model and submit.
pub async fn start(state: &AppState, model: Option<&str>, mut prompt: Prompt, knobs: &Knobs) -> Result<Started, ApiError> {
    check_prompt(state, &prompt)?;
    let m = state.registry.get(model).await?;
    let (params, logprobs) = knobs.params(m.handle.n_ctx())?;
    let n_vocab = m.info().n_vocab;
    if let Some(&(t, _)) = params.logit_bias.iter().find(|(t, _)| *t as usize >= n_vocab) {
        return Err(ApiError::invalid(format!("logit_bias names token {t}, outside the vocabulary of {n_vocab}")));
    }
    let mut constraint = knobs.constraint.clone();
    let chat_plan = match &mut prompt {
        Prompt::Chat { messages, options } => plan(m.handle.tokenizer(), knobs.tools.as_ref(), messages, options, &mut constraint)?,
        _ if knobs.tools.is_some() => return Err(ApiError::invalid("tools need a chat prompt")),
        _ => ChatPlan::default(),
    };
    if state.config.log_prompts {
        tracing::info!(model = %m.entry.name, prompt = ?prompt, "prompt");
    }
    let mut req = Request::new(prompt, params);
    req.logprobs = logprobs;
    req.constraint = constraint;
    req.speculative = knobs.speculative.unwrap_or(true);
    req.timeout = Some(state.config.request_timeout);
    // tokenizing (up to --max-prompt bytes) and rendering the template are CPU work: off the
    // async threads, which keep serving other connections meanwhile
    let handle = m.handle.clone();
    let stream =
        tokio::task::spawn_blocking(move || handle.submit(req)).await.map_err(|e| ApiError::internal(format!("tokenizer task: {e}")))??;
    let stream = Tracked { inner: stream, state: state.clone(), model: m.entry.name.clone(), t0: Instant::now(), last: None };
    Ok(Started { model: m, stream, plan: chat_plan })
}

/// A request's events with metrics recorded on the way.
pub struct Tracked {
    inner: RequestStream,
    state: AppState,
    model: String,
    t0: Instant,
    last: Option<Instant>,
}

impl Tracked {
    pub fn id(&self) -> u64 {
        self.inner.id
    }

    pub async fn next(&mut self) -> Option<StreamEvent> {
        let ev = self.inner.next().await?;
        let m = &self.state.metrics;
        match &ev {
            StreamEvent::Token { id: Some(_), .. } => {
                let now = Instant::now();
                match self.last {
                    None => m.ttft_seconds.with_label_values(&[&self.model]).observe((now - self.t0).as_secs_f64()),
                    Some(l) => m.itl_seconds.with_label_values(&[&self.model]).observe((now - l).as_secs_f64()),
                }
                self.last = Some(now);
                m.tokens_out.with_label_values(&[&self.model]).inc();
            }
            StreamEvent::Done { usage, timings, .. } => {
                let model = [self.model.as_str()];
                m.tokens_in.with_label_values(&model).inc_by(usage.prompt_tokens as u64);
                m.e2e_seconds.with_label_values(&model).observe(self.t0.elapsed().as_secs_f64());
                m.queue_seconds.with_label_values(&model).observe(timings.queued.as_secs_f64());
                m.prompt_len.with_label_values(&model).observe(usage.prompt_tokens as f64);
                m.gen_len.with_label_values(&model).observe(usage.completion_tokens as f64);
            }
            StreamEvent::Error(e) => {
                m.errors.with_label_values(&[ApiError::from(e.clone()).code]).inc();
            }
            _ => {}
        }
        Some(ev)
    }

    /// Run to the end and gather the whole answer.
    pub async fn collect(mut self) -> Result<Collected, ApiError> {
        let mut c = Collected::default();
        while let Some(ev) = self.next().await {
            match ev {
                StreamEvent::Token { id, text, logprob } => {
                    c.text.push_str(&text);
                    if let Some(id) = id {
                        c.tokens.push(id);
                    }
                    if let Some(lp) = logprob {
                        c.logprobs.push(lp);
                    }
                }
                StreamEvent::Done { finish_reason, usage, timings } => {
                    c.finish = Some(finish_reason);
                    c.usage = usage;
                    c.timings = timings;
                }
                StreamEvent::Error(e) => return Err(e.into()),
            }
        }
        if c.finish.is_none() {
            return Err(ApiError::internal("the engine ended the stream without finishing"));
        }
        Ok(c)
    }
}

/// A finished generation.
#[derive(Default, Debug)]
pub struct Collected {
    pub text: String,
    pub tokens: Vec<u32>,
    pub logprobs: Vec<TokenLogprob>,
    pub finish: Option<FinishReason>,
    pub usage: Usage,
    pub timings: RequestTimings,
}

/// OpenAI's finish reason names.
pub fn finish_str(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Stop => "stop",
        FinishReason::Length | FinishReason::ContextFull => "length",
        FinishReason::Cancelled => "cancelled",
    }
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn knobs_validate_ranges() {
        let ok = Knobs { temperature: Some(0.5), max_tokens: Some(10), default_temperature: 1.0, ..Default::default() };
        let (p, _) = ok.params(100).unwrap();
        assert_eq!((p.sampling.temperature, p.max_tokens), (0.5, 10));
        for bad in [
            Knobs { temperature: Some(2.5), ..Default::default() },
            Knobs { temperature: Some(-0.1), ..Default::default() },
            Knobs { top_p: Some(1.5), ..Default::default() },
            Knobs { max_tokens: Some(-1), ..Default::default() },
            Knobs { top_k: Some(-3), ..Default::default() },
            Knobs { logprobs: Some(50), ..Default::default() },
        ] {
            assert_eq!(bad.params(100).unwrap_err().status, axum::http::StatusCode::BAD_REQUEST, "{bad:?}");
        }
        let big = Knobs { max_tokens: Some(1 << 40), default_temperature: 1.0, ..Default::default() };
        assert_eq!(big.params(64).unwrap().0.max_tokens, 64);
    }
}
