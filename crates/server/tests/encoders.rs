//! Encoder models over HTTP, on real CPU engines with tiny synthetic models: `/v1/rerank` with
//! a BERT reranker (scores equal the engine's own, best first, `top_n`, documents returned on
//! request, TEI's shape for `texts`), `dimensions` on `/v1/embeddings` and ollama `/api/embed`
//! (truncated, unit length, the first values' direction kept), and the clear errors: an
//! embedding model asked to rerank, a reranker asked for embeddings, dimensions out of range.

use axum::body::{to_bytes, Body};
use axum::http::{Request, StatusCode};
use quarrel_cpu::CpuBackend;
use quarrel_engine::{Engine, EngineHandle, EngineOptions, Pooling, ServiceOptions};
use quarrel_server::{AppState, ModelEntry, ModelLoader, Registry, ServerConfig};
use quarrel_synth::archs::{ArchPreset, ArchSynthSpec};
use quarrel_synth::Ftype;
use serde_json::{json, Value};
use std::path::Path;
use std::sync::Arc;
use tower::ServiceExt;

struct Loader(Vec<ModelEntry>);

impl ModelLoader for Loader {
    fn catalog(&self) -> Vec<ModelEntry> {
        self.0.clone()
    }

    fn load(&self, e: &ModelEntry) -> Result<EngineHandle, String> {
        Ok(EngineHandle::spawn(engine(&e.path)?, ServiceOptions::default()))
    }
}

fn engine(path: &Path) -> Result<Engine<CpuBackend>, String> {
    let be = CpuBackend::new(1).map_err(|e| e.to_string())?;
    Engine::load(be, path, EngineOptions { n_ctx: 128, n_seq: 4, ..Default::default() }).map_err(|e| e.to_string())
}

fn entry(dir: &Path, preset: &str, name: &str) -> ModelEntry {
    let spec = ArchSynthSpec { preset: *ArchPreset::by_name(preset).unwrap(), ftype: Ftype::F32, seed: 7, vocab_from: None };
    let path = spec.write_into(dir).unwrap();
    let size_bytes = std::fs::metadata(&path).unwrap().len();
    ModelEntry { name: name.into(), aliases: vec![], path, size_bytes }
}

async fn call(st: &AppState, path: &str, body: Value) -> (StatusCode, Value) {
    let req =
        Request::builder().method("POST").uri(path).header("content-type", "application/json").body(Body::from(body.to_string())).unwrap();
    let resp = quarrel_server::routes::router(st.clone()).oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = to_bytes(resp.into_body(), 1 << 24).await.unwrap();
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rerank_and_dimensions_over_http() {
    let d = tempfile::tempdir().unwrap();
    let (rr, emb) = (entry(d.path(), "tiny-bert-rerank", "ranker"), entry(d.path(), "tiny-nomic-bert", "embedder"));
    let rr_path = rr.path.clone();
    let st = AppState::new(ServerConfig::default(), Registry::new(Arc::new(Loader(vec![rr, emb])), 0, true), None).unwrap();
    let docs = ["the first document", "a second, longer document about something else", "third", "x y z"];
    let query = "what is the first document about?";

    // the engine's own scores for the pairs
    let direct = EngineHandle::spawn(engine(&rr_path).unwrap(), ServiceOptions::default());
    let ids = direct.rerank_inputs(query, &docs.map(String::from)).unwrap();
    let want = direct.embed_tokens(ids, Pooling::Rank, false, None).await.unwrap();
    let want: Vec<f32> = want.rows().map(|r| r[0]).collect();

    let (s, v) = call(&st, "/v1/rerank", json!({"model": "ranker", "query": query, "documents": docs})).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), docs.len());
    let scores: Vec<f32> = results.iter().map(|r| r["relevance_score"].as_f64().unwrap() as f32).collect();
    assert!(scores.windows(2).all(|w| w[0] >= w[1]), "not best first: {scores:?}");
    for r in results {
        let i = r["index"].as_u64().unwrap() as usize;
        assert!((r["relevance_score"].as_f64().unwrap() as f32 - want[i]).abs() < 1e-6, "document {i}: {r} vs {}", want[i]);
        assert!(r.get("document").is_none());
    }
    assert!(v["usage"]["prompt_tokens"].as_u64().unwrap() > 0);

    // top_n, documents returned, Cohere's structured documents, the other route names
    let body = json!({"model": "ranker", "query": query, "documents": [{"text": docs[0]}, {"text": docs[1]}, {"text": docs[2]}], "top_n": 2, "return_documents": true});
    let (s, v) = call(&st, "/rerank", body).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 2);
    for r in results {
        assert_eq!(r["document"]["text"], docs[r["index"].as_u64().unwrap() as usize]);
    }
    // TEI's shape
    let (s, v) = call(&st, "/v1/reranking", json!({"model": "ranker", "query": query, "texts": docs, "return_text": true})).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let list = v.as_array().unwrap();
    assert_eq!(list.len(), docs.len());
    assert!(list.iter().all(|r| r["score"].is_f64() && r["text"].is_string()));

    // the wrong model for the route, and bad bodies: 400 with a message
    let (s, v) = call(&st, "/v1/rerank", json!({"model": "embedder", "query": query, "documents": docs})).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("not a reranking model"), "{v}");
    let (s, v) = call(&st, "/v1/embeddings", json!({"model": "ranker", "input": "text"})).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("/v1/rerank"), "{v}");
    for body in [json!({"model": "ranker", "query": query, "documents": []}), json!({"model": "ranker", "query": "", "documents": docs})] {
        let (s, v) = call(&st, "/v1/rerank", body).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    }

    // matryoshka dimensions: the first values of the full vector, normalized again
    let (s, full) = call(&st, "/v1/embeddings", json!({"model": "embedder", "input": ["one text", "another text"]})).await;
    assert_eq!(s, StatusCode::OK, "{full}");
    let (s, cut) = call(&st, "/v1/embeddings", json!({"model": "embedder", "input": ["one text", "another text"], "dimensions": 64})).await;
    assert_eq!(s, StatusCode::OK, "{cut}");
    for i in 0..2 {
        let f: Vec<f64> = full["data"][i]["embedding"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
        let c: Vec<f64> = cut["data"][i]["embedding"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
        assert_eq!(c.len(), 64);
        let norm = c.iter().map(|x| x * x).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "norm {norm}");
        let fnorm = f[..64].iter().map(|x| x * x).sum::<f64>().sqrt();
        for (a, b) in c.iter().zip(&f[..64]) {
            assert!((a - b / fnorm).abs() < 1e-5, "{a} vs {}", b / fnorm);
        }
    }
    let (s, v) = call(&st, "/api/embed", json!({"model": "embedder", "input": "one text", "dimensions": 32})).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["embeddings"][0].as_array().unwrap().len(), 32);
    for bad in [0, 100_000] {
        let (s, v) = call(&st, "/v1/embeddings", json!({"model": "embedder", "input": "one text", "dimensions": bad})).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "dimensions {bad}: {v}");
    }
}
