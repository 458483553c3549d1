//! `quarrel ls`, `quarrel rm`: the models in Quarrel's cache; `quarrel ps`: the models a running
//! server has loaded (its ollama-compatible /api/ps).

use crate::resolve::cache_dir;
use anyhow::{bail, Context, Result};
use std::path::PathBuf;

/// List the models in Quarrel's cache ($QUARREL_HOME/models): name, size, file.
#[derive(clap::Args)]
pub struct LsArgs {
    /// Print JSON lines ({"name", "file", "bytes"}) instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Remove a model from Quarrel's cache.
#[derive(clap::Args)]
pub struct RmArgs {
    /// The model: its file name (with or without .gguf) or its `quarrel pull` name.
    #[arg(required = true)]
    pub names: Vec<String>,
}

/// List the models a running `quarrel serve` has loaded, with their memory and context.
#[derive(clap::Args)]
pub struct PsArgs {
    /// The server's base URL.
    #[arg(long, env = "QUARREL_URL", default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// API key (default: $QUARREL_API_KEY).
    #[arg(long = "api-key", env = "QUARREL_API_KEY")]
    pub api_key: Option<String>,
}

/// (name shown, file) of every .gguf in the cache, sorted by name; a split model is listed
/// once, by its first part.
fn cached() -> Vec<(String, PathBuf)> {
    let dir = cache_dir();
    let first_part = |p: &PathBuf| p.file_name().is_some_and(|f| crate::cmd::pull::split_rest(&f.to_string_lossy()).is_some());
    let mut out: Vec<(String, PathBuf)> = std::fs::read_dir(&dir)
        .map(|r| {
            r.flatten()
                .map(|e| e.path())
                .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "gguf") && first_part(p))
                .collect::<Vec<PathBuf>>()
        })
        .unwrap_or_default()
        .into_iter()
        .map(|p: PathBuf| {
            let file = p.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
            let name = crate::cmd::pull::ENTRIES
                .iter()
                .find(|e| e.file_name == file)
                .map_or_else(|| file.trim_end_matches(".gguf").to_string(), |e| e.name.to_string());
            (name, p)
        })
        .collect();
    out.sort();
    out
}

fn human(bytes: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < units.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", units[i])
    }
}

pub fn ls(a: LsArgs) -> Result<()> {
    let models = cached();
    if a.json {
        for (name, p) in &models {
            let bytes = std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
            println!("{}", serde_json::json!({"name": name, "file": p.display().to_string(), "bytes": bytes}));
        }
        return Ok(());
    }
    if models.is_empty() {
        eprintln!("no models in {} (fetch one with `quarrel pull`)", cache_dir().display());
        return Ok(());
    }
    let w = models.iter().map(|(n, _)| n.len()).max().unwrap_or(4).max(4);
    println!("{:w$}  {:>10}  FILE", "NAME", "SIZE");
    for (name, p) in &models {
        let bytes = std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
        println!("{name:w$}  {:>10}  {}", human(bytes), p.display());
    }
    Ok(())
}

pub fn rm(a: RmArgs) -> Result<()> {
    let models = cached();
    for n in &a.names {
        let want = n.trim_end_matches(".gguf");
        let hit = models.iter().find(|(name, p)| {
            name.eq_ignore_ascii_case(want)
                || p.file_stem().is_some_and(|s| s.to_string_lossy().eq_ignore_ascii_case(want))
                || crate::cmd::pull::find_entry(n).is_some_and(|e| p.file_name().is_some_and(|f| f.to_string_lossy() == e.file_name))
        });
        let Some((name, p)) = hit else {
            bail!("{n:?} is not in {} (`quarrel ls` lists what is)", cache_dir().display());
        };
        std::fs::remove_file(p).with_context(|| format!("removing {}", p.display()))?;
        eprintln!("removed {name} ({})", p.display());
        // the rest of a split model goes with its first part
        let rest = p.file_name().and_then(|f| crate::cmd::pull::split_rest(&f.to_string_lossy())).unwrap_or_default();
        for part in rest.iter().map(|f| cache_dir().join(f)).filter(|q| q.is_file()) {
            std::fs::remove_file(&part).with_context(|| format!("removing {}", part.display()))?;
            eprintln!("removed {}", part.display());
        }
    }
    Ok(())
}

pub fn ps(a: PsArgs) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting tokio")?;
    let url = format!("{}/api/ps", a.url.trim_end_matches('/'));
    let body: serde_json::Value = rt.block_on(async {
        let mut req = reqwest::Client::new().get(&url).timeout(std::time::Duration::from_secs(30));
        if let Some(k) = &a.api_key {
            req = req.bearer_auth(k);
        }
        let r = req.send().await.with_context(|| format!("connecting to {url}"))?;
        let status = r.status();
        if status == reqwest::StatusCode::UNAUTHORIZED {
            bail!("{url}: 401, the server needs an API key (--api-key or QUARREL_API_KEY)");
        }
        if !status.is_success() {
            bail!("{url}: HTTP {status}: {}", r.text().await.unwrap_or_default());
        }
        r.json().await.with_context(|| format!("{url}: not the JSON of /api/ps"))
    })?;
    let models = body["models"].as_array().cloned().unwrap_or_default();
    if models.is_empty() {
        eprintln!("no models loaded");
        return Ok(());
    }
    let names: Vec<String> = models.iter().map(|m| m["name"].as_str().unwrap_or("?").trim_end_matches(":latest").to_string()).collect();
    let w = names.iter().map(String::len).max().unwrap_or(4).max(4);
    println!("{:w$}  {:>10}  {:>8}  QUANT", "NAME", "MEMORY", "CONTEXT");
    for (m, name) in models.iter().zip(&names) {
        let size = m["size"].as_u64().map(human).unwrap_or_else(|| "?".into());
        let ctx = m["context_length"].as_u64().map_or_else(|| "?".into(), |c| c.to_string());
        let quant = m["details"]["quantization_level"].as_str().unwrap_or("");
        println!("{name:w$}  {size:>10}  {ctx:>8}  {quant}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::human;

    #[test]
    fn sizes_are_human() {
        assert_eq!(human(512), "512 B");
        assert_eq!(human(1536), "1.5 KiB");
        assert_eq!(human(3 << 30), "3.0 GiB");
    }
}
