//! The load-test client against a network peer that misbehaves on purpose: a raw HTTP/1.1
//! server on a loopback port that streams fake OpenAI SSE (`/v1/chat/completions`) or ollama
//! NDJSON (`/api/chat`) answers and, by mode, closes kept-alive connections under the next
//! request, answers 500, cuts a stream short or never answers. Checks what counts as a retry
//! and what as an error, and what a sweep writes (JSON, SVG).

use quarrel_loadtest::{run, sweep, LoadConfig, Protocol, Report};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Content events per answer.
const TOKENS: usize = 4;
const GAP: Duration = Duration::from_millis(2);

#[derive(Clone, Copy, Debug)]
enum Mode {
    /// Answer every request, keeping the connection open.
    KeepAlive,
    /// Answer the first request of a connection; read the second and close (FIN) without a byte
    /// of answer and without having said `Connection: close`.
    DropSecond,
    /// As `DropSecond`, but reset the connection (RST).
    ResetSecond,
    /// Close every connection once its first request is read, before answering.
    DropAll,
    /// Answer 500 to everything.
    Status500,
    /// Send the head and one event, then close.
    CutStream,
    /// Read the request and never answer.
    Stall,
}

struct Peer {
    url: String,
    /// Requests read and then left unanswered by closing the connection.
    dropped: Arc<AtomicUsize>,
}

async fn peer(mode: Mode) -> Peer {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let dropped = Arc::new(AtomicUsize::new(0));
    let d = dropped.clone();
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            tokio::spawn(connection(sock, mode, d.clone()));
        }
    });
    Peer { url, dropped }
}

/// Read one request (head and `Content-Length` body) off `sock`; its path, or None at the end
/// of the connection.
async fn read_request(sock: &mut TcpStream, buf: &mut Vec<u8>) -> Option<String> {
    loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..i]).to_ascii_lowercase();
            let len: usize = head.lines().find_map(|l| l.strip_prefix("content-length:")).map(|v| v.trim().parse().unwrap()).unwrap_or(0);
            if buf.len() >= i + 4 + len {
                let path = head.split_whitespace().nth(1).unwrap_or("").to_string();
                buf.drain(..i + 4 + len);
                return Some(path);
            }
        }
        let mut chunk = [0u8; 8192];
        match sock.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

async fn chunk(sock: &mut TcpStream, data: &str) -> std::io::Result<()> {
    sock.write_all(format!("{:x}\r\n{data}\r\n", data.len()).as_bytes()).await?;
    sock.flush().await
}

/// A whole streamed answer in chunked encoding: TOKENS content events GAP apart, the final event
/// (SSE: with usage, then `[DONE]`; NDJSON: `done` without a count), the last chunk.
async fn answer(sock: &mut TcpStream, path: &str, events: usize) -> std::io::Result<()> {
    let sse = path == "/v1/chat/completions";
    let kind = if sse { "text/event-stream" } else { "application/x-ndjson" };
    sock.write_all(format!("HTTP/1.1 200 OK\r\ncontent-type: {kind}\r\ntransfer-encoding: chunked\r\n\r\n").as_bytes()).await?;
    for i in 0..events {
        tokio::time::sleep(GAP).await;
        let ev = if sse {
            format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"t{i} \"}},\"finish_reason\":null}}]}}\n\n")
        } else {
            format!("{{\"message\":{{\"role\":\"assistant\",\"content\":\"t{i} \"}},\"done\":false}}\n")
        };
        chunk(sock, &ev).await?;
    }
    if events < TOKENS {
        return Ok(());
    }
    let end = if sse {
        format!(
            "data: {{\"choices\":[{{\"index\":0,\"delta\":{{}},\"finish_reason\":\"stop\"}}]}}\n\n\
             data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":9,\"completion_tokens\":{TOKENS}}}}}\n\ndata: [DONE]\n\n"
        )
    } else {
        "{\"message\":{\"role\":\"assistant\",\"content\":\"\"},\"done\":true}\n".to_string()
    };
    chunk(sock, &end).await?;
    sock.write_all(b"0\r\n\r\n").await?;
    sock.flush().await
}

