//! Continuous batching behind an async API.
//!
//! ```text
//!  EngineHandle::submit ──Cmd──► step loop thread ──► Scheduler::step
//!        ▲                                              │ schedule: decodes, prompt chunks,
//!        │ StreamEvent (token, text, logprobs, done)    │   admissions (token budget, blocks)
//!  RequestStream ◄───────── per-request channel ◄───────┤ execute: one ForwardBatch
//!   (drop = cancel)                                     │ update: sample, stream, retire
//!                                                       ▼
//!                           BlockManager: refcounted KV blocks + prefix cache (LRU)
//! ```
//!
//! | module      | responsibility |
//! |-------------|----------------|
//! | `types`     | requests, events, errors, options, metrics, model summary |
//! | `blocks`    | KV blocks with reference counts and the hashed prefix cache |
//! | `seq`       | one request's state: tokens, KV progress, sampler, text, channel |
//! | `scheduler` | the step: budget, admission, preemption, execution, sampling; recurrent state slots |
//! | `state`     | recurrent-state checkpoints at chunk boundaries (prefix reuse for hybrid models) |
//! | `handle`    | `EngineHandle` (thread + command channel) and `RequestStream` |

mod blocks;
mod handle;
mod scheduler;
mod seq;
mod state;
mod types;

pub use blocks::{block_hash, BlockManager};
pub use handle::{EngineHandle, RequestStream};
pub use scheduler::{Scheduler, StepModel};
pub use types::*;

#[cfg(test)]
mod tests;
