//! `quarrel embed`: texts -> embedding vectors, printed as JSON lines or streamed into
//! Longbow (Arrow Flight DoPut) with a progress bar; `--search` asks Longbow for the
//! nearest neighbours of the texts instead.

use crate::args::{CacheArgs, ContextArgs, DeviceArgs, EngineArgs, KvTypeArg, ModelArg, ModelArgs};
use anyhow::{bail, Context, Result};
use quarrel_engine::embedding::{embed_texts_blocking, EmbedOptions, EmbedTask, PrefixMode};
use quarrel_engine::service::{EngineHandle, Pooling, ServiceOptions};
use quarrel_flight::{default_meta_endpoint, ingest, Doc, IngestOptions, LongbowClient, PutOptions, PutReport};
use serde_json::Value;
use std::io::{BufRead, Write};
use std::time::Instant;

/// Embed texts: print one JSON line per text ({"id", "vector"}), or stream the vectors into a
/// Longbow dataset over Arrow Flight.
///
/// Texts come from TEXT arguments or --file (JSON lines: a string, or an object with "text"
/// and optional "id" and "metadata"; "-" reads stdin). Ids default to the text's position.
/// Examples:
///   quarrel embed "first text" "second text"
///   quarrel embed --file docs.jsonl --flight localhost:3000 --dataset docs
///   quarrel embed --flight localhost:3000 --dataset docs --search -k 5 "what is arrow?"
#[derive(clap::Args)]
#[command(verbatim_doc_comment)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArg,
    #[command(flatten)]
    pub ctx: ContextArgs,
    /// Tokens per forward pass (short texts are packed several per forward up to this).
    #[arg(long = "ubatch", default_value_t = 512)]
    pub ubatch: usize,
    #[command(flatten)]
    pub device: DeviceArgs,
    /// JSON-lines file of texts ("-": stdin).
    #[arg(short = 'f', long = "file")]
    pub file: Option<String>,
    /// Texts to embed (unless --file).
    pub text: Vec<String>,
    /// Texts per embedding call and per Arrow RecordBatch sent.
    #[arg(long = "batch", default_value_t = 64)]
    pub batch: usize,
    /// Pooling: mean, last, cls or rank (a reranker's scores; default: the model's
    /// pooling_type, else mean).
    #[arg(long = "pooling")]
    pub pooling: Option<String>,
    /// Keep the first N values of each vector (matryoshka truncation), normalized again
    /// unless --no-normalize: for models trained for it (nomic-embed v1.5: 768, 512, 256, 128, 64).
    #[arg(long = "dimensions", value_name = "N")]
    pub dimensions: Option<usize>,
    /// Keep vectors unnormalized (default: L2-normalized).
    #[arg(long = "no-normalize")]
    pub no_normalize: bool,
    /// What the texts are for: document or query (selects the model family's prefix, e.g.
    /// nomic-embed's "search_document: " / "search_query: ").
    #[arg(long = "task", default_value = "document")]
    pub task: String,
    /// Put this prefix before every text, whatever the model.
    #[arg(long = "prefix", conflicts_with = "no_prefix")]
    pub prefix: Option<String>,
    /// No task prefix even when the model's metadata names a family that uses one.
    #[arg(long = "no-prefix")]
    pub no_prefix: bool,
    /// Longbow's data endpoint (HOST:PORT): stream the vectors there instead of printing them.
    #[arg(long = "flight")]
    pub flight: Option<String>,
    /// Longbow's meta endpoint (HOST:PORT; default: the data port + 1).
    #[arg(long = "meta")]
    pub meta: Option<String>,
    /// Dataset to store into (with --flight).
    #[arg(long = "dataset")]
    pub dataset: Option<String>,
    /// Leave the texts out of the stored rows (no `text` column).
    #[arg(long = "no-text")]
    pub no_text: bool,
    /// Batches in flight without an acknowledgement.
    #[arg(long = "window", default_value_t = 8)]
    pub window: usize,
    /// Reconnect attempts after transient errors before giving up.
    #[arg(long = "retries", default_value_t = 8)]
    pub retries: u32,
    /// Search the dataset for each text's nearest neighbours (prints JSON lines) instead of
    /// storing; the texts are embedded as queries unless --task says otherwise.
    #[arg(long = "search")]
    pub search: bool,
    /// Neighbours per --search text.
    #[arg(short = 'k', default_value_t = 10)]
    pub k: usize,
}

