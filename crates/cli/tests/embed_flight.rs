//! `quarrel embed` end to end with the default model (SmolLM2, env QUARREL_SMOLLM2) and the
//! pyarrow Longbow peer (tests/flight_peer.py): 1,000 texts stored while the peer answers
//! slow_down and cuts the connection once; DoGet gives back every row once, with the ids and
//! the vectors the engine computes for the same texts; k-NN finds each document first;
//! texts embedded alone equal the same texts embedded in a batch.

mod common;
use common::Server;
use quarrel_cpu::CpuBackend;
use quarrel_engine::embedding::{embed_texts_blocking, EmbedOptions};
use quarrel_engine::service::{EngineHandle, ServiceOptions};
use quarrel_engine::{Engine, EngineOptions};
use quarrel_flight::peer::TestPeer;
use quarrel_flight::LongbowClient;
use serde_json::Value;
use std::io::Write;
use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

fn smollm2() -> Option<PathBuf> {
    match std::env::var_os("QUARREL_SMOLLM2") {
        Some(p) => Some(PathBuf::from(p)),
        None => {
            eprintln!("QUARREL_SMOLLM2 not set: skipping (scripts/test.sh sets it)");
            None
        }
    }
}

/// 1,000 distinct short sentences (6-8 tokens each).
fn texts() -> Vec<String> {
    let subj = [
        "The cat",
        "A dog",
        "My neighbour",
        "The old sailor",
        "A small robot",
        "The teacher",
        "Our team",
        "The river",
        "A red bird",
        "The engine",
    ];
    let verb = ["reads", "paints", "watches", "builds", "finds", "carries", "sings about", "repairs", "follows", "counts"];
    let obj =
        ["a map", "the stars", "two boats", "green apples", "a letter", "the bridge", "old coins", "a kite", "the garden", "warm bread"];
    (0..1000).map(|i| format!("{} {} {}.", subj[i % 10], verb[(i / 10) % 10], obj[i / 100])).collect()
}

fn engine(path: &std::path::Path) -> EngineHandle {
    let e = Engine::load(CpuBackend::new(0).unwrap(), path, EngineOptions::default()).unwrap();
    EngineHandle::spawn(e, ServiceOptions::default())
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let n = |v: &[f32]| v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (n(a) * n(b))
}

async fn peer_stats(c: &LongbowClient) -> Value {
    serde_json::from_slice(&c.action("peer.stats", "").await.unwrap()[0]).unwrap()
}

