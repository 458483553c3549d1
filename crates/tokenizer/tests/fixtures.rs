//! Token ids must equal llama.cpp's (llama-tokenize, parse_special = true, add_bos per model)
//! for every case of the shared fixtures.

mod common;

use common::{cases, load, GEMMA3, SMOLLM2};

fn check(env: &str, fixture: &str) {
    let Some(tok) = load(env) else { return };
    let cases = cases(fixture);
    let mut failures = Vec::new();
    for (text, want) in &cases {
        let got = tok.encode(text, true, true);
        if &got != want {
            failures.push(format!("{text:?}\n  want {want:?}\n  got  {got:?}"));
        }
    }
    eprintln!("{fixture}: {}/{} cases identical", cases.len() - failures.len(), cases.len());
    assert!(failures.is_empty(), "{} mismatches:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn smollm2_matches_llama_cpp() {
    check(SMOLLM2, "smollm2/tokenize.json");
}

#[test]
fn gemma3_matches_llama_cpp() {
    check(GEMMA3, "gemma3-270m/tokenize.json");
}