fn parse_pooling(s: &str) -> Result<Pooling> {
    Ok(match s.to_ascii_lowercase().as_str() {
        "mean" => Pooling::Mean,
        "last" => Pooling::Last,
        "cls" => Pooling::Cls,
        "rank" => Pooling::Rank,
        _ => bail!("unknown --pooling {s:?} (mean, last, cls or rank)"),
    })
}

/// One JSON line: a string, or {"text", "id"?, "metadata"?}.
fn parse_line(line: &str, index: usize) -> Result<Doc> {
    let v: Value = serde_json::from_str(line).context("not JSON")?;
    let default_id = index.to_string();
    Ok(match v {
        Value::String(text) => Doc { id: default_id, text, metadata: None },
        Value::Object(m) => {
            let text = match m.get("text") {
                Some(Value::String(t)) => t.clone(),
                _ => bail!("no \"text\" string"),
            };
            let id = match m.get("id") {
                None | Some(Value::Null) => default_id,
                Some(Value::String(s)) => s.clone(),
                Some(Value::Number(n)) => n.to_string(),
                Some(other) => bail!("\"id\" must be a string or a number, not {other}"),
            };
            let metadata = match m.get("metadata") {
                None | Some(Value::Null) => None,
                Some(v) => Some(v.to_string()),
            };
            Doc { id, text, metadata }
        }
        other => bail!("expected a string or an object with \"text\", got {other}"),
    })
}

fn read_docs(a: &Args) -> Result<Vec<Doc>> {
    let docs = match (&a.file, a.text.is_empty()) {
        (Some(_), false) => bail!("give either TEXT arguments or --file, not both"),
        (None, true) => bail!("nothing to embed: give TEXT arguments or --file"),
        (None, false) => a.text.iter().enumerate().map(|(i, t)| Doc { id: i.to_string(), text: t.clone(), metadata: None }).collect(),
        (Some(f), true) => {
            let reader: Box<dyn BufRead> = if f == "-" {
                Box::new(std::io::stdin().lock())
            } else {
                Box::new(std::io::BufReader::new(std::fs::File::open(f).with_context(|| format!("opening {f}"))?))
            };
            let mut docs = vec![];
            for (n, line) in reader.lines().enumerate() {
                let line = line.with_context(|| format!("reading {f}"))?;
                if line.trim().is_empty() {
                    continue;
                }
                docs.push(parse_line(&line, docs.len()).with_context(|| format!("{f}:{}", n + 1))?);
            }
            docs
        }
    };
    if let Some(d) = docs.iter().find(|d| d.text.is_empty()) {
        bail!("text of id {} is empty", d.id);
    }
    let mut seen = std::collections::HashSet::new();
    if let Some(d) = docs.iter().find(|d| !seen.insert(d.id.as_str())) {
        bail!("id {:?} appears twice", d.id);
    }
    Ok(docs)
}

