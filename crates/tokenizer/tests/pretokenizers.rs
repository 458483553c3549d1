//! Every supported `tokenizer.ggml.pre` type against llama.cpp: SmolLM2's vocabulary and
//! merges with the pre value swapped (tests/fixtures/tokenizer/pretokenizers.json), so the
//! hand-written splitters and the regex path are all exercised on the same 120 texts.

mod common;

use common::{read_json, SMOLLM2};
use quarrel_gguf::{Gguf, GgufWriter, Value};
use quarrel_tokenizer::{Tokenizer, TokenizerError};

fn with_pre(base: &Gguf, pre: &str) -> Gguf {
    let mut w = GgufWriter::new();
    for (k, v) in base.metadata() {
        w.set(k, v.clone());
    }
    w.set("tokenizer.ggml.pre", Value::String(pre.to_string()));
    Gguf::from_bytes(w.to_bytes(&[]).unwrap()).unwrap()
}

#[test]
fn all_pre_types_match_llama_cpp() {
    let Ok(path) = std::env::var(SMOLLM2) else {
        eprintln!("skipping: set {SMOLLM2} to run this test");
        return;
    };
    let base = Gguf::open(&path).unwrap();
    let doc = read_json("tokenizer/pretokenizers.json");
    let texts: Vec<&str> = doc["texts"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    let mut failures = Vec::new();
    let mut n_pre = 0;
    for (pre, all_ids) in doc["ids"].as_object().unwrap() {
        let tok = Tokenizer::from_gguf(&with_pre(&base, pre)).unwrap_or_else(|e| panic!("{pre}: {e}"));
        n_pre += 1;
        let mut ok = 0;
        for (text, want) in texts.iter().zip(all_ids.as_array().unwrap()) {
            let want: Vec<u32> = want.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
            let got = tok.encode(text, false, true);
            if got == want {
                ok += 1;
            } else if failures.len() < 30 {
                failures.push(format!("[{pre}] {text:?}\n  want {want:?}\n  got  {got:?}"));
            }
        }
        if ok != texts.len() {
            eprintln!("{pre}: {ok}/{} identical", texts.len());
        }
    }
    eprintln!("{n_pre} pre-tokenizer types checked");
    assert!(failures.is_empty(), "mismatches:\n{}", failures.join("\n"));
}

#[test]
fn unknown_and_unsupported_pre_are_errors() {
    let Ok(path) = std::env::var(SMOLLM2) else {
        eprintln!("skipping: set {SMOLLM2} to run this test");
        return;
    };
    let base = Gguf::open(&path).unwrap();
    for pre in ["no-such-pre", "kimi-k2", "afmoe", "tiny_aya"] {
        match Tokenizer::from_gguf(&with_pre(&base, pre)) {
            Err(TokenizerError::Unsupported(msg)) => eprintln!("{pre}: {msg}"),
            other => panic!("{pre}: expected Unsupported, got {other:?}"),
        }
    }
}
