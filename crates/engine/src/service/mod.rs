//! Continuous batching behind an async API.
//!
//! ```text
//!  EngineHandle::submit ──Cmd──► step loop thread ──► Scheduler::round (step, then an embedding unit)
//!        ▲                                              │ schedule: decodes, prompt chunks,
//!        │ StreamEvent (token, text, logprobs, done)    │   admissions (token budget, blocks)
//!  RequestStream ◄───────── per-request channel ◄───────┤ execute: one ForwardBatch, picks on the backend
//!   (drop = cancel)                                     │ update: SeqDecoder per request: stream, retire
//!                                                       ▼
//!                           BlockManager: refcounted KV blocks + prefix cache (LRU)
//! ```
//!
//! | module      | responsibility |
//! |-------------|----------------|
//! | `types`     | requests, events, errors, options, metrics, model summary |
//! | `blocks`    | KV blocks with reference counts and the hashed prefix cache |
//! | `seq`       | one request's state: tokens, KV progress, its `SeqDecoder`, channel |
//! | `step_model`| `StepModel`: what the scheduler needs of a model (forward with picks, hidden states, state slots) |
//! | `scheduler` | the step: token budget, admission (prefix cache lookup), preemption, retirement, metrics |
//! | `execute`   | one step run: batch assembly, picks on the model's backend, KV progress, prefix registration |
//! | `state`     | recurrent state: a slot per running request, checkpoints at chunk boundaries (prefix reuse for hybrid models) |
//! | `embed`     | embedding requests as jobs: one unit (packed inputs or a chunk of a long one) per round, sized to share time with generation; cancellation and deadlines |
//! | `pool`      | pooling (mean / last / CLS) and L2 normalization of the vectors |
//! | `handle`    | `EngineHandle` (thread + command channel) and `RequestStream` |

mod blocks;
mod embed;
mod execute;
mod handle;
mod pool;
mod scheduler;
mod seq;
mod state;
mod step_model;
mod types;

pub use blocks::{block_hash, BlockManager};
pub use handle::{EngineHandle, RequestStream};
pub use scheduler::Scheduler;
pub use step_model::StepModel;
pub use types::*;

#[cfg(test)]
mod tests;
