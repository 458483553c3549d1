//! Helpers shared by the server test files.
#![allow(dead_code)] // each test file uses what it needs

use quarrel_server::KeyFile;
use std::path::{Path, PathBuf};

/// A key file `keys.json` in `dir` holding one new key named `name`: the file's path, the key
/// and the key's id.
pub fn key_file(dir: &Path, name: &str) -> (PathBuf, String, String) {
    let kp = dir.join("keys.json");
    let mut kf = KeyFile::default();
    let (key, rec) = kf.create(name);
    kf.save(&kp).unwrap();
    (kp, key, rec.id)
}
