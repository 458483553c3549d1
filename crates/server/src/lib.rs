//! # quarrel-server: `quarrel serve`'s HTTP and WebSocket APIs
//!
//! OpenAI-, ollama- and Quarrel-compatible APIs over the engine's async request API; every
//! generation streams through the engine's continuous batching.
//!
//! ```text
//!  client ─► axum router (routes.rs) ─► request id ─► trace ─► CORS ─► metrics ─► keys/limits
//!              │  openai.rs / ollama.rs / rest.rs / ws.rs   (wire formats)
//!              ▼
//!         gen.rs: Knobs ─► validated Request ─► Registry (registry.rs) picks / loads a model
//!              ▼
//!         EngineHandle::submit ─► RequestStream ─► Tracked (metrics) ─► SSE / NDJSON / JSON / WS
//!              (dropping the stream — client gone — cancels the request and frees its KV pages)
//! ```
//!
//! | module       | responsibility |
//! |--------------|----------------|
//! | `routes`     | the one router and its layers |
//! | `openai`     | `/v1/chat/completions` (`chat`), `/v1/completions` (with `n` choices), `/v1/models` |
//! | `embeddings` | `/v1/embeddings` and the embedding path the ollama routes share (`dimensions`: matryoshka truncation) |
//! | `rerank`     | `/v1/rerank`: a cross-encoder's relevance scores (llama-server / Jina / Cohere / TEI shapes) |
//! | `ollama`     | `/api/generate`, `/api/chat`, `/api/embed`, `/api/tags`, `/api/show`, `/api/ps` |
//! | `rest`       | Quarrel's `/api/models*`, `/api/stream`, `/api/health`, `/api/metrics`, probes |
//! | `utility`    | llama-server's `/tokenize`, `/detokenize`, `/apply-template` |
//! | `ws`         | the `/ws` WebSocket protocol (message shapes documented there) |
//! | `structured` | structured output fields (`response_format`, `grammar`, `json_schema`, ollama `format`) -> constraints |
//! | `tools`      | tool calling and reasoning: per-family call formats, forcing grammars, output split into content / reasoning / calls |
//! | `gen`        | sampling knobs -> engine request, submission, tracked streams |
//! | `registry`   | loaded models, load/unload, memory budget, LRU, on-demand loading |
//! | `auth`       | hashed API keys file, constant-time check |
//! | `conn`       | the accept loop: connection cap, header / idle timer, shutdown deadline |
//! | `middleware` | keys + rate limits, metrics per request |
//! | `shield`     | Host check, JSON content type, body size and time limits |
//! | `metrics`    | Prometheus registry and engine gauges |
//! | `openapi`    | the OpenAPI 3.1 document |
//! | `error`      | the one error shape, JSON body extractor |
//! | `state`      | configuration and shared state |
//! | `ui`         | the web chat page: `web/` embedded, served at `/` with a strict CSP |

pub mod auth;
pub mod conn;
pub mod embeddings;
pub mod error;
pub mod gen;
pub mod metrics;
pub mod middleware;
pub mod ollama;
pub mod openai;
pub mod openapi;
pub mod registry;
pub mod rerank;
pub mod rest;
pub mod routes;
pub mod shield;
pub mod state;
pub mod structured;
pub mod tools;
pub mod ui;
pub mod utility;
pub mod ws;

pub use auth::{KeyFile, KeyStore};
pub use error::ApiError;
pub use registry::{ModelEntry, ModelLoader, Registry};
pub use state::{AppState, RateLimit, ServerConfig};

pub use conn::serve;
