//! Texts -> engine embeddings -> RecordBatches -> DoPut, with embedding and upload overlapped:
//! a blocking task embeds `batch` texts at a time (the scheduler packs them several per
//! forward) and hands each batch to the uploader while it embeds the next.
//!
//! ```text
//!  docs ─chunks─► embed_texts_blocking ─► Embeddings{dim, data} ─(moved)─► RecordBatch ─mpsc─► put_stream
//! ```

use crate::batch::{embedding_schema, EmbeddingRows};
use crate::client::LongbowClient;
use crate::error::{FlightClientError, Result};
use crate::put::{PutOptions, PutReport};
use quarrel_engine::embedding::{embed_texts_blocking, EmbedOptions};
use quarrel_engine::service::EngineHandle;
use tokio::sync::mpsc;

/// One document: its id in the dataset, the text to embed, optional JSON metadata.
#[derive(Clone, Debug, PartialEq)]
pub struct Doc {
    pub id: String,
    pub text: String,
    pub metadata: Option<String>,
}

#[derive(Clone, Debug)]
pub struct IngestOptions {
    pub embed: EmbedOptions,
    /// Texts per embedding call and per RecordBatch.
    pub batch: usize,
    /// Store the text in a `text` column.
    pub with_text: bool,
    pub put: PutOptions,
}

impl Default for IngestOptions {
    fn default() -> Self {
        IngestOptions {
            embed: EmbedOptions { normalize: true, ..Default::default() },
            batch: 64,
            with_text: true,
            put: PutOptions::default(),
        }
    }
}

/// Embed `docs` with the engine and stream them into `dataset`. `progress` sees every
/// acknowledgement.
pub async fn ingest(
    engine: &EngineHandle,
    client: &mut LongbowClient,
    dataset: &str,
    docs: Vec<Doc>,
    opts: &IngestOptions,
    progress: &mut (dyn FnMut(&PutReport) + Send),
) -> Result<PutReport> {
    if docs.is_empty() {
        return Err(FlightClientError::InvalidRows("no documents".into()));
    }
    let with_meta = docs.iter().any(|d| d.metadata.is_some());
    let dim = engine.info().n_embd;
    let schema = embedding_schema(dim, with_meta, opts.with_text)?;
    let (tx, rx) = mpsc::channel(2);
    let (h, o) = (engine.clone(), opts.clone());
    let producer = tokio::task::spawn_blocking(move || -> Result<()> {
        let mut docs = docs.into_iter().peekable();
        while docs.peek().is_some() {
            let chunk: Vec<Doc> = docs.by_ref().take(o.batch.max(1)).collect();
            let texts: Vec<String> = chunk.iter().map(|d| d.text.clone()).collect();
            let e = embed_texts_blocking(&h, &texts, &o.embed).map_err(FlightClientError::Embed)?;
            if e.dim != dim {
                return Err(FlightClientError::InvalidRows(format!("the engine made vectors of {} values, the model says {dim}", e.dim)));
            }
            let metadata = with_meta.then(|| chunk.iter().map(|d| d.metadata.clone()).collect());
            let text = o.with_text.then_some(texts);
            let rows = EmbeddingRows { ids: chunk.into_iter().map(|d| d.id).collect(), dim, vectors: e.data, metadata, text };
            if tx.blocking_send(rows.into_record_batch()?).is_err() {
                return Ok(()); // the upload stopped; its error is reported
            }
        }
        Ok(())
    });
    let put = client.put_stream(dataset, schema, rx, &opts.put, progress).await;
    let produced = producer.await.map_err(|e| FlightClientError::InvalidRows(format!("embedding task failed: {e}")))?;
    // an embedding error ends the stream early: report it rather than a short success
    produced?;
    put
}
