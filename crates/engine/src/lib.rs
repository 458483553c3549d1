//! # quarrel-engine: model + tokenizer + caches, driven step by step
//!
//! ```text
//!  text ─tokenize─► prompt ids ─┐
//!                               ▼
//!   Engine: BlockPool ─► ForwardBatch (chunks of n_batch) ─► Model::forward(kv) ─► logits
//!                               ▲                                                  │
//!                               └──────── next token ◄── picks on the backend ◄────┘
//!                                            │          (SeqDecoder: sampling chain + draw)
//!            SeqDecoder: Detokenizer ─► StopMatcher ─► finish rules ─► events (text pieces, finish)
//! ```
//!
//! | module       | responsibility |
//! |--------------|----------------|
//! | `constraint` | structured output: llguidance matchers from JSON schemas, GBNF / Lark grammars, regexes; per-token masks |
//! | `engine`     | `Engine`: loads a model, owns the KV cache, recurrent state slots and block pool, runs sequences |
//! | `decode`     | one sequence's decode logic shared by `generate` and the service: picks (device or host), detokenizing, stop strings, finish rules, logprobs |
//! | `generate`   | one completion on the calling thread: a `SeqDecoder` fed a batch of one sequence |
//! | `perplexity` | llama.cpp's perplexity protocol |
//! | `raw`        | forward passes below the request level (caller-held block tables, hand-built batches) for tools such as quarrel-bench |
//! | `sampler`    | sampling chain (penalties, top-k/p, min-p, temperature, seed) |
//! | `stop`       | stop strings over streamed text |
//! | `kv_calibrate` | quantized KV caches: a fixed calibration pass at load (sets the CPU cache's key offsets) |
//! | `blocks`     | KV block pool (synchronous paths) |
//! | `service`    | continuous batching: step loop thread, scheduler, prefix cache (with recurrent-state checkpoints for hybrid models), async API |
//! | `speculative` | speculative decoding: drafters (a smaller model, prompt lookup) and how many tokens to draft; `generate` checks the drafts in one forward |
//! | `embedding`  | text embeddings: model-family task prefixes, pooling choice, `embed_texts` |

mod blocks;
pub mod constraint;
pub mod decode;
pub mod embedding;
mod engine;
mod generate;
mod kv_calibrate;
mod perplexity;
mod raw;
pub mod sampler;
pub mod service;
pub mod speculative;
pub mod stop;

pub use blocks::{BlockPool, OutOfBlocks};
pub use constraint::{gbnf_to_lark, Constraint, ConstraintCompiler, ConstraintSpec};
pub use engine::{Engine, EngineError, EngineOptions};
pub use generate::{Completion, Event, FinishReason, GenerateParams, Timings};
pub use perplexity::{PerplexityChunk, PerplexityResult};
pub use sampler::{Sampler, SamplingParams};
pub use service::{
    EngineHandle, EngineMetrics, ModelSummary, Pooling, Priority, Prompt, Request, RequestId, RequestStream, RequestTimings, ServiceError,
    ServiceOptions, StreamEvent, TokenLogprob, Usage,
};
pub use speculative::{Drafter, ModelDrafter, NgramDrafter, SpecOptions, SpecStats, Speculator};
