//! Every supported `tokenizer.ggml.pre` type against llama.cpp: SmolLM2's vocabulary and
//! merges with the pre value swapped (tests/fixtures/tokenizer/pretokenizers.json), so the
//! hand-written splitters and the regex path are all exercised on the same 120 texts.

mod common;

use common::{open, read_json, with_key, SMOLLM2};
use quarrel_gguf::{Gguf, Value};
use quarrel_tokenizer::{Tokenizer, TokenizerError};

fn with_pre(base: &Gguf, pre: &str) -> Gguf {
    with_key(base, "tokenizer.ggml.pre", Value::String(pre.to_string()))
}

#[test]
fn all_pre_types_match_llama_cpp() {
    let Some(base) = open(SMOLLM2) else { return };
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
    let Some(base) = open(SMOLLM2) else { return };
    for pre in ["no-such-pre", "kimi-k2", "afmoe", "tiny_aya"] {
        match Tokenizer::from_gguf(&with_pre(&base, pre)) {
            Err(TokenizerError::Unsupported(msg)) => eprintln!("{pre}: {msg}"),
            other => panic!("{pre}: expected Unsupported, got {other:?}"),
        }
    }
}
