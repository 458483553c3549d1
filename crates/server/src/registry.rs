//! Loaded models by name: several at once, chosen per request (`name`, `name:tag`, aliases),
//! loaded and unloaded at run time under a memory budget with LRU eviction, and loaded on
//! demand when a request names a known but unloaded model (ollama behaviour).
//!
//! The server never opens files itself: a [`ModelLoader`] (the CLI's) lists the models it can
//! load and turns a catalog entry into a running `EngineHandle`. Clients can only load what
//! the catalog lists, never an arbitrary path.

use crate::error::ApiError;
use quarrel_engine::{EngineHandle, ModelSummary};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Instant, SystemTime};

/// A model the loader can load.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ModelEntry {
    /// Canonical name, as listed by `/v1/models` and `/api/tags`.
    pub name: String,
    /// Other names it answers to (file stem, registry aliases).
    pub aliases: Vec<String>,
    /// The server's file: never shown to clients.
    #[serde(skip)]
    pub path: PathBuf,
    pub size_bytes: u64,
}

impl ModelEntry {
    /// Does `name` (case-insensitive, `:latest` and `.gguf` ignored) refer to this model?
    pub fn matches(&self, name: &str) -> bool {
        let want = normalize(name);
        std::iter::once(&self.name).chain(&self.aliases).any(|n| normalize(n) == want)
    }

    /// The aliases clients may see: names only, never one that is a file path.
    pub fn public_aliases(&self) -> Vec<&str> {
        self.aliases.iter().map(String::as_str).filter(|a| !a.contains(['/', '\\'])).collect()
    }
}

fn normalize(name: &str) -> String {
    let n = name.trim().to_ascii_lowercase();
    let n = n.strip_suffix(":latest").unwrap_or(&n);
    n.strip_suffix(".gguf").unwrap_or(n).to_string()
}

fn load_failed(name: &str, why: &str) -> ApiError {
    ApiError::new(axum::http::StatusCode::INTERNAL_SERVER_ERROR, "model_load_failed", "server_error", format!("loading {name}: {why}"))
}

/// Loads models for the server (implemented by the binary, which knows backends and paths).
pub trait ModelLoader: Send + Sync + 'static {
    /// Every model that may be loaded, in a stable order.
    fn catalog(&self) -> Vec<ModelEntry>;
    /// Load one (blocking; called on a blocking thread).
    fn load(&self, entry: &ModelEntry) -> Result<EngineHandle, String>;
}

/// A running model.
pub struct Loaded {
    pub entry: ModelEntry,
    pub handle: EngineHandle,
    pub loaded_at: SystemTime,
    last_used: Mutex<Instant>,
}

impl Loaded {
    pub fn info(&self) -> &ModelSummary {
        self.handle.info()
    }

    pub fn touch(&self) {
        if let Ok(mut t) = self.last_used.lock() {
            *t = Instant::now();
        }
    }

    fn last_used(&self) -> Instant {
        self.last_used.lock().map(|t| *t).unwrap_or_else(|_| Instant::now())
    }

    /// Resident bytes: the weights file plus the KV cache.
    pub fn memory_bytes(&self) -> u64 {
        self.entry.size_bytes.max(self.info().size_bytes) + kv_bytes(self.info(), &self.handle)
    }
}

/// Bytes of the KV cache of a running model.
pub fn kv_bytes(info: &ModelSummary, h: &EngineHandle) -> u64 {
    let m = h.metrics();
    let head_dim = info.n_embd.checked_div(info.n_head).unwrap_or(0);
    let per_elem = match info.kv_type.as_str() {
        "f32" => 4.0,
        "q8_0" => 34.0 / 32.0,
        "q4_0" => 18.0 / 32.0,
        _ => 2.0,
    };
    let per_token = (info.n_layer * info.n_kv_head * head_dim * 2) as f64 * per_elem;
    (per_token * (m.kv_blocks_total * m.kv_block_size) as f64) as u64
}

pub struct Registry {
    loader: Arc<dyn ModelLoader>,
    loaded: RwLock<Vec<Arc<Loaded>>>,
    load_lock: tokio::sync::Mutex<()>,
    /// Most bytes of loaded models (0 = unlimited).
    pub budget: u64,
    pub on_demand: bool,
    /// The model used when a request names none.
    default: RwLock<Option<String>>,
}

impl Registry {
    pub fn new(loader: Arc<dyn ModelLoader>, budget: u64, on_demand: bool) -> Registry {
        Registry {
            loader,
            loaded: RwLock::new(vec![]),
            load_lock: tokio::sync::Mutex::new(()),
            budget,
            on_demand,
            default: RwLock::new(None),
        }
    }

    pub fn catalog(&self) -> Vec<ModelEntry> {
        self.loader.catalog()
    }

    pub fn loaded(&self) -> Vec<Arc<Loaded>> {
        self.loaded.read().map(|l| l.clone()).unwrap_or_default()
    }

    pub fn find_loaded(&self, name: &str) -> Option<Arc<Loaded>> {
        self.loaded().into_iter().find(|m| m.entry.matches(name))
    }

    pub fn find_entry(&self, name: &str) -> Option<ModelEntry> {
        self.find_loaded(name).map(|m| m.entry.clone()).or_else(|| self.catalog().into_iter().find(|e| e.matches(name)))
    }

