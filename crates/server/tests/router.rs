//! The router over real CPU engines on tiny synthetic models (random weights, real shapes):
//! LRU unloading under the memory budget, on-demand loading, 503 + Retry-After when the queue
//! is full, the per-request timeout, auth, and the error shape. No network: requests go
//! through `tower::ServiceExt::oneshot`.

mod common;
use axum::body::{to_bytes, Body};
use axum::http::{Request, StatusCode};
use common::key_file;
use quarrel_cpu::CpuBackend;
use quarrel_engine::{Engine, EngineHandle, EngineOptions, ServiceOptions};
use quarrel_server::{AppState, KeyStore, ModelEntry, ModelLoader, Registry, ServerConfig};
use quarrel_synth::{write_synth, Ftype, Preset, SynthSpec};
use serde_json::{json, Value};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tower::ServiceExt;

struct SynthLoader {
    entries: Vec<ModelEntry>,
    max_queue: usize,
}

impl ModelLoader for SynthLoader {
    fn catalog(&self) -> Vec<ModelEntry> {
        self.entries.clone()
    }

    fn load(&self, e: &ModelEntry) -> Result<EngineHandle, String> {
        let be = CpuBackend::new(1).map_err(|e| e.to_string())?;
        let opts = EngineOptions { n_ctx: 128, n_seq: 2, ..Default::default() };
        let engine = Engine::load(be, &e.path, opts).map_err(|e| e.to_string())?;
        Ok(EngineHandle::spawn(engine, ServiceOptions { max_queue: self.max_queue, ..Default::default() }))
    }
}

fn synth(dir: &Path, name: &str, seed: u64) -> ModelEntry {
    let path = dir.join(format!("{name}.gguf"));
    let spec = SynthSpec::new(*Preset::by_name("tiny").unwrap(), Ftype::from_name("q8_0").unwrap()).seed(seed);
    write_synth(&spec, &path, &mut |_, _| {}).unwrap();
    let size_bytes = std::fs::metadata(&path).unwrap().len();
    ModelEntry { name: name.into(), aliases: vec![format!("{name}-alias")], path, size_bytes }
}

fn state(entries: Vec<ModelEntry>, budget: u64, max_queue: usize, config: ServerConfig, keys: Option<KeyStore>) -> AppState {
    let reg = Registry::new(Arc::new(SynthLoader { entries, max_queue }), budget, true);
    AppState::new(config, reg, keys).unwrap()
}