pub fn main(a: Args) -> Result<()> {
    let docs = read_docs(&a)?;
    let task: EmbedTask = match (a.search, a.task.as_str()) {
        (true, "document") => EmbedTask::Query,
        (_, t) => t.parse().map_err(anyhow::Error::msg)?,
    };
    let prefix = match (&a.prefix, a.no_prefix) {
        (Some(p), _) => PrefixMode::Fixed(p.clone()),
        (None, true) => PrefixMode::Off,
        (None, false) => PrefixMode::Auto,
    };
    let pooling = a.pooling.as_deref().map(parse_pooling).transpose()?;
    let embed = EmbedOptions { pooling, normalize: !a.no_normalize, task, prefix, dimensions: a.dimensions };
    if a.batch == 0 {
        bail!("--batch must be at least 1");
    }
    let endpoints = match (&a.flight, &a.dataset) {
        (Some(f), Some(d)) => Some((f.clone(), a.meta.clone().map(Ok).unwrap_or_else(|| default_meta_endpoint(f))?, d.clone())),
        (None, None) if a.meta.is_none() && !a.search => None,
        _ => bail!("--flight and --dataset go together (and --meta / --search need them)"),
    };
    let model = ModelArgs {
        model: a.model.clone(),
        template: Default::default(),
        engine: EngineArgs {
            ctx: a.ctx.clone(),
            cache: CacheArgs { kv: KvTypeArg::default(), batch: a.ubatch, kv_mem: None },
            device: a.device.clone(),
        },
    };
    let Some((data, meta, dataset)) = endpoints else {
        let engine = spawn(&model, a.ubatch)?;
        return print_vectors(&engine, &docs, &embed, a.batch);
    };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(async {
        // connect before loading the model: a wrong address fails fast
        let mut client = LongbowClient::connect(&data, &meta).await.context("connecting to Longbow")?;
        let engine = spawn(&model, a.ubatch)?;
        if a.search {
            search(&engine, &client, &dataset, &docs, &embed, a.k).await
        } else {
            let put = PutOptions { window: a.window, max_retries: a.retries, ..PutOptions::default() };
            let opts = IngestOptions { embed, batch: a.batch, with_text: !a.no_text, put };
            store(&engine, &mut client, &dataset, docs, &opts).await
        }
    })
}

/// The engine for embedding: forwards of up to `ubatch` tokens, with a KV pool that holds a
/// whole forward's texts (an encoder's texts live in the cache only during their forward).
fn spawn(model: &ModelArgs, ubatch: usize) -> Result<EngineHandle> {
    // (an unset context resolves to at least 512 tokens)
    let engine = model.engine_with(|o| o.n_seq = o.n_seq.max(ubatch.div_ceil(if o.n_ctx == 0 { 512 } else { o.n_ctx })))?;
    let opts = ServiceOptions { max_batch_tokens: ubatch.max(1), ..ServiceOptions::default() };
    Ok(crate::common::with_engine!(engine, e => { EngineHandle::spawn(e, opts) }))
}

/// Chunks of --batch texts in flight at once when printing: each is tokenized on its own
/// thread and queued in the engine, whose scheduler packs the queued texts into shared
/// forwards, while earlier chunks are written out.
const CHUNKS_IN_FLIGHT: usize = 4;

/// One output line.
#[derive(serde::Serialize)]
struct VectorLine<'a> {
    id: &'a str,
    vector: &'a [f32],
}

/// Print one JSON line per text, in order, then the rate on stderr (model loading not
/// counted). Tokenizing, the forwards and writing overlap: up to [`CHUNKS_IN_FLIGHT`] chunks
/// are being embedded while the oldest is written.
fn print_vectors(engine: &EngineHandle, docs: &[Doc], opts: &EmbedOptions, batch: usize) -> Result<()> {
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let t0 = Instant::now();
    std::thread::scope(|s| -> Result<()> {
        let mut in_flight = std::collections::VecDeque::new();
        let mut chunks = docs.chunks(batch);
        loop {
            while in_flight.len() < CHUNKS_IN_FLIGHT {
                let Some(chunk) = chunks.next() else { break };
                in_flight.push_back((
                    chunk,
                    s.spawn(move || {
                        let texts: Vec<String> = chunk.iter().map(|d| d.text.clone()).collect();
                        embed_texts_blocking(engine, &texts, opts)
                    }),
                ));
            }
            let Some((chunk, job)) = in_flight.pop_front() else { break };
            let e = job.join().map_err(|_| anyhow::anyhow!("an embedding thread panicked"))??;
            for (d, v) in chunk.iter().zip(e.rows()) {
                serde_json::to_writer(&mut out, &VectorLine { id: &d.id, vector: v })?;
                out.write_all(b"\n")?;
            }
        }
        Ok(())
    })?;
    out.flush()?;
    let secs = t0.elapsed().as_secs_f64();
    eprintln!("embedded {} texts in {secs:.2} s ({:.1} texts/s)", docs.len(), docs.len() as f64 / secs.max(1e-9));
    Ok(())
}