    pub fn default_name(&self) -> Option<String> {
        self.default.read().ok().and_then(|d| d.clone())
    }

    /// The model for a request: by name, or the default when none is named; an unloaded
    /// known model is loaded when on-demand loading is on.
    pub async fn get(&self, name: Option<&str>) -> Result<Arc<Loaded>, ApiError> {
        let name = match name.map(str::trim).filter(|n| !n.is_empty()) {
            Some(n) => n.to_string(),
            None => match self.default_name().or_else(|| self.loaded().first().map(|m| m.entry.name.clone())) {
                Some(d) => d,
                None => return Err(ApiError::invalid("no model given and none is loaded")),
            },
        };
        if let Some(m) = self.find_loaded(&name) {
            m.touch();
            return Ok(m);
        }
        if !self.on_demand {
            return Err(if self.find_entry(&name).is_some() {
                ApiError::new(
                    axum::http::StatusCode::NOT_FOUND,
                    "model_not_found",
                    "invalid_request_error",
                    format!("model {name:?} is not loaded (on-demand loading is off: POST /api/models/{name}/load)"),
                )
            } else {
                ApiError::model_not_found(&name)
            });
        }
        self.load(&name).await
    }

    /// Load a model from the catalog (no-op when loaded), evicting least recently used
    /// models while the budget would be exceeded.
    pub async fn load(&self, name: &str) -> Result<Arc<Loaded>, ApiError> {
        let _guard = self.load_lock.lock().await;
        if let Some(m) = self.find_loaded(name) {
            m.touch();
            return Ok(m);
        }
        let entry = self.catalog().into_iter().find(|e| e.matches(name)).ok_or_else(|| ApiError::model_not_found(name))?;
        if self.budget > 0 && entry.size_bytes > self.budget {
            return Err(ApiError::invalid(format!(
                "model {} ({} MiB) does not fit the memory budget of {} MiB",
                entry.name,
                entry.size_bytes >> 20,
                self.budget >> 20
            )));
        }
        self.evict_for(entry.size_bytes);
        let loader = self.loader.clone();
        let e2 = entry.clone();
        let t0 = Instant::now();
        let handle = tokio::task::spawn_blocking(move || loader.load(&e2))
            .await
            .map_err(|e| load_failed(&entry.name, &e.to_string()))?
            .map_err(|e| load_failed(&entry.name, &e))?;
        let m = Arc::new(Loaded { entry, handle, loaded_at: SystemTime::now(), last_used: Mutex::new(Instant::now()) });
        tracing::info!(model = %m.entry.name, ms = t0.elapsed().as_millis() as u64, bytes = m.memory_bytes(), "model loaded");
        if let Ok(mut l) = self.loaded.write() {
            l.push(m.clone());
        }
        if let Ok(mut d) = self.default.write() {
            if d.is_none() {
                *d = Some(m.entry.name.clone());
            }
        }
        // the KV cache is known only now: trim again, never the new model
        self.evict_for(0);
        Ok(m)
    }

    /// Unload a model; requests still running on it finish first (they hold the engine).
    pub fn unload(&self, name: &str) -> Result<(), ApiError> {
        let mut l = self.loaded.write().map_err(|_| ApiError::internal("registry lock poisoned"))?;
        let i = l.iter().position(|m| m.entry.matches(name)).ok_or_else(|| ApiError::not_found(format!("model {name:?} is not loaded")))?;
        let m = l.remove(i);
        tracing::info!(model = %m.entry.name, "model unloaded");
        Ok(())
    }

    /// Stop every loaded engine: their waiting and running requests end with the engine's
    /// shut-down error (the end of a graceful shutdown's deadline).
    pub fn shutdown_all(&self) {
        for m in self.loaded() {
            m.handle.shutdown();
        }
    }

    /// Drop least recently used models until `extra` more bytes fit the budget (the most
    /// recently used model always stays).
    fn evict_for(&self, extra: u64) {
        if self.budget == 0 {
            return;
        }
        let Ok(mut l) = self.loaded.write() else { return };
        loop {
            let used: u64 = l.iter().map(|m| m.memory_bytes()).sum();
            if used + extra <= self.budget || l.is_empty() || (extra == 0 && l.len() == 1) {
                return;
            }
            let newest = l.iter().map(|m| m.last_used()).max();
            let Some((i, _)) =
                l.iter().enumerate().filter(|(_, m)| extra > 0 || Some(m.last_used()) != newest).min_by_key(|(_, m)| m.last_used())
            else {
                return;
            };
            let m = l.remove(i);
            tracing::info!(model = %m.entry.name, "model unloaded (memory budget, least recently used)");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_ollama_style() {
        let e = ModelEntry {
            name: "smollm2-135m-instruct".into(),
            aliases: vec!["smollm2".into(), "SmolLM2-135M-Instruct.Q4_1".into()],
            path: PathBuf::new(),
            size_bytes: 0,
        };
        assert!(e.matches("smollm2"));
        assert!(e.matches("smollm2:latest"));
        assert!(e.matches("SMOLLM2-135M-instruct"));
        assert!(e.matches("SmolLM2-135M-Instruct.Q4_1.gguf"));
        assert!(!e.matches("smollm2:7b"));
        assert!(!e.matches("gpt-4"));
    }
}
