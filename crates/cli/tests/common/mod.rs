//! `quarrel serve` as the end-to-end tests drive it: started on a free loopback port, asked
//! over plain HTTP/1.1, killed on drop.
#![allow(dead_code)] // each test file uses what it needs

use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// `quarrel serve` on a free loopback port; killed on drop.
pub struct Server {
    pub child: Child,
    pub addr: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// `quarrel serve --port 0 --log-format text <args>` with `QUARREL_HOME` at `home`,
    /// once it says where it listens.
    pub fn start(args: &[&str], home: &Path) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_quarrel"))
            .args(["serve", "--port", "0", "--log-format", "text"])
            .args(args)
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

    /// POST a JSON body (waiting at most `read_timeout` for each read of the answer, or
    /// without limit): the status code and the JSON answer.
    pub fn post(&mut self, path: &str, body: &Value, read_timeout: Option<Duration>) -> (u16, Value) {
        let mut s = std::net::TcpStream::connect(&self.addr).unwrap_or_else(|e| {
            panic!("connecting to the server: {e} (exit status: {:?})", self.child.try_wait());
        });
        s.set_read_timeout(read_timeout).unwrap();
        let b = body.to_string();
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            self.addr,
            b.len()
        );
        s.write_all(head.as_bytes()).unwrap();
        s.write_all(b.as_bytes()).unwrap();
        let mut resp = vec![];
        let _ = s.read_to_end(&mut resp);
        let Some(split) = resp.windows(4).position(|w| w == b"\r\n\r\n") else {
            panic!("no HTTP answer ({} bytes; exit status: {:?})", resp.len(), self.child.try_wait());
        };
        let head = String::from_utf8_lossy(&resp[..split]).to_ascii_lowercase();
        let status: u16 = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).expect("status code");
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
        (status, serde_json::from_slice(&body).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&body))))
    }
}
