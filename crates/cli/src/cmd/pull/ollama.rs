//! `quarrel pull ollama:[NAMESPACE/]NAME[:TAG]`: a model from an ollama registry, which speaks
//! the OCI distribution API: the manifest lists the layers, the one of media type
//! `application/vnd.ollama.image.model` is the GGUF, and its digest is its sha256.

use super::download::{fetch_resumable, install, status_error, Blob, Reporter};
use super::Args;
use crate::resolve::cache_dir;
use anyhow::{bail, Context, Result};
use std::path::PathBuf;

const MODEL_LAYER: &str = "application/vnd.ollama.image.model";
const AUTH_HINT: &str = "the registry refused the request (a private model, or not an ollama registry: see --ollama-registry)";

/// `[NAMESPACE/]NAME[:TAG]`, parsed.
#[derive(Debug, PartialEq, Eq)]
pub struct Spec {
    pub namespace: String,
    pub name: String,
    pub tag: String,
}

impl Spec {
    /// The cache's file name: `NAME-TAG.gguf` (`NAMESPACE-NAME-TAG.gguf` outside `library`),
    /// which `quarrel run -m NAME:TAG` finds too.
    pub fn file_name(&self) -> String {
        let ns = if self.namespace == "library" { String::new() } else { format!("{}-", self.namespace) };
        format!("{ns}{}-{}.gguf", self.name, self.tag)
    }
}

pub fn parse_spec(s: &str) -> Result<Spec> {
    let (model, tag) = s.split_once(':').unwrap_or((s, "latest"));
    let (namespace, name) = model.split_once('/').unwrap_or(("library", model));
    let ok = |p: &str| {
        !p.is_empty() && p.len() <= 128 && p.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) && !p.starts_with(['.', '-'])
    };
    if !(ok(namespace) && ok(name) && ok(tag)) {
        bail!("{s:?} is not an ollama model: expected ollama:[NAMESPACE/]NAME[:TAG], e.g. ollama:qwen2.5:0.5b");
    }
    Ok(Spec { namespace: namespace.to_string(), name: name.to_ascii_lowercase(), tag: tag.to_string() })
}

#[derive(serde::Deserialize)]
struct Manifest {
    layers: Vec<Layer>,
}

#[derive(serde::Deserialize)]
struct Layer {
    #[serde(rename = "mediaType")]
    media_type: String,
    digest: String,
    #[serde(default)]
    size: Option<u64>,
}

/// Download the model layer; returns its path in the cache.
pub async fn pull(spec: &str, a: &Args) -> Result<PathBuf> {
    let spec = parse_spec(spec)?;
    let dst = cache_dir().join(spec.file_name());
    if dst.exists() && !a.force {
        eprintln!("{} is already cached (use --force to fetch again)", dst.display());
        return Ok(dst);
    }
    let registry = a.ollama_registry.trim_end_matches('/');
    let base = format!("{registry}/v2/{}/{}", spec.namespace, spec.name);
    let client = reqwest::Client::builder().user_agent(concat!("quarrel/", env!("CARGO_PKG_VERSION"))).build()?;
    let what = format!("ollama:{}/{}:{}", spec.namespace, spec.name, spec.tag);
    let resp = client
        .get(format!("{base}/manifests/{}", spec.tag))
        .header(reqwest::header::ACCEPT, "application/vnd.docker.distribution.manifest.v2+json")
        .send()
        .await
        .with_context(|| format!("connecting to {registry}"))?;
    if !resp.status().is_success() {
        return Err(status_error(resp.status(), &what, AUTH_HINT));
    }
    let m: Manifest = resp.json().await.with_context(|| format!("{what}: the registry's manifest is not one of an ollama model"))?;
    let Some(layer) = m.layers.iter().find(|l| l.media_type == MODEL_LAYER) else {
        bail!("{what} has no model layer ({MODEL_LAYER}): not a model Quarrel can run");
    };
    let Some(sha) = layer.digest.strip_prefix("sha256:").filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit())) else {
        bail!("{what}: the model layer's digest {:?} is not a sha256", layer.digest);
    };
    // keyed by digest: a partial blob is resumed whichever tag named it
    let partial = cache_dir().join(".downloads").join("ollama").join(format!("sha256-{sha}.partial"));
    let rep = Reporter::new(a.progress);
    let label = spec.file_name();
    let url = format!("{base}/blobs/{}", layer.digest);
    let blob = Blob { url: &url, partial: &partial, size: layer.size, sha256: sha, label: &label };
    fetch_resumable(&client, &blob, &rep, AUTH_HINT).await?;
    install(&partial, &dst)?;
    Ok(dst)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_with_defaults_and_bad_ones_are_errors() {
        let s = parse_spec("qwen2.5:0.5b").unwrap();
        assert_eq!(s, Spec { namespace: "library".into(), name: "qwen2.5".into(), tag: "0.5b".into() });
        assert_eq!(s.file_name(), "qwen2.5-0.5b.gguf");
        let s = parse_spec("someone/tiny").unwrap();
        assert_eq!((s.tag.as_str(), s.file_name().as_str()), ("latest", "someone-tiny-latest.gguf"));
        for bad in ["", ":tag", "a/b/c", "a b", "../x", "x:", "x:../y"] {
            assert!(parse_spec(bad).is_err(), "{bad}");
        }
    }
}
