//! Model resolution for `-m`: a path, a name in Quarrel's cache (a file stem, or an ollama
//! `name[:tag]` that `quarrel pull ollama:` fetched), a Hugging Face hub cache entry
//! (`org/repo[:file]`), an ollama store's model (`name[:tag]`), or `hf:...` / `ollama:...`,
//! pulled as `quarrel pull` does when not cached yet. No `-m`: the default model, fetched when
//! missing.

use anyhow::{bail, Result};
use std::path::{Path, PathBuf};

/// Quarrel's model cache: `$QUARREL_HOME/models` or `~/.cache/quarrel/models`.
pub fn cache_dir() -> PathBuf {
    if let Some(h) = std::env::var_os("QUARREL_HOME") {
        return PathBuf::from(h).join("models");
    }
    dirs::cache_dir().unwrap_or_else(|| PathBuf::from(".cache")).join("quarrel").join("models")
}

/// Find a model; with `fetch_default`, a missing default model is pulled.
pub fn resolve_model(name: Option<&str>, fetch_default: bool) -> Result<PathBuf> {
    let Some(name) = name else {
        let def = crate::cmd::pull::default_entry();
        let p = cache_dir().join(def.file_name);
        if p.exists() {
            return Ok(p);
        }
        if !fetch_default {
            bail!("the default model is not downloaded yet: run `quarrel pull`");
        }
        eprintln!("the default model {} is not in {}: fetching it", def.name, cache_dir().display());
        return crate::cmd::pull::pull(def);
    };
    let mut looked = vec![];
    let p = Path::new(name);
    if p.is_file() {
        return Ok(p.to_path_buf());
    }
    looked.push(format!("the path {name:?}"));
    // Quarrel cache: exact file, file + .gguf, what `quarrel pull ollama:NAME[:TAG]` stored, or
    // a registry alias
    let cache = cache_dir();
    let mut cands = vec![cache.join(name), cache.join(format!("{name}.gguf"))];
    if let Some(f) = crate::cmd::pull::ollama_file_name(name.strip_prefix("ollama:").unwrap_or(name)) {
        cands.push(cache.join(f));
    }
    for cand in cands {
        if cand.is_file() {
            return Ok(cand);
        }
    }
    if let Some(e) = crate::cmd::pull::find_entry(name) {
        let cand = cache.join(e.file_name);
        if cand.is_file() {
            return Ok(cand);
        }
        looked.push(format!("{} (run `quarrel pull {}`)", cand.display(), e.name));
    } else {
        looked.push(format!("{}", cache.join(name).display()));
    }
    if let Some(p) = find_hf(name, &mut looked) {
        return Ok(p);
    }
    if let Some(p) = find_ollama(name, &mut looked) {
        return Ok(p);
    }
    if crate::cmd::pull::is_remote(name) {
        return crate::cmd::pull::fetch(name);
    }
    bail!("model {name:?} not found; looked at:\n  {}", looked.join("\n  "))
}

fn hf_hub_dir() -> Option<PathBuf> {
    if let Some(h) = std::env::var_os("HF_HUB_CACHE") {
        return Some(PathBuf::from(h));
    }
    if let Some(h) = std::env::var_os("HF_HOME") {
        return Some(PathBuf::from(h).join("hub"));
    }
    dirs::home_dir().map(|h| h.join(".cache").join("huggingface").join("hub"))
}

/// `org/repo` or `org/repo:file.gguf` in the Hugging Face hub cache (first .gguf if no file).
fn find_hf(name: &str, looked: &mut Vec<String>) -> Option<PathBuf> {
    let (repo, file) = match name.split_once(':') {
        Some((r, f)) => (r, Some(f)),
        None => (name, None),
    };
    let (org, repo_name) = repo.split_once('/')?;
    let dir = hf_hub_dir()?.join(format!("models--{org}--{repo_name}")).join("snapshots");
    looked.push(format!("{}", dir.display()));
    let mut snaps: Vec<_> = std::fs::read_dir(&dir).ok()?.flatten().map(|e| e.path()).collect();
    snaps.sort();
    for s in snaps.iter().rev() {
        let mut files: Vec<_> = std::fs::read_dir(s).ok()?.flatten().map(|e| e.path()).collect();
        files.sort();
        for f in files {
            let fname = f.file_name()?.to_string_lossy().to_string();
            let ok = match file {
                Some(want) => fname == want || fname.eq_ignore_ascii_case(&format!("{want}.gguf")),
                None => fname.ends_with(".gguf"),
            };
            if ok {
                return Some(f);
            }
        }
    }
    None
}

fn ollama_dir() -> Option<PathBuf> {
    if let Some(h) = std::env::var_os("OLLAMA_MODELS") {
        return Some(PathBuf::from(h));
    }
    dirs::home_dir().map(|h| h.join(".ollama").join("models"))
}

/// `name[:tag]` (or `namespace/name[:tag]`) in an ollama store: manifest -> model layer blob.
fn find_ollama(name: &str, looked: &mut Vec<String>) -> Option<PathBuf> {
    let root = ollama_dir()?;
    let (model, tag) = name.split_once(':').unwrap_or((name, "latest"));
    let (ns, model) = model.split_once('/').unwrap_or(("library", model));
    let manifest = root.join("manifests").join("registry.ollama.ai").join(ns).join(model).join(tag);
    looked.push(format!("{}", manifest.display()));
    let text = std::fs::read_to_string(&manifest).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    let layer = v["layers"].as_array()?.iter().find(|l| l["mediaType"] == "application/vnd.ollama.image.model")?;
    let digest = layer["digest"].as_str()?.replace(':', "-");
    let blob = root.join("blobs").join(digest);
    blob.is_file().then_some(blob)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ollama_manifest_resolves_to_blob() {
        let d = tempfile::tempdir().unwrap();
        let m = d.path().join("manifests/registry.ollama.ai/library/tiny");
        std::fs::create_dir_all(&m).unwrap();
        std::fs::create_dir_all(d.path().join("blobs")).unwrap();
        std::fs::write(m.join("q4"), r#"{"layers":[{"mediaType":"application/vnd.ollama.image.model","digest":"sha256:abc"}]}"#).unwrap();
        std::fs::write(d.path().join("blobs/sha256-abc"), b"GGUF").unwrap();
        std::env::set_var("OLLAMA_MODELS", d.path());
        let mut looked = vec![];
        assert_eq!(find_ollama("tiny:q4", &mut looked), Some(d.path().join("blobs/sha256-abc")));
        assert_eq!(find_ollama("tiny", &mut looked), None);
    }
}
