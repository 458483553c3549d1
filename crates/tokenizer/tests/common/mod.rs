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

/// `QUARREL_TESTDATA`: the folder of llama.cpp's test vocabularies and chat templates
/// (`scripts/fetch-testdata.sh`).
pub const TESTDATA: &str = "QUARREL_TESTDATA";

/// `$QUARREL_TESTDATA/<rel>`, or None (with the skip explained) when it is not set.
pub fn testdata(rel: &str) -> Option<PathBuf> {
    let Ok(dir) = std::env::var(TESTDATA) else {
        eprintln!("skipping: set {TESTDATA} to the folder scripts/fetch-testdata.sh prints to run this test");
        return None;
    };
    Some(PathBuf::from(dir).join(rel))
}

/// The tokenizer of llama.cpp's test vocabulary `ggml-vocab-<name>.gguf` and its path, or
/// None (with the skip explained) when `QUARREL_TESTDATA` is not set.
pub fn vocab(name: &str) -> Option<(Tokenizer, PathBuf)> {
    let path = testdata(&format!("vocab/ggml-vocab-{name}.gguf"))?;
    let g = Gguf::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Some((Tokenizer::from_gguf(&g).unwrap_or_else(|e| panic!("{}: {e}", path.display())), path))
}

fn ids_of(v: &serde_json::Value) -> Vec<u32> {
    v.as_array().expect("ids").iter().map(|x| x.as_u64().expect("id") as u32).collect()
}

/// Every case of a `<model>-random.json` fixture: ids with the case's flags, and the decoded
/// text of llama.cpp's ids.
pub fn check_random_cases(tok: &Tokenizer, fixture: &str) {
    let doc = read_json(fixture);
    let cases = doc["cases"].as_array().expect("cases");
    let (mut bad_ids, mut bad_dec) = (Vec::new(), Vec::new());
    for c in cases {
        let text = c["text"].as_str().unwrap();
        let want = ids_of(&c["ids"]);
        let got = tok.encode(text, c["add_special"].as_bool().unwrap(), c["parse_special"].as_bool().unwrap());
        if got != want {
            bad_ids.push(format!(
                "{text:?} (add_special {}, parse_special {})\n  want {want:?}\n  got  {got:?}",
                c["add_special"], c["parse_special"]
            ));
        }
        let dec = tok.decode(&want);
        if dec != c["decoded"].as_str().unwrap() {
            bad_dec.push(format!("{text:?}\n  want {:?}\n  got  {dec:?}", c["decoded"].as_str().unwrap()));
        }
    }
    let n = cases.len();
    eprintln!("{fixture}: ids {}/{n} identical, decode {}/{n} identical", n - bad_ids.len(), n - bad_dec.len());
    assert!(bad_ids.is_empty(), "{} id mismatches:\n{}", bad_ids.len(), bad_ids.join("\n"));
    assert!(bad_dec.is_empty(), "{} decode mismatches:\n{}", bad_dec.len(), bad_dec.join("\n"));
}

/// The whole GPL-3 text (`<model>-gpl3.json`): ids, and (but for WordPiece) the text back from them (after the
/// space a SentencePiece vocabulary with `add_space_prefix` puts first: llama.cpp's
/// detokenizer keeps it unless asked to remove special tokens).
pub fn check_gpl3(tok: &Tokenizer, name: &str) {
    let doc = read_json(name);
    let want = ids_of(&doc["ids"]);
    let text = std::fs::read_to_string(fixture("text/gpl-3.txt")).unwrap();
    let got = tok.encode(&text, true, true);
    assert_eq!(got.len(), doc["n_tokens"].as_u64().unwrap() as usize, "{name}: token count");
    assert_eq!(got, want, "{name}");
    // WordPiece lower-cases and drops spacing around punctuation: no way back to the text
    if tok.kind() == quarrel_tokenizer::VocabKind::Wpm {
        return;
    }
    let back = if tok.add_space_prefix() { format!(" {text}") } else { text };
    assert_eq!(tok.decode(&got), back, "{name}: decode");
}
