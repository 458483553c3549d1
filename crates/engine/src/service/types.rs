//! The service's public vocabulary: requests, streamed events, errors, options, metrics.

use crate::constraint::ConstraintSpec;
use crate::generate::{FinishReason, GenerateParams};
use quarrel_tokenizer::{ChatMessage, ChatOptions};
use serde::Serialize;
use std::path::PathBuf;
use std::time::Duration;

pub type RequestId = u64;

/// What to complete.
#[derive(Clone, Debug)]
pub enum Prompt {
    /// Tokenized with the model's BOS rule; special tokens in the text are parsed.
    Text(String),
    Tokens(Vec<u32>),
    /// Rendered with the model's chat template (ChatML when it has none) plus the
    /// generation prompt; `options` carries the tools and extra template variables.
    Chat {
        messages: Vec<ChatMessage>,
        options: ChatOptions,
    },
}

impl Prompt {
    /// A chat prompt without tools or template variables.
    pub fn chat(messages: Vec<ChatMessage>) -> Prompt {
        Prompt::Chat { messages, options: ChatOptions::default() }
    }
}

/// Interactive requests are scheduled before batch requests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Priority {
    #[default]
    Interactive,
    Batch,
}

#[derive(Clone, Debug)]
pub struct Request {
    pub prompt: Prompt,
    pub params: GenerateParams,
    pub priority: Priority,
    /// `Some(n)`: report the chosen token's log-probability and the `n` most likely tokens.
    pub logprobs: Option<usize>,
    /// Wall-clock limit from submission; `None` = the service default.
    pub timeout: Option<Duration>,
    /// Structured output: what the generated text must follow (checked by `submit`).
    pub constraint: Option<ConstraintSpec>,
    /// Use the engine's speculative decoding, when it has a drafter (the output is the same
    /// either way; false saves the drafting work).
    pub speculative: bool,
}

impl Request {
    pub fn new(prompt: Prompt, params: GenerateParams) -> Request {
        Request { prompt, params, priority: Priority::Interactive, logprobs: None, timeout: None, constraint: None, speculative: true }
    }
}

/// Log-probabilities (natural log, of the model's distribution before sampling filters).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TokenLogprob {
    pub token: u32,
    pub text: String,
    pub logprob: f32,
    /// The most likely tokens, most likely first: (id, text, logprob).
    pub top: Vec<(u32, String, f32)>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens whose KV came from the prefix cache.
    pub cached_tokens: usize,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct RequestTimings {
    /// Submission to first scheduled step.
    pub queued: Duration,
    /// Submission to first generated token.
    pub ttft: Duration,
    /// First scheduled step to first token (prompt processing).
    pub prompt: Duration,
    /// First token to last token.
    pub gen: Duration,
}

impl RequestTimings {
    /// Decode speed over the tokens after the first.
    pub fn gen_tokens_per_sec(&self, n_generated: usize) -> f64 {
        let s = self.gen.as_secs_f64();
        if n_generated < 2 || s <= 0.0 {
            return 0.0;
        }
        (n_generated - 1) as f64 / s
    }
}

#[derive(Clone, Debug)]
pub enum StreamEvent {
    /// One sampled token and the text it completes (may be empty while a multi-byte character
    /// or a possible stop string is held back). `id: None` flushes held-back text at the end.
    Token {
        id: Option<u32>,
        text: String,
        logprob: Option<TokenLogprob>,
    },
    Done {
        finish_reason: FinishReason,
        usage: Usage,
        timings: RequestTimings,
    },
    Error(ServiceError),
}

#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ServiceError {
    #[error("server overloaded: {queued} requests waiting")]
    Overloaded { queued: usize },
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("prompt of {prompt} tokens does not fit the context of {ctx} tokens")]
    PromptTooLong { prompt: usize, ctx: usize },
    #[error("request timed out")]
    Timeout,
    #[error("inference failed: {0}")]
    Inference(String),
    #[error("the engine is shut down")]
    ShutDown,
}

/// Embedding vectors in one row-major buffer: row `i` is `data[i * dim..(i + 1) * dim]`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Embeddings {
    pub dim: usize,
    pub data: Vec<f32>,
}

impl Embeddings {
    pub fn len(&self) -> usize {
        self.data.len().checked_div(self.dim).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.dim..(i + 1) * self.dim]
    }

    pub fn rows(&self) -> std::slice::ChunksExact<'_, f32> {
        self.data.chunks_exact(self.dim.max(1))
    }

    pub fn to_vecs(&self) -> Vec<Vec<f32>> {
        self.rows().map(<[f32]>::to_vec).collect()
    }

    /// Matryoshka truncation: each vector's first `dims` values, L2-normalized again when
    /// `normalize` (what OpenAI's and ollama's `dimensions` do; models trained for it, such as
    /// nomic-embed v1.5, keep most of their quality at 256 or 128). `dims` must be in 1..=dim.
    pub fn truncated(&self, dims: usize, normalize: bool) -> Result<Embeddings, ServiceError> {
        if dims == 0 || dims > self.dim {
            return Err(ServiceError::InvalidRequest(format!("dimensions must be in 1..={} for this model, got {dims}", self.dim)));
        }
        let mut data = Vec::with_capacity(self.len() * dims);
        for r in self.rows() {
            let v = &r[..dims];
            let norm = v.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
            let k = if normalize && norm > 0.0 { 1.0 / norm } else { 1.0 };
            data.extend(v.iter().map(|&x| (x as f64 * k) as f32));
        }
        Ok(Embeddings { dim: dims, data })
    }
}