#[test]
fn embed_1000_texts_into_longbow_through_slow_down_and_a_dropped_connection() {
    let Some(model) = smollm2() else { return };
    let texts = texts();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("texts.jsonl");
    let mut f = std::fs::File::create(&file).unwrap();
    for (i, t) in texts.iter().enumerate() {
        writeln!(f, "{}", serde_json::json!({ "id": format!("doc-{i}"), "text": t, "metadata": { "n": i } })).unwrap();
    }
    drop(f);
    let peer = TestPeer::start().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = rt.block_on(LongbowClient::connect(&peer.data, &peer.meta)).unwrap();
    // 16 batches of 64: slow_down on the first 3 acknowledgements, the connection cut
    // after the 9th batch is stored (before its acknowledgement)
    rt.block_on(client.action("peer.slow_down", r#"{"batches": 3}"#)).unwrap();
    rt.block_on(client.action("peer.drop_after", r#"{"batches": 9}"#)).unwrap();

    let t0 = Instant::now();
    let bin = env!("CARGO_BIN_EXE_quarrel");
    let m = model.to_str().unwrap();
    let f = file.to_str().unwrap();
    let out = Command::new(bin)
        .args(["embed", "-m", m, "--file", f, "--flight", &peer.data, "--meta", &peer.meta, "--dataset", "docs", "--batch", "64"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    // the status too: a run that died of a signal prints nothing of its own
    assert!(out.status.success(), "quarrel embed failed ({}): {stderr}", out.status);
    eprintln!("quarrel embed of 1000 texts into the peer: {:.1} s\n{stderr}", t0.elapsed().as_secs_f64());
    assert!(stderr.contains("stored 1000 rows") && stderr.contains("3 slow_down"), "{stderr}");

    // the peer holds every row exactly once
    let stats = rt.block_on(peer_stats(&client));
    assert_eq!(stats["drops"], 1, "{stats}");
    assert!(stats["puts"].as_u64().unwrap() >= 2, "no reconnect happened: {stats}");
    assert_eq!(stats["datasets"]["docs"]["rows"], 1000, "{stats}");
    assert_eq!(stats["datasets"]["docs"]["duplicate_ids"], 0, "{stats}");
    assert_eq!(rt.block_on(client.total_records("docs")).unwrap(), Some(1000));

    // ids and vectors equal the engine's for the same texts (computed here in one call, so
    // packed into different forwards than the CLI's batches of 64)
    let got = rt.block_on(client.read_vectors("docs", None)).unwrap();
    let want_ids: Vec<String> = (0..1000).map(|i| format!("doc-{i}")).collect();
    assert_eq!(got.ids, want_ids);
    let h = engine(&model);
    let opts = EmbedOptions { normalize: true, ..Default::default() };
    let t1 = Instant::now();
    let reference = embed_texts_blocking(&h, &texts, &opts).unwrap();
    eprintln!("reference embeddings in-process: {:.1} s", t1.elapsed().as_secs_f64());
    assert_eq!(got.dim, reference.dim);
    assert_eq!(got.dim, 576);
    let differing = (0..1000).filter(|&i| got.row(i).iter().zip(reference.row(i)).any(|(a, b)| a.to_bits() != b.to_bits())).count();
    assert_eq!(differing, 0, "{differing} of 1000 stored vectors differ from the engine's");

    // ... and equal what `quarrel serve`'s /v1/embeddings answers for the same texts
    let mut server = Server::start(&["-m", m], dir.path());
    let t2 = Instant::now();
    let (status, r) = server.post("/v1/embeddings", &serde_json::json!({ "input": texts }), None);
    assert_eq!(status, 200, "{r}");
    eprintln!("/v1/embeddings of 1000 texts: {:.1} s", t2.elapsed().as_secs_f64());
    let data = r["data"].as_array().unwrap();
    assert_eq!(data.len(), 1000);
    let mut http_differing = 0;
    for (i, d) in data.iter().enumerate() {
        assert_eq!(d["index"], i);
        let v: Vec<f32> = d["embedding"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect();
        assert_eq!(v.len(), got.dim);
        http_differing += usize::from(v.iter().zip(got.row(i)).any(|(a, b)| a.to_bits() != b.to_bits()));
    }
    assert_eq!(http_differing, 0, "{http_differing} of 1000 stored vectors differ from /v1/embeddings'");
    drop(server);

    // k-NN: a document's text embedded as a query finds that document first, through the
    // CLI's --search and through the client
    let probes = [0usize, 137, 512, 999];
    let ptexts: Vec<&str> = probes.iter().map(|&i| texts[i].as_str()).collect();
    let mut args = vec!["embed", "-m", m, "--flight", &peer.data, "--meta", &peer.meta, "--dataset", "docs", "--search", "-k", "3"];
    args.extend(&ptexts);
    let out = Command::new(bin).args(&args).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), probes.len());
    for (l, &i) in lines.iter().zip(&probes) {
        assert_eq!(l["hits"][0]["id"], format!("doc-{i}"), "{l}");
        assert!(l["hits"][0]["score"].as_f64().unwrap() > 0.9999, "{l}");
        assert_eq!(l["hits"].as_array().unwrap().len(), 3);
    }
    for &i in &probes {
        let hits = rt.block_on(client.search("docs", reference.row(i), 1)).unwrap();
        assert_eq!(hits[0].0, format!("doc-{i}"));
    }

    // the same texts alone equal them in the batch
    for i in [3usize, 250, 641, 998] {
        let alone = embed_texts_blocking(&h, std::slice::from_ref(&texts[i]), &opts).unwrap();
        let c = cosine(alone.row(0), reference.row(i));
        assert!(c >= 0.9999, "text {i}: cosine {c} alone vs batched");
    }
}

#[test]
fn embed_prints_json_lines_and_rejects_bad_input() {
    let Some(model) = smollm2() else { return };
    let m = model.to_str().unwrap();
    let bin = env!("CARGO_BIN_EXE_quarrel");
    let out = Command::new(bin).args(["embed", "-m", m, "--batch", "1", "first text", "second text"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[1]["id"], "1");
    let v: Vec<f32> = lines[0]["vector"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect();
    assert_eq!(v.len(), 576);
    assert!((v.iter().map(|x| x * x).sum::<f32>() - 1.0).abs() < 1e-4);
    // the same texts batched together: the same vectors
    let both = Command::new(bin).args(["embed", "-m", m, "first text", "second text"]).output().unwrap();
    assert_eq!(both.stdout, out.stdout);
    // many chunks in flight at once: the lines come in input order, with the same vectors
    let texts: Vec<String> = (0..11).map(|i| format!("text number {i} {}", "word ".repeat(i))).collect();
    let run = |batch: &str| {
        let mut args = vec!["embed", "-m", m, "--batch", batch];
        args.extend(texts.iter().map(String::as_str));
        let o = Command::new(bin).args(&args).output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        o.stdout
    };
    let (small, whole) = (run("2"), run("11"));
    assert_eq!(small, whole);
    let ids: Vec<String> = String::from_utf8_lossy(&small)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids, (0..11).map(|i| i.to_string()).collect::<Vec<_>>());
    for bad in [
        vec!["embed", "-m", m],
        vec!["embed", "-m", m, "--flight", "127.0.0.1:1", "x"],
        vec!["embed", "-m", m, "--pooling", "max", "x"],
        vec!["embed", "-m", m, "--flight", "127.0.0.1:1", "--dataset", "d", "x"],
    ] {
        let o = Command::new(bin).args(&bad).output().unwrap();
        let e = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && e.contains("error:") && !e.contains("panicked"), "{bad:?}: {e}");
    }
}
