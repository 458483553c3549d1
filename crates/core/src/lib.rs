//! # quarrel-core: the vocabulary shared by backends, models and the engine
//!
//! ```text
//!  models ──(Backend ops over B::Buf / B::Weight)──► backend-cpu | backend-cuda
//!     ▲                                                     │
//!     └── ForwardBatch (flat tokens, positions, block tables) + Caches ◄── engine
//! ```
//!
//! | module    | responsibility |
//! |-----------|----------------|
//! | `backend` | the `Backend` trait: fused LLM-level ops; `Unsupported` where a backend lacks one |
//! | `batch`   | `ForwardBatch`: flat tokens of several sequences, positions, block tables, logits rows |
//! | `cache`   | cache specs a model declares (`KvSpec`), KV element types |
//! | `rope`    | RoPE parameters (style, base, scaling) |
//! | `error`   | `CoreError` |
//! | `trace`   | named intermediates for golden diffs (no-op unless enabled) |

mod backend;
mod batch;
mod cache;
mod error;
mod rope;
pub mod trace;

pub use backend::{AttnParams, Backend, WeightSource};
pub use batch::{ForwardBatch, SeqBatch};
pub use cache::{KvSpec, KvType};
pub use error::{CoreError, Result};
pub use rope::{RopeParams, RopeStyle};
pub use quarrel_quant::QuantType;
