//! `quarrel pull hf:...` and `quarrel pull ollama:...` against tests/pull/hub_server.py, a local
//! stand-in for the Hugging Face hub and an ollama registry: a download lands where `-m`, `ls`
//! and `rm` find it, an interrupted one resumes from its partial file (the server counts the
//! bytes it sends), a corrupted one is rejected and not installed, and bad names, missing
//! models and missing credentials are clear errors.

use quarrel_synth::{write_synth, Ftype, Preset, SynthSpec};
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

/// The local hub + registry, serving `root`; killed on drop.
struct Hub {
    child: Child,
    url: String,
}

impl Drop for Hub {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Hub {
    fn start(root: &Path) -> Hub {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/pull/hub_server.py");
        let mut child =
            Command::new("python3").arg(script).arg("--root").arg(root).stdout(Stdio::piped()).spawn().expect("python3 runs the test hub");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let port = line.trim().strip_prefix("PORT ").unwrap_or_else(|| panic!("the hub said {line:?}"));
        Hub { url: format!("http://127.0.0.1:{port}"), child }
    }

    /// GET a control or counter route: its JSON.
    fn get(&self, path: &str) -> Value {
        let addr = self.url.trim_start_matches("http://");
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").unwrap();
        let mut resp = String::new();
        s.read_to_string(&mut resp).unwrap();
        serde_json::from_str(resp.split_once("\r\n\r\n").unwrap().1).unwrap()
    }

    /// Body bytes of `file` sent since the last reset.
    fn sent(&self, file: &str) -> u64 {
        self.get("/_stats")["bytes"][file].as_u64().unwrap_or(0)
    }

