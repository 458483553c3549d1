//! Differential tests against llama.cpp outputs recorded in tests/fixtures/tokenizer/
//! (see its README): 400 random strings per model, and the whole GPL-3 text.

mod common;

use common::{load, read_json, GEMMA3, SMOLLM2};
use quarrel_tokenizer::Tokenizer;

fn ids_of(v: &serde_json::Value) -> Vec<u32> {
    v.as_array().expect("ids").iter().map(|x| x.as_u64().expect("id") as u32).collect()
}

fn random_cases(tok: &Tokenizer, fixture: &str) {
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
    eprintln!(
        "{fixture}: ids {}/{} identical, decode {}/{} identical",
        cases.len() - bad_ids.len(),
        cases.len(),
        cases.len() - bad_dec.len(),
        cases.len()
    );
    assert!(bad_ids.is_empty(), "{} id mismatches:\n{}", bad_ids.len(), bad_ids.join("\n"));
    assert!(bad_dec.is_empty(), "{} decode mismatches:\n{}", bad_dec.len(), bad_dec.join("\n"));
}

fn gpl3(tok: &Tokenizer, fixture: &str) {
    let doc = read_json(fixture);
    let want = ids_of(&doc["ids"]);
    let text = std::fs::read_to_string(common::fixture("text/gpl-3.txt")).unwrap();
    let t0 = std::time::Instant::now();
    let got = tok.encode(&text, true, true);
    let dt = t0.elapsed();
    eprintln!("{fixture}: {} bytes -> {} tokens in {:.2} ms", text.len(), got.len(), dt.as_secs_f64() * 1e3);
    assert_eq!(got.len(), doc["n_tokens"].as_u64().unwrap() as usize);
    assert_eq!(got, want);
    assert_eq!(tok.decode(&got), text);
}

/// One test per model and check: `$check(&tokenizer, $fixture)` where the model is there.
macro_rules! reference_tests {
    ($($name:ident: $model:ident, $check:ident, $fixture:literal;)*) => {$(
        #[test]
        fn $name() {
            if let Some(tok) = load($model) {
                $check(&tok, $fixture);
            }
        }
    )*};
}

reference_tests! {
    smollm2_random_strings: SMOLLM2, random_cases, "tokenizer/smollm2-random.json";
    gemma3_random_strings: GEMMA3, random_cases, "tokenizer/gemma3-random.json";
    smollm2_gpl3: SMOLLM2, gpl3, "tokenizer/smollm2-gpl3.json";
    gemma3_gpl3: GEMMA3, gpl3, "tokenizer/gemma3-gpl3.json";
}
