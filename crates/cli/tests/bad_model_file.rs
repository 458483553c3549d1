//! `quarrel serve --models-dir` with a corrupt model file beside a good one: a request for
//! the bad file gets a JSON error that names the bad key (and no server path), the process
//! keeps running, and the good model keeps answering. A header with a 2^40 `block_count`
//! once aborted the whole process on the allocation its loader sized from it.

use quarrel_gguf::{Gguf, GgufWriter, Value};
use quarrel_synth::{write_synth, Ftype, Preset, SynthSpec};
use serde_json::{json, Value as Json};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A copy of the model at `src` with `key` set to `v`, tensors kept.
fn rewrite(src: &Path, dst: &Path, key: &str, v: Value) {
    let g = Gguf::open(src).unwrap();
    let mut w = GgufWriter::new();
    for (k, val) in g.metadata() {
        w.set(k, if k == key { v.clone() } else { val.clone() });
    }
    let mut data = vec![];
    for t in g.tensors() {
        w.add_tensor(&t.name, &t.dims, t.ty).unwrap();
        data.push(g.tensor(&t.name).unwrap().1.to_vec());
    }
    let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    std::fs::write(dst, w.to_bytes(&refs).unwrap()).unwrap();
}

/// `quarrel serve` on a free loopback port; killed on drop.
struct Server {
    child: Child,
    addr: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    fn start(args: &[&str], home: &Path) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_quarrel"))
            .args(["serve", "--port", "0", "-t", "1", "--log-format", "text"])
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

    /// POST a JSON body: the status code and the JSON answer.
    fn post(&mut self, path: &str, body: &Json) -> (u16, Json) {
        let mut s = std::net::TcpStream::connect(&self.addr).unwrap_or_else(|e| {
            panic!("connecting to the server: {e} (exit status: {:?})", self.child.try_wait());
        });
        s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
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

    fn complete(&mut self, model: &str) -> (u16, Json) {
        self.post("/v1/completions", &json!({"model": model, "prompt": "hello", "max_tokens": 2, "temperature": 0}))
    }
}

#[test]
fn a_bad_model_file_is_an_error_for_its_requests_only() {
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("models");
    std::fs::create_dir(&models).unwrap();
    let good = models.join("good.gguf");
    let spec = SynthSpec::new(*Preset::by_name("tiny").unwrap(), Ftype::from_name("q8_0").unwrap()).seed(3);
    write_synth(&spec, &good, &mut |_, _| {}).unwrap();
    let arch = Gguf::open(&good).unwrap().architecture().unwrap().to_string();
    let key = format!("{arch}.block_count");
    rewrite(&good, &models.join("bad.gguf"), &key, Value::U64(1 << 40));
    rewrite(&good, &models.join("nan.gguf"), &format!("{arch}.attention.layer_norm_rms_epsilon"), Value::F32(f32::NAN));

    let mut s = Server::start(&["-m", good.to_str().unwrap(), "--models-dir", models.to_str().unwrap()], &dir.path().join("home"));
    let (code, ok) = s.complete("good");
    assert_eq!(code, 200, "{ok}");
    for round in 0..2 {
        for (name, want) in [("bad", key.as_str()), ("nan", "layer_norm_rms_epsilon")] {
            let (code, e) = s.complete(name);
            assert!((400..600).contains(&code), "{name}: status {code}: {e}");
            let msg = e["error"]["message"].as_str().unwrap_or_else(|| panic!("{name}: no error message: {e}"));
            assert!(msg.contains(want), "{name} (round {round}): {msg}");
            assert!(!msg.contains(models.to_str().unwrap()), "{name}: the server's path reached the client: {msg}");
        }
        let (code, ok) = s.complete("good");
        assert_eq!(code, 200, "good after the bad files (round {round}): {ok}");
        assert!(ok["choices"][0]["text"].is_string(), "{ok}");
    }
    assert!(s.child.try_wait().unwrap().is_none(), "the server exited");
}
