//! The tokenizers of the model families beyond SmolLM2 and Gemma 3, on the vocabularies
//! llama.cpp ships for its own tokenizer tests (`scripts/fetch-testdata.sh`): Qwen2 / Qwen2.5 /
//! Qwen3 (`qwen2` pre-tokenizer), Llama 3.x (`llama-bpe`), Phi-3 (SentencePiece) and bge
//! (BERT's WordPiece).
//! Against llama.cpp (400 random strings and the GPL-3 text, tests/fixtures/tokenizer/
//! `<family>-{random,gpl3}.json`) and against Hugging Face's tokenizers (the `.inp` / `.out`
//! texts and ids beside each vocabulary).

mod common;

use common::{check_gpl3, check_random_cases, vocab};

const FAMILIES: [&str; 4] = ["qwen2", "llama-bpe", "phi-3", "bert-bge"];

#[test]
fn random_strings_match_llama_cpp() {
    for name in FAMILIES {
        if let Some((tok, _)) = vocab(name) {
            check_random_cases(&tok, &format!("tokenizer/{name}-random.json"));
        }
    }
}

#[test]
fn gpl3_matches_llama_cpp() {
    for name in FAMILIES {
        if let Some((tok, _)) = vocab(name) {
            check_gpl3(&tok, &format!("tokenizer/{name}-gpl3.json"));
        }
    }
}

/// llama.cpp's test-tokenizer-0 protocol: `.inp` holds texts separated by
/// `\n__ggml_vocab_test__\n`, `.out` one line of ids per text, tokenized without BOS and without
/// parsing special tokens.
#[test]
fn hugging_face_references() {
    for name in FAMILIES {
        let Some((tok, path)) = vocab(name) else { continue };
        let read = |ext: &str| {
            let p = path.with_extension(format!("gguf.{ext}"));
            std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        };
        let (inp, out) = (read("inp"), read("out"));
        let mut texts: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
        if texts.last() == Some(&"") {
            texts.pop();
        }
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(texts.len(), lines.len(), "{name}: .inp and .out case counts");
        let mut bad = vec![];
        for (text, line) in texts.iter().zip(&lines) {
            let want: Vec<u32> = line.split_whitespace().map(|t| t.parse().unwrap()).collect();
            let got = tok.encode(text, false, false);
            if got != want {
                bad.push(format!("{text:?}\n  want {want:?}\n  got  {got:?}"));
            }
        }
        eprintln!("{name}: {}/{} Hugging Face references identical", texts.len() - bad.len(), texts.len());
        assert!(bad.is_empty(), "{name}: {} mismatches:\n{}", bad.len(), bad.join("\n"));
    }
}
