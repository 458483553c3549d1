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
//! | `act`     | GELU with llama.cpp's f16 table, shared by the backends |
//! | `backend` | the `Backend` trait: fused LLM-level ops; `Unsupported` where a backend lacks one |
//! | `batch`   | `ForwardBatch`: flat tokens of several sequences, positions, block tables, logits rows |
//! | `cache`   | cache specs a model declares (`KvSpec`), KV element types |
//! | `numerics` | `Numerics`: fast, invariant or exact float orders, and a model's default |
//! | `rope`    | RoPE parameters (style, base, scaling) |
//! | `moe`     | MoE routing parameters, `Route`, the host reference router |
//! | `ssm`     | Mamba2 shapes, recurrent `StateSpec`, reference conv / scan / gated norm |
//! | `mask`    | `TokenMask`: the tokens a row may pick; `RowMasks`: a batch's masks, possibly still being computed |
//! | `sample`  | `SampleRow`: one row's sampling chain; `sample_masked_ref`, the reference of `Backend::sample_rows` |
//! | `error`   | `CoreError` |
//! | `trace`   | named intermediates for golden diffs (no-op unless enabled) |

pub mod act;
mod backend;
mod batch;
mod cache;
mod error;
mod mask;
pub mod moe;
mod numerics;
mod rope;
pub mod sample;
pub mod ssm;
pub mod trace;

pub use backend::{argmax, AttnParams, Backend, WeightSource};
pub use batch::{ForwardBatch, SeqBatch};
pub use cache::{KvSpec, KvType};
pub use error::{CoreError, Result};
pub use mask::{MaskSender, RowMasks, TokenMask};
pub use moe::{Gating, MoeRouting, Route};
pub use numerics::Numerics;
pub use quarrel_quant::QuantType;
pub use rope::{RopeParams, RopeScaling, RopeStyle};
pub use sample::{sample_masked_ref, sample_row_ref, SampleRow, SAMPLE_MAX_K};
pub use ssm::{SsmParams, StateSpec};
