//! `quarrel embed` end to end with the default model (SmolLM2, env QUARREL_SMOLLM2) and the
//! pyarrow Longbow peer (tests/flight_peer.py): 1,000 texts stored while the peer answers
//! slow_down and cuts the connection once; DoGet gives back every row once, with the ids and
//! the vectors the engine computes for the same texts; k-NN finds each document first;
//! texts embedded alone equal the same texts embedded in a batch.

use quarrel_cpu::CpuBackend;
use quarrel_engine::embedding::{embed_texts_blocking, EmbedOptions};
use quarrel_engine::service::{EngineHandle, ServiceOptions};
use quarrel_engine::{Engine, EngineOptions};
use quarrel_flight::peer::TestPeer;
use quarrel_flight::LongbowClient;
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

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

/// `quarrel serve` on a free loopback port; stopped on drop.
struct Server {
    child: Child,
    addr: String,
}

impl Server {
    fn start(model: &str, home: &std::path::Path) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_quarrel"))
            .args(["serve", "-m", model, "--port", "0", "--log-format", "text"])
            .env("QUARREL_HOME", home)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let err = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                if let Some(a) = line.split("listening on http://").nth(1) {
                    let _ = tx.send(a.trim().to_string());
                }
            }
        });
        let addr = rx.recv_timeout(Duration::from_secs(120)).expect("quarrel serve did not start");
        Server { child, addr }
    }

    /// POST a JSON body; the JSON response (status 200 expected).
    fn post(&self, path: &str, body: &Value) -> Value {
        let mut s = std::net::TcpStream::connect(&self.addr).unwrap();
        let b = body.to_string();
        write!(
            s,
            "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{b}",
            self.addr,
            b.len()
        )
        .unwrap();
        let mut resp = vec![];
        s.read_to_end(&mut resp).unwrap();
        let split = resp.windows(4).position(|w| w == b"\r\n\r\n").expect("HTTP header end");
        let head = String::from_utf8_lossy(&resp[..split]).to_ascii_lowercase();
        assert!(head.starts_with("http/1.1 200"), "{head}\n{}", String::from_utf8_lossy(&resp[split..]));
        let mut body = resp[split + 4..].to_vec();
        if head.contains("transfer-encoding: chunked") {
            let (mut out, mut rest) = (vec![], &body[..]);
            loop {
                let eol = rest.windows(2).position(|w| w == b"\r\n").unwrap();
                let n = usize::from_str_radix(std::str::from_utf8(&rest[..eol]).unwrap().trim(), 16).unwrap();
                if n == 0 {
                    break;
                }
                out.extend_from_slice(&rest[eol + 2..eol + 2 + n]);
                rest = &rest[eol + 4 + n..];
            }
            body = out;
        }
        serde_json::from_slice(&body).unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
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
    let server = Server::start(m, dir.path());
    let t2 = Instant::now();
    let r = server.post("/v1/embeddings", &serde_json::json!({ "input": texts }));
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
