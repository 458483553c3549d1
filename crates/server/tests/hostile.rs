//! Hostile clients against the server: slow or missing headers and bodies, idle and surplus
//! connections, huge declared bodies, DNS-rebinding Host headers, CORS-simple content types,
//! rate limits without keys, file paths in model listings, and a shutdown that must not wait
//! forever. The connection-level checks run over real TCP against `quarrel_server::serve`.

mod common;
use axum::body::{to_bytes, Body};
use axum::http::{Request, StatusCode};
use common::key_file;
use quarrel_engine::EngineHandle;
use quarrel_server::{AppState, KeyFile, KeyStore, ModelEntry, ModelLoader, RateLimit, Registry, ServerConfig};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tower::ServiceExt;

/// A catalog without engines: enough for everything here, which never generates.
struct Catalog(Vec<ModelEntry>);

impl ModelLoader for Catalog {
    fn catalog(&self) -> Vec<ModelEntry> {
        self.0.clone()
    }

    fn load(&self, _: &ModelEntry) -> Result<EngineHandle, String> {
        Err("no engines in this test".into())
    }
}

fn state(config: ServerConfig, entries: Vec<ModelEntry>) -> AppState {
    AppState::new(config, Registry::new(Arc::new(Catalog(entries)), 0, false), None).unwrap()
}

type Running = (std::net::SocketAddr, tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<()>);

/// A server on a loopback port; dropping the sender shuts it down.
async fn start(config: ServerConfig) -> Running {
    start_with(state(config, vec![])).await
}

async fn start_with(st: AppState) -> Running {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        quarrel_server::serve(listener, st, async move {
            let _ = rx.await;
        })
        .await
        .unwrap();
    });
    (addr, tx, task)
}

/// Everything the server sends until it closes the connection, or `None` if it is still open
/// after `within`.
async fn read_to_close(s: &mut TcpStream, within: Duration) -> Option<String> {
    let mut out = Vec::new();
    let r = tokio::time::timeout(within, async {
        let mut buf = [0u8; 4096];
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    r.ok().map(|_| String::from_utf8_lossy(&out).into_owned())
}

/// One response on an open connection (headers and a `Content-Length` body).
async fn read_response(s: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let n = s.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed before a whole response: {}", String::from_utf8_lossy(&out));
            out.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&out).to_string();
            if let Some(end) = text.find("\r\n\r\n") {
                let len = text[..end]
                    .lines()
                    .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse::<usize>().unwrap()))
                    .unwrap_or(0);
                if out.len() >= end + 4 + len {
                    return;
                }
            }
        }
    })
    .await
    .expect("no response within 5 s");
    String::from_utf8_lossy(&out).into_owned()
}

const GET_HEALTH: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n";

/// `request` sent on a new connection to `addr`: all the server answers before it closes the
/// connection, within `within` (`None` if it stays open).
async fn send_then_read_to_close(addr: std::net::SocketAddr, request: &[u8], within: Duration) -> Option<String> {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(request).await.unwrap();
    read_to_close(&mut s, within).await
}

#[tokio::test]
async fn declared_body_over_the_limit_is_413_before_reading() {
    let (addr, _stop, _) = start(ServerConfig::default()).await;
    let req =
        b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 1000000000000\r\n\r\n";
    let text = send_then_read_to_close(addr, req, Duration::from_secs(3)).await.expect("the server kept waiting for a body it will refuse");
    assert!(text.starts_with("HTTP/1.1 413"), "{text}");
    assert!(text.contains("body_too_large"), "{text}");
}

#[tokio::test]
async fn unfinished_body_is_408_and_the_connection_closes() {
    let cfg = ServerConfig { body_timeout: Duration::from_millis(300), ..Default::default() };
    let (addr, _stop, _) = start(cfg).await;
    let req =
        b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"prompt\":";
    let text =
        send_then_read_to_close(addr, req, Duration::from_secs(3)).await.expect("an unfinished body was waited for past the body timeout");
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("body_timeout"), "{text}");
}

#[tokio::test]
async fn slow_headers_and_idle_keep_alive_connections_are_closed() {
    let cfg = ServerConfig { header_timeout: Duration::from_millis(300), ..Default::default() };
    let (addr, _stop, _) = start(cfg).await;
    // headers never finished
    let half = send_then_read_to_close(addr, b"GET /healthz HTTP/1.1\r\nHost: loc", Duration::from_secs(3)).await;
    assert!(half.is_some(), "half-sent headers kept the connection open");
    // a connection that sends nothing at all
    let mut s = TcpStream::connect(addr).await.unwrap();
    assert!(read_to_close(&mut s, Duration::from_secs(3)).await.is_some(), "a silent connection stayed open");
    // a keep-alive connection left idle after its response
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(GET_HEALTH).await.unwrap();
    assert!(read_response(&mut s).await.starts_with("HTTP/1.1 200"));
    let t0 = Instant::now();
    assert!(read_to_close(&mut s, Duration::from_secs(3)).await.is_some(), "an idle keep-alive connection stayed open");
    assert!(t0.elapsed() >= Duration::from_millis(200), "closed before the idle timeout");
}