async fn connection(mut sock: TcpStream, mode: Mode, dropped: Arc<AtomicUsize>) {
    sock.set_nodelay(true).unwrap();
    let mut buf = vec![];
    let mut served = 0;
    while let Some(path) = read_request(&mut sock, &mut buf).await {
        let r = match mode {
            Mode::DropSecond | Mode::ResetSecond if served == 1 => {
                if let Mode::ResetSecond = mode {
                    sock.set_zero_linger().unwrap();
                }
                dropped.fetch_add(1, Ordering::Relaxed);
                return;
            }
            Mode::DropAll => {
                dropped.fetch_add(1, Ordering::Relaxed);
                return;
            }
            Mode::KeepAlive | Mode::DropSecond | Mode::ResetSecond => answer(&mut sock, &path, TOKENS).await,
            Mode::Status500 => sock.write_all(b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\n\r\n").await,
            Mode::CutStream => {
                let _ = answer(&mut sock, &path, 1).await;
                return;
            }
            Mode::Stall => {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                return;
            }
        };
        if r.is_err() {
            return;
        }
        served += 1;
    }
}

fn config(url: &str, protocol: Protocol, clients: usize, requests: usize) -> LoadConfig {
    LoadConfig { url: url.into(), protocol, clients, requests: Some(requests), prompt: "hi".into(), ..Default::default() }
}

fn assert_all_complete(r: &Report, requests: usize) {
    assert_eq!((r.requests, r.complete, r.errors, r.incomplete), (requests, requests, 0, 0), "{}", r.table());
    assert_eq!(r.generated_tokens, requests * TOKENS, "{}", r.table());
    assert!(r.ttft.p50_ms > 0.0, "{}", r.table());
    // the events come GAP apart, and every answer has TOKENS - 1 gaps
    assert!(r.itl.p50_ms >= GAP.as_secs_f64() * 1e3 * 0.9, "{}", r.table());
    assert!(r.itl.p99_ms >= r.itl.p50_ms && r.itl.max_ms >= r.itl.p99_ms, "{}", r.table());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_alive_connection_closed_under_a_request_is_retried_not_an_error() {
    for (mode, protocol) in [(Mode::DropSecond, Protocol::Sse), (Mode::ResetSecond, Protocol::Sse), (Mode::DropSecond, Protocol::Ndjson)] {
        let p = peer(mode).await;
        let r = run(config(&p.url, protocol, 4, 24)).await.unwrap();
        assert_all_complete(&r, 24);
        assert!(r.retries > 0, "{mode:?} {protocol:?}: {}", r.table());
        // every request the peer dropped was sent again, and only those
        assert_eq!(r.retries, p.dropped.load(Ordering::Relaxed), "{mode:?} {protocol:?}: {}", r.table());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_keeps_connections_needs_no_retry() {
    let p = peer(Mode::KeepAlive).await;
    let r = run(config(&p.url, Protocol::Sse, 3, 12)).await.unwrap();
    assert_all_complete(&r, 12);
    assert_eq!(r.retries, 0, "{}", r.table());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_500_counts_as_errors_not_retries() {
    let p = peer(Mode::Status500).await;
    let r = run(config(&p.url, Protocol::Sse, 2, 6)).await.unwrap();
    assert_eq!((r.requests, r.complete, r.errors, r.retries), (6, 0, 6, 0), "{}", r.table());
    assert_eq!(r.errors_by_kind.get("HTTP 500"), Some(&6), "{}", r.table());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cut_after_data_is_an_error_not_a_retry() {
    let p = peer(Mode::CutStream).await;
    let r = run(config(&p.url, Protocol::Sse, 2, 6)).await.unwrap();
    assert_eq!((r.requests, r.complete, r.errors, r.retries), (6, 0, 6, 0), "{}", r.table());
    assert!(r.errors_by_kind.keys().all(|k| k.starts_with("stream: ")), "{}", r.table());
    // the first token did arrive
    assert!(r.ttft.p50_ms > 0.0, "{}", r.table());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_never_answers_is_retried_once_then_an_error() {
    let p = peer(Mode::DropAll).await;
    let r = run(config(&p.url, Protocol::Sse, 2, 6)).await.unwrap();
    assert_eq!((r.requests, r.complete, r.errors, r.retries), (6, 0, 6, 6), "{}", r.table());
    assert_eq!(p.dropped.load(Ordering::Relaxed), 12);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_is_an_error_not_a_retry() {
    let p = peer(Mode::Stall).await;
    let cfg = LoadConfig { timeout: Some(Duration::from_millis(200)), ..config(&p.url, Protocol::Sse, 2, 2) };
    let r = run(cfg).await.unwrap();
    assert_eq!((r.requests, r.errors, r.retries), (2, 2, 0), "{}", r.table());
    assert_eq!(r.errors_by_kind.get("timeout"), Some(&2), "{}", r.table());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_writes_a_json_entry_per_point_and_an_svg_plot() {
    let p = peer(Mode::KeepAlive).await;
    let points = [1, 2, 4];
    let mut rows = vec![];
    let s = sweep(config(&p.url, Protocol::Sse, 99, 8), &points, Duration::ZERO, |r| rows.push(r.clients)).await.unwrap();
    assert_eq!(rows, points);

    let dir = tempfile::tempdir().unwrap();
    let json_path = dir.path().join("sweep.json");
    std::fs::write(&json_path, serde_json::to_string_pretty(&s).unwrap()).unwrap();
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
    let entries = v["points"].as_array().unwrap();
    assert_eq!(entries.len(), points.len());
    for (e, c) in entries.iter().zip(points) {
        assert_eq!((e["clients"].as_u64(), e["requests"].as_u64(), e["errors"].as_u64()), (Some(c as u64), Some(8), Some(0)), "{e}");
        assert!(e["generated_tokens_per_s"].as_f64().unwrap() > 0.0 && e["itl"]["p99_ms"].as_f64().unwrap() > 0.0, "{e}");
    }

    let svg_path = dir.path().join("sweep.svg");
    quarrel_loadtest::plot::write_svg(&s, &svg_path).unwrap();
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    assert!(svg.starts_with("<svg") || svg.starts_with("<?xml"), "{}", &svg[..svg.len().min(200)]);
    assert!(svg.trim_end().ends_with("</svg>"));
    for label in ["generated tokens/s", "TTFT p50", "TTFT p95", "TTFT p99", "ITL p50", "ITL p95", "ITL p99", "clients"] {
        assert!(svg.contains(label), "no {label:?} in the plot");
    }
    assert!(svg.contains("<polyline") || svg.contains("<path"), "no lines in the plot");
    let table = s.table();
    assert_eq!(table.lines().filter(|l| l.starts_with("| ")).count(), 1 + points.len(), "{table}");
}