/// How hidden states become one embedding vector.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Pooling {
    #[default]
    Mean,
    Last,
    Cls,
    /// A cross-encoder's relevance scores: the first token's state (an encoder's; a
    /// decoder's last) through the model's classification head.
    Rank,
}

#[derive(Clone, Debug)]
pub struct ServiceOptions {
    /// Most tokens in one step (decodes + prompt chunks); 0 = `prompt_chunk + max_running`.
    pub max_batch_tokens: usize,
    /// Prompts are processed in chunks aligned to multiples of this (0 = the engine's
    /// `n_batch`), exactly as a request running alone would be, so that results do not
    /// depend on what else is in the batch.
    pub prompt_chunk: usize,
    /// Most sequences running at once.
    pub max_running: usize,
    /// Most requests waiting; beyond it `submit` answers `Overloaded`.
    pub max_queue: usize,
    pub prefix_cache: bool,
    pub default_timeout: Option<Duration>,
}

impl Default for ServiceOptions {
    fn default() -> Self {
        ServiceOptions {
            max_batch_tokens: 0,
            prompt_chunk: 0,
            max_running: 64,
            max_queue: 256,
            prefix_cache: true,
            default_timeout: Some(Duration::from_secs(300)),
        }
    }
}

impl ServiceOptions {
    pub fn validate(&self) -> Result<(), ServiceError> {
        if self.max_running == 0 {
            return Err(ServiceError::InvalidRequest("max_running must be positive".into()));
        }
        Ok(())
    }

    /// Fill in the automatic values given the engine's batch size.
    pub fn resolved(mut self, n_batch: usize) -> ServiceOptions {
        if self.prompt_chunk == 0 {
            self.prompt_chunk = n_batch.max(1);
        }
        if self.max_batch_tokens == 0 {
            self.max_batch_tokens = self.prompt_chunk + self.max_running;
        }
        self
    }
}

/// What a client may want to know about the loaded model.
#[derive(Clone, Debug, Serialize)]
pub struct ModelSummary {
    pub name: String,
    pub path: Option<PathBuf>,
    pub arch: String,
    pub n_ctx: usize,
    pub n_ctx_train: usize,
    pub n_vocab: usize,
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_kv_head: usize,
    pub n_params: u64,
    /// `general.file_type` as llama.cpp names it ("Q4_1", "Q4_K_M", ...).
    pub file_type: String,
    pub size_bytes: u64,
    pub chat_template: Option<String>,
    pub pooling: Pooling,
    /// Classes the model's classification head scores (0: none; 1 for a reranker).
    pub n_classes: usize,
    /// KV cache element type ("f16", "q8_0", ...).
    pub kv_type: String,
    pub backend: String,
}

/// A snapshot of the step loop's counters.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct EngineMetrics {
    pub queue_depth: usize,
    pub running: usize,
    pub last_batch_tokens: usize,
    pub kv_blocks_total: usize,
    pub kv_blocks_used: usize,
    pub kv_blocks_free: usize,
    /// Unreferenced blocks kept for prefix reuse (counted in `free` too: they are evictable).
    pub kv_blocks_cached: usize,
    pub kv_block_size: usize,
    pub prefix_hit_tokens_total: u64,
    pub preemptions_total: u64,
    pub steps_total: u64,
    pub prompt_tokens_total: u64,
    pub generated_tokens_total: u64,
    pub requests_finished_total: u64,
    /// Speculative decoding: tokens drafted and checked, drafts accepted, and sequence steps
    /// that checked drafts (accepted / steps + 1: tokens per target step).
    pub spec_drafted_total: u64,
    pub spec_accepted_total: u64,
    pub spec_steps_total: u64,
    /// Embedding requests queued or running (`/v1/embeddings`, ollama embed, Flight).
    pub embeddings: usize,
    pub embedded_tokens_total: u64,
    pub embed_requests_finished_total: u64,
    /// Embedding forwards run, and the texts in them (texts per forward: how well requests
    /// from many clients are packed together).
    pub embed_forwards_total: u64,
    pub embed_forward_texts_total: u64,
    /// Recurrent (Mamba2) models: bytes of state slots (sequences, scratch, checkpoints).
    pub recurrent_state_bytes: u64,
    /// Recurrent models: non-finite values met in SSM state (recomputed in f64 or saturated).
    pub ssm_nonfinite_total: u64,
    /// Recurrent models: prefix checkpoints of the state held now.
    pub state_checkpoints: usize,
    /// MoE models: tokens routed to each expert so far, `[layer][expert]` (empty rows for
    /// layers without experts); utilization = a count over its row's sum.
    pub expert_selections: Vec<Vec<u64>>,
    /// Host wall time in MoE routing / Mamba2 conv / Mamba2 scan since load (exact on the CPU;
    /// on CUDA the launch, or for routing the wait for the router logits: `layers::timing`).
    pub moe_routing_seconds_total: f64,
    pub ssm_conv_seconds_total: f64,
    pub ssm_scan_seconds_total: f64,
}