    /// `quarrel ARGS` with its cache at `home`, pointed at this hub and registry.
    fn quarrel(&self, home: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
        let mut c = Command::new(env!("CARGO_BIN_EXE_quarrel"));
        c.args(args)
            .env("QUARREL_HOME", home)
            .env("HF_ENDPOINT", &self.url)
            .env("OLLAMA_REGISTRY", &self.url)
            // no token from the environment or a login on this machine
            .env_remove("HF_TOKEN")
            .env("HF_HOME", home.join("hf-home"))
            .env_remove("QUARREL_PROGRESS");
        for (k, v) in env {
            c.env(k, v);
        }
        c.output().unwrap()
    }
}

fn text(o: &Output) -> (String, String) {
    (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

/// Run and expect success: (stdout, stderr).
fn ok(o: Output) -> (String, String) {
    let (out, err) = text(&o);
    assert!(o.status.success(), "failed: {}\nstdout: {out}\nstderr: {err}", o.status);
    (out, err)
}

/// Run and expect a failure: stderr (a panic is not a clean failure).
fn fails(o: Output) -> String {
    let (out, err) = text(&o);
    assert!(!o.status.success(), "succeeded unexpectedly\nstdout: {out}\nstderr: {err}");
    assert!(!err.contains("panicked"), "{err}");
    err
}

/// `n` bytes that no two files share.
fn noise(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn write(root: &Path, rel: &str, data: &[u8]) -> PathBuf {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(&p, data).unwrap();
    p
}

/// The `ls --json` names.
fn listed(hub: &Hub, home: &Path) -> Vec<String> {
    let (out, _) = ok(hub.quarrel(home, &["ls", "--json"], &[]));
    out.lines().map(|l| serde_json::from_str::<Value>(l).unwrap()["name"].as_str().unwrap().to_string()).collect()
}

#[test]
fn hf_pull_resumes_verifies_and_picks_quants() {
    let dir = tempfile::tempdir().unwrap();
    let (root, home) = (dir.path().join("root"), dir.path().join("home"));
    let q8 = noise(2 << 20, 1);
    write(&root, "hf/test-org/tiny-GGUF/tiny-Q8_0.gguf", &q8);
    write(&root, "hf/test-org/tiny-GGUF/tiny-Q4_K_M.gguf", &noise(1 << 20, 2));
    write(&root, "hf/test-org/tiny-GGUF/README.md", b"# tiny\n");
    write(&root, "hf/test-org/tiny-GGUF/F16/tiny-F16-00001-of-00002.gguf", &noise(300_000, 3));
    write(&root, "hf/test-org/tiny-GGUF/F16/tiny-F16-00002-of-00002.gguf", &noise(200_000, 4));
    write(&root, "hf/private/gated-GGUF/gated-Q4_0.gguf", &noise(100_000, 5));
    let hub = Hub::start(&root);

    // several models and no quant: the choices, no download
    let err = fails(hub.quarrel(&home, &["pull", "hf:test-org/tiny-GGUF"], &[]));
    assert!(err.contains("3 models") && err.contains("tiny-Q8_0") && err.contains("tiny-Q4_K_M"), "{err}");
    let err = fails(hub.quarrel(&home, &["pull", "hf:test-org/tiny-GGUF:Q5_K"], &[]));
    assert!(err.contains("no .gguf") && err.contains("tiny-Q8_0"), "{err}");

    // the connection drops 1.3 MiB into the file, two seconds after the 7 other chunks of
    // 256 KiB (all in flight at once) have arrived: the pull fails, and the next one resumes
    // after the first 5 chunks, the whole ones before the gap
    let pull_q8 = ["pull", "hf:test-org/tiny-GGUF:q8_0", "--connections", "8", "--chunk-size", "256K", "--progress", "plain"];
    hub.get(&format!("/_control?reset=1&cut=tiny-Q8_0.gguf&at={}&delay=2", 1300 << 10));
    let err = fails(hub.quarrel(&home, &pull_q8, &[]));
    assert!(err.contains("run the pull again to resume"), "{err}");
    let first = hub.sent("tiny-Q8_0.gguf");
    assert!(first >= 1300 << 10, "the first try sent {first} bytes");
    hub.get("/_control?reset=1");
    let (out, err) = ok(hub.quarrel(&home, &pull_q8, &[]));
    let second = hub.sent("tiny-Q8_0.gguf");
    assert!(second <= (q8.len() as u64) - (1 << 20), "the resumed pull sent {second} of {} bytes", q8.len());
    let path = PathBuf::from(out.lines().last().unwrap());
    assert_eq!(path, home.join("models/tiny-Q8_0.gguf"));
    assert_eq!(std::fs::read(&path).unwrap(), q8);
    assert!(err.contains("sha256 verified"), "{err}");
    assert!(err.contains("(100%)"), "plain progress: {err}");
    assert!(err.contains("quarrel run -m tiny-Q8_0"), "{err}");
    // cached: not fetched again
    hub.get("/_control?reset=1");
    let (_, err) = ok(hub.quarrel(&home, &pull_q8, &[]));
    assert!(err.contains("already cached") && hub.sent("tiny-Q8_0.gguf") == 0, "{err}");

    // a damaged file is deleted, never installed
    hub.get("/_control?reset=1&corrupt=tiny-Q4_K_M.gguf");
    let err = fails(hub.quarrel(&home, &["pull", "hf:test-org/tiny-GGUF:Q4_K_M"], &[]));
    assert!(err.contains("sha256 mismatch") && err.contains("deleted"), "{err}");
    assert!(!home.join("models/tiny-Q4_K_M.gguf").exists());
    hub.get("/_control?reset=1");
    ok(hub.quarrel(&home, &["pull", "hf:test-org/tiny-GGUF:Q4_K_M"], &[]));

    // a split model comes whole (from a folder of the repository) and is listed once
    let (out, _) = ok(hub.quarrel(&home, &["pull", "hf:test-org/tiny-GGUF:f16", "--connections", "3", "--chunk-size", "64K"], &[]));
    assert!(out.trim_end().ends_with("tiny-F16-00001-of-00002.gguf"), "{out}");
    assert!(home.join("models/tiny-F16-00002-of-00002.gguf").is_file());
    assert_eq!(listed(&hub, &home), ["tiny-F16-00001-of-00002", "tiny-Q4_K_M", "tiny-Q8_0"]);
    ok(hub.quarrel(&home, &["rm", "tiny-F16-00001-of-00002"], &[]));
    assert!(!home.join("models/tiny-F16-00002-of-00002.gguf").exists());

    // errors: a bad name, a missing repository, a private one without and with a token
    let err = fails(hub.quarrel(&home, &["pull", "hf:no-slash"], &[]));
    assert!(err.contains("not a hub model"), "{err}");
    let err = fails(hub.quarrel(&home, &["pull", "hf:test-org/missing"], &[]));
    assert!(err.contains("404"), "{err}");
    let err = fails(hub.quarrel(&home, &["pull", "hf:private/gated-GGUF"], &[]));
    assert!(err.contains("401") && err.contains("HF_TOKEN"), "{err}");
    ok(hub.quarrel(&home, &["pull", "hf:private/gated-GGUF"], &[("HF_TOKEN", "secret-token")]));
    // nothing left behind in the staging folder
    let staged: Vec<_> = walk(&home.join("models/.downloads"));
    assert!(staged.is_empty(), "{staged:?}");
}

fn walk(d: &Path) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(d) else { return vec![] };
    rd.flatten().flat_map(|e| if e.path().is_dir() { walk(&e.path()) } else { vec![e.path()] }).collect()
}

#[test]
fn ollama_pull_resumes_verifies_and_lands_where_run_ls_and_rm_find_it() {
    let dir = tempfile::tempdir().unwrap();
    let (root, home) = (dir.path().join("root"), dir.path().join("home"));
    let tiny = root.join("ollama/library/tiny/q8.gguf");
    std::fs::create_dir_all(tiny.parent().unwrap()).unwrap();
    let spec = SynthSpec::new(*Preset::by_name("tiny").unwrap(), Ftype::from_name("q8_0").unwrap()).seed(7);
    write_synth(&spec, &tiny, &mut |_, _| {}).unwrap();
    let blob = noise(1 << 20, 9);
    write(&root, "ollama/someone/blob/latest.gguf", &blob);
    let hub = Hub::start(&root);

    let (out, err) = ok(hub.quarrel(&home, &["pull", "ollama:tiny:q8", "--progress", "plain"], &[]));
    assert_eq!(out.lines().last().unwrap(), home.join("models/tiny-q8.gguf").to_str().unwrap());
    assert!(err.contains("sha256 verified") && err.contains("(100%)"), "{err}");
    assert_eq!(std::fs::read(home.join("models/tiny-q8.gguf")).unwrap(), std::fs::read(&tiny).unwrap());
    // `-m` takes the ollama name as well as the file stem
    for name in ["tiny:q8", "tiny-q8", "ollama:tiny:q8"] {
        let (out, _) = ok(hub.quarrel(&home, &["inspect", name], &[]));
        assert!(
            out.starts_with(home.join("models/tiny-q8.gguf").to_str().unwrap()) && out.contains("general.architecture"),
            "{name}: {out}"
        );
    }

    // interrupted, then resumed from the partial blob
    hub.get(&format!("/_control?reset=1&cut=latest.gguf&at={}", 600 << 10));
    let err = fails(hub.quarrel(&home, &["pull", "ollama:someone/blob"], &[]));
    assert!(err.contains("resume"), "{err}");
    assert_eq!(hub.sent("latest.gguf"), 600 << 10);
    hub.get("/_control?reset=1");
    ok(hub.quarrel(&home, &["pull", "ollama:someone/blob"], &[]));
    assert_eq!(hub.sent("latest.gguf"), (blob.len() as u64) - (600 << 10));
    assert_eq!(std::fs::read(home.join("models/someone-blob-latest.gguf")).unwrap(), blob);

    // damaged: rejected, not installed, and the partial blob is gone so the next pull starts over
    hub.get("/_control?reset=1&corrupt=latest.gguf");
    let err = fails(hub.quarrel(&home, &["pull", "ollama:someone/blob", "--force"], &[]));
    assert!(err.contains("sha256 mismatch"), "{err}");
    assert!(walk(&home.join("models/.downloads")).is_empty());

    assert_eq!(listed(&hub, &home), ["someone-blob-latest", "tiny-q8"]);
    ok(hub.quarrel(&home, &["rm", "tiny-q8"], &[]));
    assert_eq!(listed(&hub, &home), ["someone-blob-latest"]);

    let err = fails(hub.quarrel(&home, &["pull", "ollama:nope"], &[]));
    assert!(err.contains("404") && err.contains("ollama:library/nope:latest"), "{err}");
    let err = fails(hub.quarrel(&home, &["pull", "ollama:../x"], &[]));
    assert!(err.contains("not an ollama model"), "{err}");
}

/// `-m hf:...` pulls a model that is not cached yet and runs it: here a synthetic model split
/// over two files, which comes whole and generates what the single file generates.
#[test]
fn run_with_an_hf_model_pulls_it_and_split_models_run_whole() {
    let dir = tempfile::tempdir().unwrap();
    let (root, home) = (dir.path().join("root"), dir.path().join("home"));
    let single = dir.path().join("tiny-Q8_0.gguf");
    let spec = SynthSpec::new(*Preset::by_name("tiny").unwrap(), Ftype::from_name("q8_0").unwrap()).seed(7);
    write_synth(&spec, &single, &mut |_, _| {}).unwrap();
    let repo = root.join("hf/test-org/split-GGUF");
    std::fs::create_dir_all(&repo).unwrap();
    let g = quarrel_gguf::Gguf::open(&single).unwrap();
    quarrel_gguf::write_split(&g, &repo.join("tiny-Q8_0").to_string_lossy(), 2).unwrap();
    let hub = Hub::start(&root);
    let gen = |model: &str| ok(hub.quarrel(&home, &["run", "-m", model, "-p", "Once upon", "-n", "8", "--temp", "0"], &[])).0;
    let want = gen(single.to_str().unwrap());
    assert_eq!(gen("hf:test-org/split-GGUF:Q8_0"), want);
    assert!(home.join("models/tiny-Q8_0-00002-of-00002.gguf").is_file());
    // cached now: by its file stem, and by the hub name again (no second download)
    hub.get("/_control?reset=1");
    assert_eq!(gen("tiny-Q8_0-00001-of-00002"), want);
    assert_eq!(gen("hf:test-org/split-GGUF:Q8_0"), want);
    assert_eq!(hub.sent("tiny-Q8_0-00001-of-00002.gguf") + hub.sent("tiny-Q8_0-00002-of-00002.gguf"), 0);
}