async fn store(engine: &EngineHandle, client: &mut LongbowClient, dataset: &str, docs: Vec<Doc>, opts: &IngestOptions) -> Result<()> {
    let n = docs.len() as u64;
    let bar = indicatif::ProgressBar::new(n);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} rows acknowledged ({per_sec}, eta {eta}) {msg}")
            .expect("valid template"),
    );
    let t0 = Instant::now();
    let mut on_progress = |r: &PutReport| {
        bar.set_position(r.rows_acked);
        if r.slow_downs > 0 || r.reconnects > 0 {
            bar.set_message(format!("slow_down x{}, reconnects {}", r.slow_downs, r.reconnects));
        }
    };
    let r = ingest(engine, client, dataset, docs, opts, &mut on_progress).await;
    bar.finish_and_clear();
    let r = r.with_context(|| format!("storing into dataset {dataset:?} at {}", client.data_uri()))?;
    let secs = t0.elapsed().as_secs_f64();
    eprintln!(
        "stored {} rows in {dataset:?}: {} acknowledged ({} found stored after a lost acknowledgement), {} resent, \
         {} slow_down ({:.1} s backed off), {} reconnects; {:.1} s, {:.1} texts/s",
        r.rows_sent,
        r.rows_acked,
        r.rows_reconciled,
        r.rows_resent,
        r.slow_downs,
        r.backoff.as_secs_f64(),
        r.reconnects,
        secs,
        n as f64 / secs.max(1e-9)
    );
    if r.rows_acked != n {
        bail!("only {} of {n} rows were acknowledged", r.rows_acked);
    }
    Ok(())
}

async fn search(engine: &EngineHandle, client: &LongbowClient, dataset: &str, docs: &[Doc], opts: &EmbedOptions, k: usize) -> Result<()> {
    let texts: Vec<String> = docs.iter().map(|d| d.text.clone()).collect();
    let e = quarrel_engine::embedding::embed_texts(engine, &texts, opts).await?;
    let mut out = std::io::stdout().lock();
    for (d, v) in docs.iter().zip(e.rows()) {
        let hits = client.search(dataset, v, k).await.with_context(|| format!("searching {dataset:?}"))?;
        let hits: Vec<Value> = hits.into_iter().map(|(id, score)| serde_json::json!({ "id": id, "score": score })).collect();
        writeln!(out, "{}", serde_json::json!({ "id": d.id, "text": d.text, "hits": hits }))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_lines() {
        let d = parse_line(r#""plain""#, 3).unwrap();
        assert_eq!((d.id.as_str(), d.text.as_str(), d.metadata), ("3", "plain", None));
        let d = parse_line(r#"{"id": 17, "text": "t", "metadata": {"a": [1]}}"#, 0).unwrap();
        assert_eq!((d.id.as_str(), d.metadata.as_deref()), ("17", Some(r#"{"a":[1]}"#)));
        assert!(parse_line(r#"{"id": "x"}"#, 0).is_err());
        assert!(parse_line("not json", 0).is_err());
        assert!(parse_line(r#"{"text": "t", "id": [1]}"#, 0).is_err());
        assert!(parse_pooling("max").is_err());
    }
}