async fn call(st: &AppState, method: &str, path: &str, body: Option<Value>, key: Option<&str>) -> (StatusCode, Option<String>, Value) {
    let mut b = Request::builder().method(method).uri(path);
    if method == "POST" {
        // as real clients send it (the JSON routes refuse other types)
        b = b.header("content-type", "application/json");
    }
    if let Some(k) = key {
        b = b.header("authorization", format!("Bearer {k}"));
    }
    let req = b.body(body.map_or(Body::empty(), |v| Body::from(v.to_string()))).unwrap();
    let resp = quarrel_server::routes::router(st.clone()).oneshot(req).await.unwrap();
    let status = resp.status();
    let retry = resp.headers().get("retry-after").map(|v| v.to_str().unwrap().to_string());
    let bytes = to_bytes(resp.into_body(), 1 << 24).await.unwrap();
    (status, retry, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

fn loaded(st: &AppState) -> Vec<String> {
    st.registry.loaded().iter().map(|m| m.entry.name.clone()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lru_unloading_and_on_demand_loading() {
    let d = tempfile::tempdir().unwrap();
    let (a, b) = (synth(d.path(), "alpha", 1), synth(d.path(), "beta", 2));
    // measure one loaded model, then allow one and a half
    let probe = state(vec![a.clone()], 0, 64, ServerConfig::default(), None);
    let one = probe.registry.load("alpha").await.unwrap().memory_bytes();
    let st = state(vec![a, b], one * 3 / 2, 64, ServerConfig::default(), None);
    st.registry.load("alpha").await.unwrap();
    assert_eq!(loaded(&st), ["alpha"]);
    st.registry.load("beta-alias").await.unwrap();
    assert_eq!(loaded(&st), ["beta"], "alpha is least recently used and must go");
    // a request naming the unloaded model loads it on demand (ollama-style tag accepted)
    let (s, _, v) =
        call(&st, "POST", "/v1/completions", Some(json!({"model": "alpha:latest", "prompt": "hello", "max_tokens": 3})), None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 3);
    assert_eq!(loaded(&st), ["alpha"]);
    let (s, _, v) = call(&st, "POST", "/v1/completions", Some(json!({"model": "gamma", "prompt": "hello"})), None).await;
    assert_eq!((s, v["error"]["code"].as_str()), (StatusCode::NOT_FOUND, Some("model_not_found")));
    let (s, _, _) = call(&st, "DELETE", "/api/models/alpha/load", None, None).await;
    assert_eq!(s, StatusCode::OK);
    assert!(loaded(&st).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_queue_is_503_with_retry_after() {
    let d = tempfile::tempdir().unwrap();
    let st = state(vec![synth(d.path(), "alpha", 1)], 0, 0, ServerConfig::default(), None);
    let (s, retry, v) =
        call(&st, "POST", "/v1/chat/completions", Some(json!({"model": "alpha", "messages": [{"role": "user", "content": "hi"}]})), None)
            .await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{v}");
    assert_eq!(retry.as_deref(), Some("1"));
    assert_eq!(v["error"]["code"], "overloaded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_timeout_is_504() {
    let d = tempfile::tempdir().unwrap();
    let cfg = ServerConfig { request_timeout: Duration::from_millis(1), ..Default::default() };
    let st = state(vec![synth(d.path(), "alpha", 1)], 0, 64, cfg, None);
    st.registry.load("alpha").await.unwrap();
    let body = json!({"model": "alpha", "prompt": "hello", "max_tokens": 100, "temperature": 0});
    let (s, _, v) = call(&st, "POST", "/v1/completions", Some(body), None).await;
    assert_eq!((s, v["error"]["code"].as_str()), (StatusCode::GATEWAY_TIMEOUT, Some("timeout")), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_gate_the_apis_but_not_the_probes() {
    let d = tempfile::tempdir().unwrap();
    let (kp, key, _) = key_file(d.path(), "test");
    let st = state(vec![synth(d.path(), "alpha", 1)], 0, 64, ServerConfig::default(), Some(KeyStore::open(&kp).unwrap()));
    assert_eq!(call(&st, "GET", "/v1/models", None, None).await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(call(&st, "GET", "/v1/models", None, Some("qk-wrong")).await.0, StatusCode::UNAUTHORIZED);
    let (s, _, v) = call(&st, "GET", "/v1/models", None, Some(&key)).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["data"][0]["id"], "alpha");
    assert_eq!(call(&st, "GET", "/healthz", None, None).await.0, StatusCode::OK);
    // nothing loaded yet: not ready
    assert_eq!(call(&st, "GET", "/readyz", None, None).await.0, StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_show_experts_and_recurrent_state_of_a_hybrid_moe_model() {
    use quarrel_synth::archs::{write_arch_synth, ArchPreset, ArchSynthSpec};
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("nemo.gguf");
    let spec =
        ArchSynthSpec { preset: *ArchPreset::by_name("tiny-nemotron-h-moe").unwrap(), ftype: Ftype::Q8_0, seed: 3, vocab_from: None };
    write_arch_synth(&spec, &path, &mut |_, _| {}).unwrap();
    let size_bytes = std::fs::metadata(&path).unwrap().len();
    let entry = ModelEntry { name: "nemo".into(), aliases: vec![], path, size_bytes };
    let st = state(vec![entry], 0, 64, ServerConfig::default(), None);
    let body = json!({"model": "nemo", "prompt": "hello there", "max_tokens": 4, "temperature": 0});
    let (s, _, v) = call(&st, "POST", "/v1/completions", Some(body), None).await;
    assert_eq!(s, StatusCode::OK, "{v}");

    let req = Request::builder().uri("/metrics").body(Body::empty()).unwrap();
    let resp = quarrel_server::routes::router(st.clone()).oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let text = String::from_utf8(to_bytes(resp.into_body(), 1 << 24).await.unwrap().to_vec()).unwrap();
    let values = |prefix: &str| -> Vec<f64> {
        text.lines().filter(|l| l.starts_with(prefix)).filter_map(|l| l.rsplit(' ').next()?.parse().ok()).collect()
    };
    // every routed token is counted once per selected expert: per MoE layer the counts sum to
    // a multiple of the experts used per token, and the utilizations of a layer sum to 1
    let sel = values("quarrel_expert_selections{");
    assert!(!sel.is_empty() && sel.iter().sum::<f64>() > 0.0, "{text}");
    let util: f64 = values("quarrel_expert_utilization{").iter().sum();
    let moe_layers = text.lines().filter(|l| l.starts_with("quarrel_expert_utilization{") && l.contains("expert=\"0\"")).count();
    assert!(moe_layers > 0 && (util - moe_layers as f64).abs() < 1e-6, "{util} over {moe_layers} layers");
    for op in ["moe_routing", "ssm_conv", "ssm_scan"] {
        let t = values(&format!("quarrel_engine_op_seconds{{model=\"nemo\",op=\"{op}\"}}"));
        assert!(t.len() == 1 && t[0] > 0.0, "{op}: {t:?}");
    }
    let state_bytes = values("quarrel_engine{gauge=\"recurrent_state_bytes\",model=\"nemo\"}");
    assert!(state_bytes.len() == 1 && state_bytes[0] > 0.0, "{text}");
    assert_eq!(values("quarrel_engine_counter{counter=\"ssm_nonfinite\",model=\"nemo\"}"), vec![0.0]);
}