#[tokio::test]
async fn connections_over_the_cap_are_closed_while_open_ones_keep_working() {
    let cfg = ServerConfig { max_connections: 3, ..Default::default() };
    let (addr, _stop, _) = start(cfg).await;
    let mut open = Vec::new();
    for _ in 0..3 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(GET_HEALTH).await.unwrap();
        assert!(read_response(&mut s).await.starts_with("HTTP/1.1 200"));
        open.push(s);
    }
    // the fourth is accepted by the kernel but closed by the server at once
    let mut extra = TcpStream::connect(addr).await.unwrap();
    let _ = extra.write_all(GET_HEALTH).await;
    let text = read_to_close(&mut extra, Duration::from_secs(2)).await.expect("a connection over the cap was left hanging");
    assert!(text.is_empty(), "a connection over the cap was served: {text}");
    // the open ones still work
    open[1].write_all(GET_HEALTH).await.unwrap();
    assert!(read_response(&mut open[1]).await.starts_with("HTTP/1.1 200"));
    // a freed slot takes a new connection
    drop(open.pop());
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(GET_HEALTH).await.unwrap();
    assert!(read_response(&mut s).await.starts_with("HTTP/1.1 200"));
}

#[tokio::test]
async fn shutdown_ends_requests_still_running_at_the_deadline() {
    let cfg = ServerConfig { shutdown_timeout: Duration::from_millis(300), ..Default::default() };
    let (addr, stop, task) = start(cfg).await;
    // a request in flight that would keep the server for the whole body timeout
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(stop);
    let t0 = Instant::now();
    tokio::time::timeout(Duration::from_secs(5), task).await.expect("shutdown waited past its deadline").unwrap();
    assert!(t0.elapsed() >= Duration::from_millis(250), "shutdown did not wait for the request in flight");
}

async fn call(st: &AppState, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> (StatusCode, String) {
    let mut b = Request::builder().method(method).uri(path);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let resp = quarrel_server::routes::router(st.clone()).oneshot(b.body(Body::from(body.to_string())).unwrap()).await.unwrap();
    let status = resp.status();
    (status, String::from_utf8_lossy(&to_bytes(resp.into_body(), 1 << 20).await.unwrap()).into_owned())
}

#[tokio::test]
async fn a_loopback_server_refuses_foreign_host_names() {
    let cfg = ServerConfig { check_host: true, allowed_hosts: vec!["box.lan".into()], ..Default::default() };
    let st = state(cfg, vec![]);
    for h in ["evil.test", "evil.test:8080", "localhost.evil.test:8080", "192.168.1.5:8080"] {
        for p in ["/v1/models", "/", "/ws", "/metrics"] {
            let (s, body) = call(&st, "GET", p, &[("host", h)], "").await;
            assert_eq!(s, StatusCode::FORBIDDEN, "{h} {p}: {body}");
        }
    }
    for h in ["localhost:8080", "127.0.0.1:8080", "[::1]:8080", "box.lan:8080"] {
        let (s, body) = call(&st, "GET", "/v1/models", &[("host", h)], "").await;
        assert_eq!(s, StatusCode::OK, "{h}: {body}");
    }
}

#[tokio::test]
async fn json_routes_refuse_cors_simple_content_types() {
    let st = state(ServerConfig::default(), vec![]);
    let body = r#"{"model": "x", "prompt": "hi"}"#;
    for ct in ["text/plain", "application/x-www-form-urlencoded", ""] {
        let h: &[(&str, &str)] = if ct.is_empty() { &[] } else { &[("content-type", ct)] };
        for p in ["/v1/completions", "/v1/chat/completions", "/api/generate", "/api/models/x/load"] {
            let (s, text) = call(&st, "POST", p, h, body).await;
            assert_eq!(s, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{p} {ct:?}: {text}");
        }
    }
    // what the openai and ollama clients send passes the check (and fails later: no such model)
    for ct in ["application/json", "application/json; charset=utf-8"] {
        let (s, text) = call(&st, "POST", "/v1/completions", &[("content-type", ct)], body).await;
        assert_eq!(s, StatusCode::NOT_FOUND, "{ct}: {text}");
    }
}

#[tokio::test]
async fn rate_limit_without_keys_counts_per_client_ip() {
    let cfg = ServerConfig { rate_per_key: Some(RateLimit { per_minute: 2, burst: 2 }), ..Default::default() };
    let st = state(cfg, vec![]);
    let mut statuses = vec![];
    for _ in 0..3 {
        statuses.push(call(&st, "GET", "/v1/models", &[], "").await.0);
    }
    assert_eq!(statuses, [StatusCode::OK, StatusCode::OK, StatusCode::TOO_MANY_REQUESTS]);
}

#[tokio::test]
async fn model_listings_show_names_not_file_paths() {
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("secret-dir").join("tiny.gguf");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, b"GGUF").unwrap();
    let entry = ModelEntry { name: "tiny".into(), aliases: vec![path.display().to_string(), "tiny-alias".into()], path, size_bytes: 4 };
    let st = state(ServerConfig::default(), vec![entry]);
    for p in ["/api/models", "/api/models/tiny", "/v1/models", "/api/tags"] {
        let (s, body) = call(&st, "GET", p, &[], "").await;
        assert_eq!(s, StatusCode::OK, "{p}: {body}");
        assert!(body.contains("tiny"), "{p}: {body}");
        assert!(!body.contains("secret-dir"), "{p} shows the server's file system: {body}");
    }
    let (_, body) = call(&st, "GET", "/api/models", &[], "").await;
    assert!(body.contains("tiny-alias"), "{body}");
}

/// A minimal WebSocket client over raw TCP (text frames under 126 bytes, which is all these
/// tests send): the upgrade, then masked frames out and unmasked frames in.
async fn ws_open(addr: std::net::SocketAddr, key: Option<&str>) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let auth = key.map(|k| format!("Authorization: Bearer {k}\r\n")).unwrap_or_default();
    let hello = format!(
        "GET /ws HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n{auth}\r\n"
    );
    s.write_all(hello.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut b = [0u8; 1];
        assert_eq!(s.read(&mut b).await.unwrap(), 1, "closed during the upgrade");
        head.push(b[0]);
    }
    assert!(head.starts_with(b"HTTP/1.1 101"), "{}", String::from_utf8_lossy(&head));
    s
}

