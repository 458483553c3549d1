//! `quarrel pull hf:ORG/REPO[@REVISION][:FILE|:QUANT]`: a GGUF model from the Hugging Face hub.
//!
//! The hub's tree API lists the repository's files with their sizes and, for files stored in
//! LFS (every GGUF), their sha256. The `hf-hub` crate downloads each file in ranged chunks over
//! parallel connections into its cache under $QUARREL_HOME/models/.downloads, and resumes an
//! interrupted download after its last whole chunk. It checks no hash, so the finished file is
//! checked here against the tree's sha256 before it moves into the cache.

use super::download::{install, status_error, verify, Reporter};
use super::Args;
use crate::resolve::cache_dir;
use anyhow::{bail, Context, Result};
use hf_hub::api::tokio::{ApiBuilder, ApiError};
use hf_hub::{Repo, RepoType};
use std::path::{Path, PathBuf};

const AUTH_HINT: &str = "the repository may be private or gated: accept its terms on the hub and set \
                         HF_TOKEN (or --hf-token) to an access token";

/// `ORG/REPO[@REVISION][:FILE|:QUANT]`, parsed.
#[derive(Debug, PartialEq, Eq)]
pub struct Spec {
    pub repo: String,
    pub revision: String,
    pub select: Option<String>,
}

pub fn parse_spec(s: &str) -> Result<Spec> {
    let (repo, select) = match s.split_once(':') {
        Some((r, f)) => (r, Some(f.to_string()).filter(|f| !f.is_empty())),
        None => (s, None),
    };
    let (repo, revision) = repo.split_once('@').unwrap_or((repo, "main"));
    let ok = |p: &str| !p.is_empty() && p.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    match repo.split_once('/') {
        Some((org, name)) if ok(org) && ok(name) && !revision.is_empty() => {}
        _ => bail!(
            "{s:?} is not a hub model: expected hf:ORG/REPO[@REVISION][:FILE|:QUANT], e.g. hf:bartowski/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M"
        ),
    }
    Ok(Spec { repo: repo.to_string(), revision: revision.to_string(), select })
}

/// A file of the repository, from the tree API.
#[derive(Clone, Debug, serde::Deserialize)]
pub struct TreeEntry {
    #[serde(rename = "type")]
    pub kind: String,
    pub path: String,
    #[serde(default)]
    pub size: u64,
    #[serde(default)]
    pub lfs: Option<Lfs>,
}

#[derive(Clone, Debug, serde::Deserialize)]
pub struct Lfs {
    /// The file's sha256 (hex).
    pub oid: String,
}

/// `name-00001-of-00003.gguf` -> (`name`, 1); other names -> None.
pub fn split_part(file: &str) -> Option<(&str, u32)> {
    let stem = file.strip_suffix(".gguf")?;
    let (rest, of) = stem.rsplit_once("-of-")?;
    let (base, part) = rest.rsplit_once('-')?;
    let digits = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    (digits(part) && digits(of)).then(|| (base, part.parse().unwrap_or(0)))
}

/// The file name of a repository path.
fn base_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// A model in the repository: one .gguf, or the parts of a split one (in order).
#[derive(Debug)]
pub struct Model {
    pub name: String,
    pub files: Vec<TreeEntry>,
}

