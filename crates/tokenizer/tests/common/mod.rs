//! Shared helpers: locating the real models (env vars) and the repository's fixtures.
#![allow(dead_code)]

use std::path::PathBuf;

use quarrel_gguf::{Gguf, GgufWriter, Value, ValueType};
use quarrel_tokenizer::Tokenizer;

/// `QUARREL_SMOLLM2`: path to SmolLM2-135M-Instruct (any quantization) GGUF.
pub const SMOLLM2: &str = "QUARREL_SMOLLM2";
/// `QUARREL_GEMMA3`: path to gemma-3-270m GGUF.
pub const GEMMA3: &str = "QUARREL_GEMMA3";

/// Opens the model named by `env`, or explains the skip and returns None.
pub fn open(env: &str) -> Option<Gguf> {
    let Ok(path) = std::env::var(env) else {
        eprintln!("skipping: set {env} to the model's GGUF path to run this test");
        return None;
    };
    Some(Gguf::open(&path).unwrap_or_else(|e| panic!("{env}={path}: {e}")))
}

/// Loads the tokenizer of the model named by `env`, or explains the skip and returns None.
pub fn load(env: &str) -> Option<Tokenizer> {
    let g = open(env)?;
    Some(Tokenizer::from_gguf(&g).unwrap_or_else(|e| panic!("{env}: {e}")))
}

/// `base`'s metadata (no tensors) with `key` set to `v`.
pub fn with_key(base: &Gguf, key: &str, v: Value) -> Gguf {
    let mut w = GgufWriter::new();
    for (k, v) in base.metadata() {
        w.set(k, v.clone());
    }
    w.set(key, v);
    Gguf::from_bytes(w.to_bytes(&[]).unwrap()).unwrap()
}

/// `<repo>/tests/fixtures/<rel>`.
pub fn fixture(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(rel)
}

pub fn read_json(rel: &str) -> serde_json::Value {
    let p = fixture(rel);
    let s = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&s).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The (text, ids) cases of a fixture file of the form {"cases": [{"text", "ids"}]}.
pub fn cases(rel: &str) -> Vec<(String, Vec<u32>)> {
    let v = read_json(rel);
    v["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| {
            let text = c["text"].as_str().expect("text").to_string();
            let ids = c["ids"].as_array().expect("ids").iter().map(|x| x.as_u64().expect("id") as u32).collect();
            (text, ids)
        })
        .collect()
}

/// A GGUF string array.
pub fn strings<S: AsRef<str>>(v: &[S]) -> Value {
    Value::Array(ValueType::String, v.iter().map(|s| Value::String(s.as_ref().to_string())).collect())
}

/// GPT-2's byte -> char map (independent re-derivation for the tests).
pub fn byte_char(b: u8) -> char {
    let printable = |c: u32| (0x21..=0x7E).contains(&c) || (0xA1..=0xAC).contains(&c) || (0xAE..=0xFF).contains(&c);
    if printable(b as u32) {
        return char::from_u32(b as u32).unwrap();
    }
    let n = (0..b as u32).filter(|&c| !printable(c)).count() as u32;
    char::from_u32(256 + n).unwrap()
}
