//! `cargo fuzz run ws_protocol`: any sequence of WebSocket frames on `/ws` of a running server
//! (text, binary, ping, close, any bytes in them) ends in protocol replies or a close, never a
//! panic or a hang: after the frames, the same connection answers a `ping` message or has
//! been closed, and a new connection is accepted. Input: frames as (kind byte, length byte,
//! that many bytes).
#![no_main]
mod common;
use common::NoEngines;
use quarrel_server::{AppState, Registry, ServerConfig};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tungstenite::{Bytes, Message};

/// The server, listening on a loopback port for the whole run.
fn server() -> SocketAddr {
    static ADDR: OnceLock<SocketAddr> = OnceLock::new();
    *ADDR.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
            rt.block_on(async move {
                let state = AppState::new(ServerConfig::default(), Registry::new(Arc::new(NoEngines), 0, false), None).unwrap();
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                tx.send(listener.local_addr().unwrap()).unwrap();
                quarrel_server::serve(listener, state, std::future::pending()).await.unwrap();
            });
        });
        rx.recv().unwrap()
    })
}

fn frames(mut data: &[u8]) -> Vec<Message> {
    let mut out = vec![];
    while let [kind, len, rest @ ..] = data {
        let n = (*len as usize).min(rest.len());
        let body = &rest[..n];
        data = &rest[n..];
        out.push(match kind % 4 {
            0 => Message::Text(String::from_utf8_lossy(body).into_owned().into()),
            1 => Message::Binary(Bytes::copy_from_slice(body)),
            2 => Message::Ping(Bytes::copy_from_slice(body)),
            _ => Message::Close(None),
        });
    }
    out
}

/// A WebSocket connection to `/ws`. libFuzzer's own signals can interrupt a blocking read of the
/// handshake (EINTR, which tungstenite does not retry): such a handshake is tried again.
fn connect(addr: SocketAddr) -> tungstenite::WebSocket<TcpStream> {
    for _ in 0..5 {
        let stream = TcpStream::connect(addr).expect("the server accepts a connection");
        stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        match tungstenite::client(format!("ws://{addr}/ws"), stream) {
            Ok((ws, _)) => return ws,
            Err(tungstenite::HandshakeError::Failure(tungstenite::Error::Io(e))) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => panic!("websocket handshake refused: {e}"),
        }
    }
    panic!("websocket handshake interrupted 5 times in a row")
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let addr = server();
    let mut ws = connect(addr);
    for m in frames(data) {
        if ws.send(m).is_err() {
            return; // the server closed the connection: an answer
        }
    }
    if ws.send(Message::Text(r#"{"type":"ping","id":"fuzz-end"}"#.into())).is_err() {
        return;
    }
    loop {
        match ws.read() {
            Ok(Message::Text(t)) if t.contains("fuzz-end") => return,
            Ok(Message::Close(_)) => return,
            Ok(_) => continue,
            Err(tungstenite::Error::Io(e)) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(tungstenite::Error::ConnectionClosed | tungstenite::Error::AlreadyClosed) => return,
            Err(tungstenite::Error::Io(e)) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                panic!("no reply to a ping message within 5 s after {} input bytes", data.len())
            }
            Err(_) => return, // reset or protocol error on a closed connection
        }
    }
});
