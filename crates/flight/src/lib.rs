//! # quarrel-flight: embeddings into Longbow over Apache Arrow Flight
//!
//! Quarrel as the inference node of a retrieval pipeline: texts become vectors in the
//! engine, the vectors become Arrow RecordBatches without copying, and DoPut streams them to
//! Longbow (data port: DoPut, DoGet; meta port: GetFlightInfo, ListFlights, DoAction).
//!
//! ```text
//!  texts ─► EngineHandle (scheduler packs texts per forward) ─► Embeddings{dim, Vec<f32>}
//!        ─(Vec moved into an Arrow buffer)─► RecordBatch{id, vector: fixed_size_list<f32>[dim], metadata?, text?}
//!        ─► DoPut (window, slow_down backoff, reconnect + reconcile) ─► Longbow
//!  verification: DoGet {"name", "limit"} / {"search": {dataset, vector, k}}, GetFlightInfo
//! ```
//!
//! | module     | responsibility |
//! |------------|----------------|
//! | `batch`    | Longbow's schema; rows -> RecordBatch (zero-copy vectors); batches -> ids + vectors |
//! | `client`   | `LongbowClient`: endpoints, connect/reconnect, GetFlightInfo, ListFlights, DoGet, search, DoAction |
//! | `put`      | streaming DoPut: acknowledgement window, `slow_down` backoff, retries without loss or duplicates |
//! | `pipeline` | `ingest`: engine embeddings -> batches -> DoPut, embedding overlapped with upload |
//! | `peer`     | test support (feature `test-peer`): the pyarrow peer (`tests/flight_peer.py`) as a child process |
//! | `error`    | `FlightClientError`, transient vs final |

pub mod batch;
pub mod client;
pub mod error;
#[cfg(any(test, feature = "test-peer"))]
pub mod peer;
pub mod pipeline;
pub mod put;

pub use batch::{embedding_schema, split, EmbeddingRows, Vectors};
pub use client::{default_meta_endpoint, endpoint_uri, LongbowClient};
pub use error::FlightClientError;
pub use pipeline::{ingest, Doc, IngestOptions};
pub use put::{Backoff, PutOptions, PutReport};
