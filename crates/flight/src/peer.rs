//! Test support, compiled for tests and with the `test-peer` feature only: the Longbow test
//! peer (`tests/flight_peer.py`, pyarrow's Flight server) as a child process on loopback
//! ports, for this crate's and the CLI's tests; stopped on drop. Reads `QUARREL_FLIGHT_PEER`
//! (the script) and `QUARREL_PYTHON` (the interpreter).

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

pub struct TestPeer {
    child: Child,
    /// `127.0.0.1:port` of the data endpoint (DoPut, DoGet).
    pub data: String,
    /// `127.0.0.1:port` of the meta endpoint (GetFlightInfo, ListFlights, DoAction).
    pub meta: String,
}

/// `QUARREL_FLIGHT_PEER`, else the repository's `tests/flight_peer.py`.
pub fn peer_script() -> PathBuf {
    std::env::var_os("QUARREL_FLIGHT_PEER")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/flight_peer.py"))
}

impl TestPeer {
    /// Start the peer (`python3`, or `QUARREL_PYTHON`) and wait for its ports.
    pub fn start() -> Result<TestPeer, String> {
        let py = std::env::var("QUARREL_PYTHON").unwrap_or_else(|_| "python3".into());
        let script = peer_script();
        let mut child = Command::new(&py)
            .arg(&script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("cannot run {py} {}: {e}", script.display()))?;
        let out = child.stdout.take().expect("piped");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(out).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx.recv_timeout(Duration::from_secs(60)).unwrap_or_default();
        let port = |k: &str| line.split_whitespace().find_map(|kv| kv.strip_prefix(k)).map(|p| format!("127.0.0.1:{p}"));
        match (port("data="), port("meta=")) {
            (Some(data), Some(meta)) if line.starts_with("READY") => Ok(TestPeer { child, data, meta }),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                Err(format!(
                    "the Flight test peer did not start (got {line:?}); it needs pyarrow and numpy: \
                     python3 -m pip install pyarrow numpy (scripts/test.sh does)"
                ))
            }
        }
    }
}

impl Drop for TestPeer {
    fn drop(&mut self) {
        // closing stdin asks the peer to stop; kill it if it does not
        drop(self.child.stdin.take());
        for _ in 0..50 {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