/// The repository's .gguf files grouped into models (the split parts of one model together).
pub fn models(tree: &[TreeEntry]) -> Vec<Model> {
    let mut out: Vec<Model> = vec![];
    for e in tree.iter().filter(|e| e.kind == "file" && e.path.to_ascii_lowercase().ends_with(".gguf")) {
        let dir = e.path.rsplit_once('/').map_or("", |(d, _)| d);
        let name = match split_part(base_name(&e.path)) {
            Some((base, _)) => format!("{dir}{}{base}", if dir.is_empty() { "" } else { "/" }),
            None => e.path.trim_end_matches(".gguf").to_string(),
        };
        match out.iter_mut().find(|m| m.name == name) {
            Some(m) => m.files.push(e.clone()),
            None => out.push(Model { name, files: vec![e.clone()] }),
        }
    }
    for m in &mut out {
        m.files.sort_by(|a, b| a.path.cmp(&b.path));
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// The model `select` names: a file path or name, else the one model whose name contains it
/// (case-insensitive); without `select`, the repository's only model.
pub fn choose(repo: &str, mut all: Vec<Model>, select: Option<&str>) -> Result<Model> {
    let listing = |ms: &[Model]| {
        ms.iter()
            .map(|m| {
                let bytes: u64 = m.files.iter().map(|f| f.size).sum();
                let parts = if m.files.len() > 1 { format!(", {} parts", m.files.len()) } else { String::new() };
                format!("  {}  ({:.1} MiB{parts})", m.name, bytes as f64 / (1 << 20) as f64)
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    if all.is_empty() {
        bail!("hf:{repo} holds no .gguf file (Quarrel loads GGUF models: look for a repository with GGUF in its name)");
    }
    let Some(sel) = select else {
        if all.len() == 1 {
            return Ok(all.remove(0));
        }
        bail!("hf:{repo} holds {} models; pick one with hf:{repo}:QUANT or :FILE:\n{}", all.len(), listing(&all));
    };
    let want = sel.to_ascii_lowercase();
    if let Some(i) = all
        .iter()
        .position(|m| m.files.iter().any(|f| f.path.to_ascii_lowercase() == want || base_name(&f.path).to_ascii_lowercase() == want))
    {
        return Ok(all.remove(i));
    }
    let hits: Vec<usize> = (0..all.len()).filter(|&i| base_name(&all[i].name).to_ascii_lowercase().contains(&want)).collect();
    match hits.as_slice() {
        [i] => Ok(all.remove(*i)),
        [] => bail!("no .gguf in hf:{repo} matches {sel:?}; the choices:\n{}", listing(&all)),
        _ => {
            let matching: Vec<Model> = all.into_iter().enumerate().filter(|(i, _)| hits.contains(i)).map(|(_, m)| m).collect();
            bail!("{sel:?} matches {} models in hf:{repo}; name one file:\n{}", matching.len(), listing(&matching))
        }
    }
}

/// GET the repository's file tree (recursive, following the pages the hub splits it into).
async fn tree(client: &reqwest::Client, endpoint: &str, spec: &Spec) -> Result<Vec<TreeEntry>> {
    let rev = spec.revision.replace('/', "%2F");
    let mut url = format!("{endpoint}/api/models/{}/tree/{rev}?recursive=true", spec.repo);
    let mut out = vec![];
    loop {
        let resp = client.get(&url).send().await.with_context(|| format!("connecting to {endpoint}"))?;
        if !resp.status().is_success() {
            let what = format!("hf:{}@{}", spec.repo, spec.revision);
            return Err(status_error(resp.status(), &what, AUTH_HINT));
        }
        let next = resp
            .headers()
            .get(reqwest::header::LINK)
            .and_then(|l| l.to_str().ok())
            .and_then(|l| l.split(',').find(|p| p.contains("rel=\"next\"")))
            .and_then(|p| Some(p.split_once('<')?.1.split_once('>')?.0.to_string()));
        let page: Vec<TreeEntry> = resp.json().await.with_context(|| format!("{url}: not the hub's tree listing"))?;
        out.extend(page);
        match next {
            Some(n) => url = n,
            None => return Ok(out),
        }
    }
}

/// The message for a failed hf-hub download.
fn api_error(e: ApiError, file: &str) -> anyhow::Error {
    match e {
        ApiError::RequestError(r) if r.status().is_some() => status_error(r.status().unwrap_or_default(), file, AUTH_HINT),
        e => anyhow::anyhow!("downloading {file}: {e} (run the pull again to resume)"),
    }
}

/// Download the chosen model; returns the installed paths (the first part first).
pub async fn pull(spec: &str, a: &Args) -> Result<Vec<PathBuf>> {
    let spec = parse_spec(spec)?;
    let endpoint = a.hf_endpoint.trim_end_matches('/').to_string();
    let models_dir = cache_dir();
    let staging = models_dir.join(".downloads").join("hf");
    // from_env: the token `huggingface-cli login` saved, unless --hf-token / HF_TOKEN
    let mut b = ApiBuilder::from_env()
        .with_endpoint(endpoint.clone())
        .with_cache_dir(staging.clone())
        .with_progress(false)
        .with_max_files(a.connections.max(1))
        .with_chunk_size(Some(a.chunk_size.max(1)));
    if let Some(t) = a.hf_token.as_deref().filter(|t| !t.is_empty()) {
        b = b.with_token(Some(t.to_string()));
    }
    let api = b.build().context("setting up the hub client")?;
    let model = choose(&spec.repo, models(&tree(api.client(), &endpoint, &spec).await?), spec.select.as_deref())?;
    let repo = api.repo(Repo::with_revision(spec.repo.clone(), RepoType::Model, spec.revision.clone()));
    let rep = Reporter::new(a.progress);
    let mut out = vec![];
    for f in &model.files {
        let dst = models_dir.join(base_name(&f.path));
        out.push(dst.clone());
        if dst.exists() && !a.force {
            eprintln!("{} is already cached (use --force to fetch again)", dst.display());
            continue;
        }
        let Some(sha) = f.lfs.as_ref().map(|l| l.oid.clone()) else {
            bail!("hf:{}: {} has no sha256 on the hub (not an LFS file), so it cannot be verified", spec.repo, f.path);
        };
        let pointer = repo.download_with_progress(&f.path, rep.clone()).await.map_err(|e| api_error(e, &f.path))?;
        let blob = std::fs::canonicalize(&pointer).with_context(|| format!("finding the download of {}", f.path))?;
        let _ = std::fs::remove_file(&pointer);
        let checked = verify(&blob, &sha, &f.path).and_then(|()| install(&blob, &dst));
        prune(&staging);
        checked?;
    }
    Ok(out)
}

/// Remove the staging folders that hold no partial download any more.
fn prune(dir: &Path) {
    fn walk(d: &Path) -> bool {
        let Ok(rd) = std::fs::read_dir(d) else { return false };
        let mut empty = true;
        for e in rd.flatten() {
            let p = e.path();
            let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
            let keep = if is_dir { !walk(&p) } else { p.extension().is_some_and(|x| x == "part") };
            if keep {
                empty = false;
            } else if !is_dir {
                let _ = std::fs::remove_file(&p);
            }
        }
        empty && std::fs::remove_dir(d).is_ok()
    }
    walk(dir);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str) -> TreeEntry {
        TreeEntry { kind: "file".into(), path: path.into(), size: 1 << 20, lfs: None }
    }

    #[test]
    fn specs_parse_and_bad_ones_are_errors() {
        let s = parse_spec("bartowski/Qwen-GGUF:Q4_K_M").unwrap();
        assert_eq!(s, Spec { repo: "bartowski/Qwen-GGUF".into(), revision: "main".into(), select: Some("Q4_K_M".into()) });
        assert_eq!(parse_spec("a/b@v1.0").unwrap().revision, "v1.0");
        assert_eq!(parse_spec("a/b").unwrap().select, None);
        for bad in ["noslash", "a/b/c", "/b", "a/", "a b/c", "a/b@"] {
            assert!(parse_spec(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn quants_pick_one_model_and_split_parts_stay_together() {
        let tree = vec![
            file("README.md"),
            file("m-Q4_K_M.gguf"),
            file("m-Q8_0.gguf"),
            file("Q6_K/m-Q6_K-00002-of-00002.gguf"),
            file("Q6_K/m-Q6_K-00001-of-00002.gguf"),
        ];
        assert_eq!(models(&tree).len(), 3);
        assert_eq!(choose("r", models(&tree), Some("q4_k_m")).unwrap().files[0].path, "m-Q4_K_M.gguf");
        let split = choose("r", models(&tree), Some("Q6_K")).unwrap();
        let paths: Vec<_> = split.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(paths, ["Q6_K/m-Q6_K-00001-of-00002.gguf", "Q6_K/m-Q6_K-00002-of-00002.gguf"]);
        assert_eq!(choose("r", models(&tree), Some("m-Q8_0.gguf")).unwrap().name, "m-Q8_0");
        let e = choose("r", models(&tree), None).unwrap_err().to_string();
        assert!(e.contains("3 models") && e.contains("m-Q8_0"), "{e}");
        assert!(choose("r", models(&tree), Some("Q5")).unwrap_err().to_string().contains("no .gguf"));
        assert!(choose("r", models(&tree), Some("m-Q")).unwrap_err().to_string().contains("matches 3"));
        assert_eq!(choose("r", models(&tree[..2]), None).unwrap().name, "m-Q4_K_M");
        assert!(choose("r", vec![], None).is_err());
    }
}
