//! SmolLM2-135M-Instruct Q4_1 against llama.cpp's reference outputs (greedy texts, perplexity).

mod common;
use common::*;
use quarrel_engine::{EngineOptions, GenerateParams, SamplingParams};

#[test]
fn greedy_matches_llama_cpp() {
    let Some(path) = smollm2() else { return };
    let mut e = engine(&path, EngineOptions { n_ctx: 512, ..Default::default() });
    let cases = greedy_cases(&mut e, "smollm2/greedy.json");
    let (mut identical, mut prefix16) = (0, 0);
    for c in &cases {
        let (same, got) = (c.identical(), &c.got);
        // first 16 generated tokens: their text must be a prefix of the reference
        let first16 = e.tokenizer.decode(&got.tokens[..got.tokens.len().min(16)]);
        let p16 = c.want.starts_with(&first16);
        identical += same as usize;
        prefix16 += p16 as usize;
        eprintln!("{} {} {:?}\n   got:  {:?}\n   want: {:?}", same as u8, p16 as u8, c.prompt, got.text, c.want);
    }
    eprintln!("greedy: {identical}/{} identical, {prefix16}/{} identical over 16 tokens", cases.len(), cases.len());
    assert!(identical + 1 >= cases.len(), "only {identical}/{} completions identical", cases.len());
    assert_eq!(prefix16, cases.len());
}

#[test]
fn perplexity_matches_llama_cpp() {
    let Some(path) = smollm2() else { return };
    assert_perplexity_matches(&path, 18.3914);
}

#[test]
fn prefill_equals_token_by_token_decode() {
    let Some(path) = smollm2() else { return };
    let mut whole = engine(&path, EngineOptions { n_ctx: 128, n_batch: 512, ..Default::default() });
    let mut single = engine(&path, EngineOptions { n_ctx: 128, n_batch: 1, ..Default::default() });
    let ids = whole.tokenize("The quick brown fox jumps over the lazy dog because it wanted to", true);
    let (a, b) = (whole.eval_all(&ids).unwrap(), single.eval_all(&ids).unwrap());
    assert_logits_close("prefill vs decode", &a, &b, 1e-6);
}

#[test]
fn batch_of_sequences_equals_singles() {
    let Some(path) = smollm2() else { return };
    let mut e = engine(&path, EngineOptions { n_ctx: 128, n_seq: 4, ..Default::default() });
    let seqs: Vec<Vec<u32>> =
        ["Hello there, how are", "1 2 3 4 5 6 7", "Paris is the capital of", "fn main() {"].iter().map(|t| e.tokenize(t, true)).collect();
    assert_batch_equals_singles("smollm2", &mut e, &seqs, 1e-6);
}

#[test]
fn prompt_longer_than_context_is_a_clear_error() {
    let Some(path) = smollm2() else { return };
    let mut e = engine(&path, EngineOptions { n_ctx: 16, ..Default::default() });
    let ids = e.tokenize(&"word ".repeat(40), true);
    let err = e.generate(&ids, &GenerateParams::default(), &mut |_| true).unwrap_err();
    assert!(err.to_string().contains("does not fit the context"), "{err}");
    // the engine still works afterwards
    let ids = e.tokenize("Hi", true);
    let p = GenerateParams { sampling: SamplingParams::greedy(), max_tokens: 3, ..Default::default() };
    assert_eq!(e.generate(&ids, &p, &mut |_| true).unwrap().tokens.len(), 3);
}

#[test]
fn same_seed_same_text_and_stop_strings() {
    let Some(path) = smollm2() else { return };
    let mut e = engine(&path, EngineOptions { n_ctx: 256, ..Default::default() });
    let ids = e.tokenize("Once upon a time", true);
    let p = GenerateParams {
        max_tokens: 24,
        sampling: SamplingParams { seed: 7, temperature: 1.0, ..Default::default() },
        ..Default::default()
    };
    let a = e.generate(&ids, &p, &mut |_| true).unwrap();
    let b = e.generate(&ids, &p, &mut |_| true).unwrap();
    assert_eq!(a.tokens, b.tokens);
    // stop at the first space after some text: output never contains the stop string
    let mut p2 = GenerateParams { sampling: SamplingParams::greedy(), max_tokens: 48, ..Default::default() };
    let full = e.generate(&ids, &p2, &mut |_| true).unwrap().text;
    let stop = full.trim_start().split(' ').nth(1).unwrap().to_string();
    p2.stop = vec![stop.clone()];
    let mut streamed = String::new();
    let c = e
        .generate(&ids, &p2, &mut |ev| {
            streamed.push_str(ev.text);
            true
        })
        .unwrap();
    assert_eq!(c.finish_reason, quarrel_engine::FinishReason::Stop);
    assert!(!c.text.contains(&stop), "{:?} contains stop {stop:?}", c.text);
    assert_eq!(streamed, c.text);
    assert!(full.starts_with(&c.text));
}
