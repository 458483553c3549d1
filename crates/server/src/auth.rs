//! API keys: a JSON keys file holding SHA-256 hashes (never the keys), managed by
//! `quarrel keys create|list|revoke` and re-read by the server when it changes, so a revoked
//! key stops working at once. Presented keys (`Authorization: Bearer` or `x-api-key`) are
//! hashed and compared with every stored hash in constant time.

use rand::RngCore;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;
use subtle::ConstantTimeEq;

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("keys file {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("keys file {path} is not valid: {msg}")]
    Format { path: PathBuf, msg: String },
    #[error("no key with id or name {0:?}")]
    NotFound(String),
}

/// One stored key.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct KeyRecord {
    pub id: String,
    pub name: String,
    /// Hex SHA-256 of the key.
    pub hash: String,
    /// The first characters of the key, to recognize it in listings.
    pub prefix: String,
    pub created: u64,
    #[serde(default)]
    pub revoked: Option<u64>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct KeyFile {
    pub keys: Vec<KeyRecord>,
}

fn hash_key(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

fn now() -> u64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

impl KeyFile {
    pub fn load(path: &Path) -> Result<KeyFile, KeyError> {
        match std::fs::read_to_string(path) {
            Ok(t) => serde_json::from_str(&t).map_err(|e| KeyError::Format { path: path.into(), msg: e.to_string() }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(KeyFile::default()),
            Err(e) => Err(KeyError::Io { path: path.into(), source: e }),
        }
    }

    /// Write atomically (temp file + rename), readable by the owner only.
    pub fn save(&self, path: &Path) -> Result<(), KeyError> {
        let io = |e| KeyError::Io { path: path.into(), source: e };
        if let Some(d) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(d).map_err(io)?;
        }
        let tmp = path.with_extension("json.tmp");
        let text = serde_json::to_string_pretty(self).map_err(|e| KeyError::Format { path: path.into(), msg: e.to_string() })?;
        std::fs::write(&tmp, text).map_err(io)?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600)).map_err(io)?;
        }
        std::fs::rename(&tmp, path).map_err(io)
    }

    /// Add a new key; returns it (the only time it is visible) and its record.
    pub fn create(&mut self, name: &str) -> (String, KeyRecord) {
        let mut raw = [0u8; 24];
        rand::thread_rng().fill_bytes(&mut raw);
        let key = format!("qk-{}", hex::encode(raw));
        let mut idb = [0u8; 4];
        rand::thread_rng().fill_bytes(&mut idb);
        let rec = KeyRecord {
            id: format!("key_{}", hex::encode(idb)),
            name: name.to_string(),
            hash: hex::encode(hash_key(&key)),
            prefix: key[..9].to_string(),
            created: now(),
            revoked: None,
        };
        self.keys.push(rec.clone());
        (key, rec)
    }

    /// Revoke by id or name (every key of that name).
    pub fn revoke(&mut self, id_or_name: &str) -> Result<usize, KeyError> {
        let t = now();
        let mut n = 0;
        for k in self.keys.iter_mut().filter(|k| k.id == id_or_name || k.name == id_or_name || k.prefix == id_or_name) {
            if k.revoked.is_none() {
                k.revoked = Some(t);
            }
            n += 1;
        }
        if n == 0 {
            return Err(KeyError::NotFound(id_or_name.into()));
        }
        Ok(n)
    }

    /// The record whose hash matches `key` (constant time over every record).
    pub fn check(&self, key: &str) -> Option<&KeyRecord> {
        let h = hash_key(key);
        let mut found = None;
        for k in &self.keys {
            let stored = hex::decode(&k.hash).unwrap_or_default();
            if stored.len() == 32 && bool::from(stored.as_slice().ct_eq(&h)) {
                found = Some(k);
            }
        }
        found
    }
}

/// Why a key was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    Missing,
    Unknown,
    Revoked,
}

impl Refusal {
    pub fn message(&self) -> &'static str {
        match self {
            Refusal::Missing => "an API key is required (Authorization: Bearer <key> or x-api-key)",
            Refusal::Unknown => "invalid API key",
            Refusal::Revoked => "this API key has been revoked",
        }
    }
}

/// The server's view of the keys file, re-read when its modification time changes.
pub struct KeyStore {
    path: PathBuf,
    cache: Mutex<(Option<SystemTime>, KeyFile)>,
}

impl KeyStore {
    pub fn open(path: &Path) -> Result<KeyStore, KeyError> {
        let file = KeyFile::load(path)?;
        let mtime = std::fs::metadata(path).and_then(|m| m.modified()).ok();
        Ok(KeyStore { path: path.into(), cache: Mutex::new((mtime, file)) })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Check a presented key; the key's id on success.
    pub fn verify(&self, key: Option<&str>) -> Result<String, Refusal> {
        let key = key.map(str::trim).filter(|k| !k.is_empty()).ok_or(Refusal::Missing)?;
        let mtime = std::fs::metadata(&self.path).and_then(|m| m.modified()).ok();
        let mut c = self.cache.lock().map_err(|_| Refusal::Unknown)?;
        if mtime != c.0 {
            match KeyFile::load(&self.path) {
                Ok(f) => *c = (mtime, f),
                Err(e) => tracing::error!("re-reading keys: {e} (keeping the previous keys)"),
            }
        }
        match c.1.check(key) {
            None => Err(Refusal::Unknown),
            Some(r) if r.revoked.is_some() => Err(Refusal::Revoked),
            Some(r) => Ok(r.id.clone()),
        }
    }
}

/// The key a request presents: `Authorization: Bearer <key>` or `x-api-key`.
pub fn presented_key(headers: &axum::http::HeaderMap) -> Option<String> {
    if let Some(v) = headers.get(axum::http::header::AUTHORIZATION).and_then(|v| v.to_str().ok()) {
        let v = v.trim();
        if let Some(k) = v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")) {
            return Some(k.trim().to_string());
        }
    }
    headers.get("x-api-key").and_then(|v| v.to_str().ok()).map(|s| s.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_check_revoke_round_trip() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("keys.json");
        let mut f = KeyFile::load(&p).unwrap();
        let (k1, r1) = f.create("ci");
        let (k2, _) = f.create("other");
        f.save(&p).unwrap();
        assert!(!std::fs::read_to_string(&p).unwrap().contains(&k1), "the key itself must not be stored");
        let store = KeyStore::open(&p).unwrap();
        assert_eq!(store.verify(Some(&k1)), Ok(r1.id.clone()));
        assert_eq!(store.verify(Some("qk-nope")), Err(Refusal::Unknown));
        assert_eq!(store.verify(None), Err(Refusal::Missing));
        let mut f = KeyFile::load(&p).unwrap();
        assert_eq!(f.revoke(&r1.id).unwrap(), 1);
        assert!(f.revoke("missing").is_err());
        std::thread::sleep(std::time::Duration::from_millis(20));
        f.save(&p).unwrap();
        // make sure the modification time moves even on coarse clocks
        let later = SystemTime::now() + std::time::Duration::from_secs(2);
        std::fs::File::options().write(true).open(&p).unwrap().set_modified(later).unwrap();
        assert_eq!(store.verify(Some(&k1)), Err(Refusal::Revoked));
        assert!(store.verify(Some(&k2)).is_ok());
    }
}