async fn ws_send(s: &mut TcpStream, text: &str) {
    let mask = [7u8, 1, 9, 3];
    let mut f = vec![0x81, 0x80 | text.len() as u8];
    f.extend_from_slice(&mask);
    f.extend(text.bytes().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    s.write_all(&f).await.unwrap();
}

/// The next frame: (opcode, payload).
async fn ws_recv(s: &mut TcpStream) -> (u8, Vec<u8>) {
    tokio::time::timeout(Duration::from_secs(5), async {
        let mut h = [0u8; 2];
        s.read_exact(&mut h).await.unwrap();
        let len = match h[1] & 0x7f {
            126 => {
                let mut l = [0u8; 2];
                s.read_exact(&mut l).await.unwrap();
                u16::from_be_bytes(l) as usize
            }
            127 => {
                let mut l = [0u8; 8];
                s.read_exact(&mut l).await.unwrap();
                u64::from_be_bytes(l) as usize
            }
            n => n as usize,
        };
        let mut p = vec![0u8; len];
        s.read_exact(&mut p).await.unwrap();
        (h[0] & 0x0f, p)
    })
    .await
    .expect("no WebSocket frame within 5 s")
}

async fn ws_json(s: &mut TcpStream) -> serde_json::Value {
    let (op, p) = ws_recv(s).await;
    assert_eq!(op, 1, "expected a text frame, got opcode {op}: {p:?}");
    serde_json::from_slice(&p).unwrap()
}

#[tokio::test]
async fn a_key_revoked_while_its_websocket_is_open_is_refused_and_closed() {
    let d = tempfile::tempdir().unwrap();
    let (kp, key, id) = key_file(d.path(), "ws");
    let st = AppState::new(ServerConfig::default(), Registry::new(Arc::new(Catalog(vec![])), 0, false), Some(KeyStore::open(&kp).unwrap()))
        .unwrap();
    let (addr, _stop, _) = start_with(st).await;
    let mut ws = ws_open(addr, Some(&key)).await;
    ws_send(&mut ws, r#"{"type":"ping","id":"a"}"#).await;
    assert_eq!(ws_json(&mut ws).await["type"], "pong");
    let mut kf = KeyFile::load(&kp).unwrap();
    kf.revoke(&id).unwrap();
    kf.save(&kp).unwrap();
    // make sure the modification time moves even on coarse clocks
    let later = std::time::SystemTime::now() + Duration::from_secs(2);
    std::fs::File::options().write(true).open(&kp).unwrap().set_modified(later).unwrap();
    ws_send(&mut ws, r#"{"type":"ping","id":"b"}"#).await;
    let m = ws_json(&mut ws).await;
    assert_eq!((m["type"].as_str(), m["payload"]["code"].as_str()), (Some("error"), Some("UNAUTHORIZED")), "{m}");
    let (op, p) = ws_recv(&mut ws).await;
    assert_eq!(op, 8, "expected a close frame");
    assert_eq!(u16::from_be_bytes([p[0], p[1]]), 1008);
}

#[tokio::test]
async fn websocket_messages_count_against_the_rate_limit() {
    // no keys: the per-key limit counts per client IP; the upgrade takes one of the two
    let cfg = ServerConfig { rate_per_key: Some(RateLimit { per_minute: 2, burst: 2 }), ..Default::default() };
    let (addr, _stop, _) = start(cfg).await;
    let mut ws = ws_open(addr, None).await;
    ws_send(&mut ws, r#"{"type":"ping","id":"a"}"#).await;
    assert_eq!(ws_json(&mut ws).await["type"], "pong");
    ws_send(&mut ws, r#"{"type":"ping","id":"b"}"#).await;
    let m = ws_json(&mut ws).await;
    assert_eq!((m["type"].as_str(), m["payload"]["code"].as_str()), (Some("error"), Some("OVERLOADED")), "{m}");
}
