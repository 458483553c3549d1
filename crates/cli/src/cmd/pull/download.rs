//! What the hf: and ollama: pulls share: progress on stderr, a resumable single-stream
//! download, sha256 checks, moving a verified file into the cache, and errors for HTTP
//! statuses that say what to do.

use anyhow::{anyhow, bail, Context, Result};
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// `--progress`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ProgressMode {
    /// A bar when stderr is a terminal, nothing otherwise.
    Auto,
    /// A line every tenth of a file or every few seconds: for logs.
    Plain,
    /// Nothing.
    None,
}

/// Download progress, shared by the parallel chunks of one file (hence the mutex).
#[derive(Clone)]
pub struct Reporter {
    mode: ProgressMode,
    state: Arc<Mutex<State>>,
}

#[derive(Default)]
struct State {
    bar: Option<indicatif::ProgressBar>,
    label: String,
    total: u64,
    done: u64,
    printed_at: Option<Instant>,
    printed_tenth: u64,
}

impl Reporter {
    pub fn new(mode: ProgressMode) -> Reporter {
        Reporter { mode, state: Arc::default() }
    }

    /// A new file of `total` bytes, `done` of them already on disk.
    pub fn start(&self, label: &str, total: u64, done: u64) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        *s = State { label: label.to_string(), total, done, ..State::default() };
        if self.mode == ProgressMode::Auto {
            // indicatif draws only when stderr is a terminal
            let bar = indicatif::ProgressBar::new(total);
            bar.set_style(
                indicatif::ProgressStyle::with_template("{msg} {bar:30} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            bar.set_message(label.to_string());
            bar.set_position(done);
            s.bar = Some(bar);
        } else if self.mode == ProgressMode::Plain {
            eprintln!("{label}: {} bytes{}", total, if done > 0 { format!(", resuming at {done}") } else { String::new() });
        }
    }

    pub fn add(&self, n: u64) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.done += n;
        if let Some(b) = &s.bar {
            b.inc(n);
        } else if self.mode == ProgressMode::Plain {
            // a line per tenth of the file, or every 5 s on a slow link: readable in a log
            let tenth = (s.done * 10).checked_div(s.total).unwrap_or(0);
            let stale = s.printed_at.is_none_or(|t| t.elapsed() >= Duration::from_secs(5));
            if tenth > s.printed_tenth || stale {
                s.printed_tenth = tenth;
                s.printed_at = Some(Instant::now());
                eprintln!("{}: {}", s.label, fraction(s.done, s.total));
            }
        }
    }

    pub fn finish(&self) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(b) = s.bar.take() {
            b.finish_and_clear();
        }
        if self.mode == ProgressMode::Plain {
            eprintln!("{}: {} downloaded", s.label, fraction(s.done, s.total));
        }
    }
}

fn fraction(done: u64, total: u64) -> String {
    let pct = if total > 0 { done as f64 * 100.0 / total as f64 } else { 100.0 };
    format!("{done}/{total} bytes ({pct:.0}%)")
}

impl hf_hub::api::tokio::Progress for Reporter {
    async fn init(&mut self, size: usize, filename: &str) {
        self.start(filename, size as u64, 0);
    }
    async fn update(&mut self, size: usize) {
        self.add(size as u64);
    }
    async fn finish(&mut self) {
        Reporter::finish(self);
    }
}

/// The hex sha256 of a file.
pub fn sha256_file(p: &Path) -> Result<String> {
    let mut f = std::fs::File::open(p).with_context(|| format!("opening {}", p.display()))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// Check `p` against `want` (hex sha256); on a mismatch the file is deleted.
pub fn verify(p: &Path, want: &str, what: &str) -> Result<()> {
    eprintln!("verifying the sha256 of {what} ...");
    let got = sha256_file(p)?;
    if !got.eq_ignore_ascii_case(want) {
        let _ = std::fs::remove_file(p);
        bail!(
            "sha256 mismatch for {what}: expected {want}, got {got}; the download is corrupt and was deleted \
             (run the pull again; if it keeps failing the source serves a damaged file)"
        );
    }
    Ok(())
}

/// Move a verified file to `dst` (same file system: the cache).
pub fn install(src: &Path, dst: &Path) -> Result<()> {
    if let Some(dir) = dst.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::rename(src, dst).with_context(|| format!("moving {} to {}", src.display(), dst.display()))?;
    eprintln!("saved {} (sha256 verified)", dst.display());
    Ok(())
}

/// An error for a failed HTTP answer, with what to do about the usual statuses.
pub fn status_error(status: reqwest::StatusCode, what: &str, auth_hint: &str) -> anyhow::Error {
    match status.as_u16() {
        401 | 403 => anyhow!("{what}: HTTP {status}: not allowed; {auth_hint}"),
        404 => anyhow!("{what}: HTTP 404: not found (check the name, tag or file)"),
        429 => anyhow!("{what}: HTTP 429: rate limited; wait and run the pull again"),
        _ => anyhow!("{what}: HTTP {status}"),
    }
}

/// A file to fetch: from `url` into `partial`, `size` bytes (when known) of sha256 `sha256`.
pub struct Blob<'a> {
    pub url: &'a str,
    pub partial: &'a Path,
    pub size: Option<u64>,
    pub sha256: &'a str,
    /// What progress and errors call it.
    pub label: &'a str,
}

/// GET a blob into its partial file, continuing after the bytes it already holds (a `Range`
/// request), then check its sha256. `size` spots a partial file longer than the whole, which
/// is started over. On success the partial file holds the verified blob.
pub async fn fetch_resumable(client: &reqwest::Client, b: &Blob<'_>, rep: &Reporter, auth_hint: &str) -> Result<()> {
    let Blob { url, partial, size, sha256, label } = *b;
    if let Some(dir) = partial.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let mut have = std::fs::metadata(partial).map(|m| m.len()).unwrap_or(0);
    if size.is_some_and(|s| have > s) {
        have = 0;
    }
    if size != Some(have) {
        let mut req = client.get(url);
        if have > 0 {
            req = req.header(reqwest::header::RANGE, format!("bytes={have}-"));
        }
        let mut resp = req.send().await.with_context(|| format!("connecting to {url}"))?;
        let status = resp.status();
        if status == reqwest::StatusCode::RANGE_NOT_SATISFIABLE {
            // the partial file is no prefix of this blob: start over
            have = 0;
            resp = client.get(url).send().await.with_context(|| format!("connecting to {url}"))?;
        }
        let status = resp.status();
        if !status.is_success() {
            return Err(status_error(status, url, auth_hint));
        }
        // a server that ignores Range answers 200 with the whole file
        let append = have > 0 && status == reqwest::StatusCode::PARTIAL_CONTENT;
        if !append {
            have = 0;
        }
        let total = size.or_else(|| resp.content_length().map(|l| l + have)).unwrap_or(0);
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .append(append)
            .truncate(!append)
            .open(partial)
            .with_context(|| format!("opening {}", partial.display()))?;
        rep.start(label, total, have);
        while let Some(chunk) = resp.chunk().await.with_context(|| format!("downloading {url} (run the pull again to resume)"))? {
            f.write_all(&chunk).with_context(|| format!("writing {}", partial.display()))?;
            rep.add(chunk.len() as u64);
        }
        f.flush()?;
        rep.finish();
    }
    let got = std::fs::metadata(partial).map(|m| m.len()).unwrap_or(0);
    if let Some(s) = size {
        if got < s {
            bail!("{url}: the connection ended after {got} of {s} bytes (run the pull again to resume)");
        }
    }
    verify(partial, sha256, label)
}
