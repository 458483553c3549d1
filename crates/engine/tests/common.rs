//! Shared helpers for the engine's integration tests.
#![allow(dead_code)]

use quarrel_cpu::CpuBackend;
use quarrel_engine::{Completion, Engine, EngineOptions, GenerateParams, SamplingParams};
use std::path::PathBuf;

pub fn fixture(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(rel)
}

/// A model path from the environment variable `var`; None (test skipped with a message) when
/// unset.
fn model_from_env(var: &str) -> Option<PathBuf> {
    match std::env::var_os(var) {
        Some(p) => Some(PathBuf::from(p)),
        None => {
            eprintln!("{var} not set: skipping (scripts/test.sh sets it)");
            None
        }
    }
}

/// The SmolLM2 model from `QUARREL_SMOLLM2`; None (test skipped with a message) when unset.
pub fn smollm2() -> Option<PathBuf> {
    model_from_env("QUARREL_SMOLLM2")
}

/// The Gemma-3-270m model from `QUARREL_GEMMA3`; None (test skipped with a message) when unset.
pub fn gemma3() -> Option<PathBuf> {
    model_from_env("QUARREL_GEMMA3")
}

/// nomic-embed-text-v1.5 F16 from `QUARREL_NOMIC`; None (test skipped with a message) when unset.
pub fn nomic() -> Option<PathBuf> {
    model_from_env("QUARREL_NOMIC")
}

/// An engine on the CPU backend; `QUARREL_TEST_THREADS` overrides the thread count (all
/// cores by default).
pub fn engine(path: &std::path::Path, opts: EngineOptions) -> Engine<CpuBackend> {
    let t = std::env::var("QUARREL_TEST_THREADS").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    Engine::load(CpuBackend::new(t).unwrap(), path, opts).unwrap()
}

/// [`engine`] as the CLI and server load an encoder: F16 weights on the CPU's matrix units
/// where it has them (`CpuBackend::set_matrix_units`).
pub fn encoder_engine(path: &std::path::Path, opts: EngineOptions) -> Engine<CpuBackend> {
    let t = std::env::var("QUARREL_TEST_THREADS").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    let be = CpuBackend::new(t).unwrap();
    be.set_matrix_units(true);
    Engine::load(be, path, opts).unwrap()
}

/// Normalized mean squared error Σ(a-b)² / Σa².
pub fn nmse(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum();
    num / den.max(1e-30)
}

/// Per-position logits of two runs of the same tokens agree: same length, finite, NMSE at
/// most `tol` at every position. `what` names the comparison in the failure message.
pub fn assert_logits_close(what: &str, a: &[Vec<f32>], b: &[Vec<f32>], tol: f64) {
    assert_eq!(a.len(), b.len(), "{what}: {} vs {} positions", a.len(), b.len());
    for (p, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(x.iter().all(|v| v.is_finite()), "{what}: non-finite logits at position {p}");
        let e = nmse(x, y);
        assert!(e <= tol, "{what}: position {p}: nmse {e}");
    }
}

/// One batched forward of `seqs` gives each sequence the logits it gets alone.
pub fn assert_batch_equals_singles(what: &str, e: &mut Engine<CpuBackend>, seqs: &[Vec<u32>], tol: f64) {
    let batched = e.forward_batch(seqs).unwrap();
    assert_eq!(batched.len(), seqs.len(), "{what}: one result per sequence");
    for (s, toks) in seqs.iter().enumerate() {
        let alone = e.eval_all(toks).unwrap();
        assert_logits_close(&format!("{what}: sequence {s}: batched vs alone"), &batched[s], &alone, tol);
    }
}

/// Perplexity of the model at `path` over the GPL-3 text in 14 chunks of 512 tokens is within
/// 0.5% of llama.cpp's `reference` for the same model and text.
pub fn assert_perplexity_matches(path: &std::path::Path, reference: f64) {
    let text = std::fs::read_to_string(fixture("text/gpl-3.txt")).unwrap();
    let mut e = engine(path, EngineOptions { n_ctx: 512, n_batch: 512, ..Default::default() });
    let r = e.perplexity(&text, 512, &mut |_| {}).unwrap();
    let rel = (r.ppl - reference).abs() / reference;
    eprintln!("PPL = {:.4} (llama.cpp {reference}), {} chunks, rel diff {:.4}%", r.ppl, r.n_chunks, rel * 100.0);
    assert_eq!(r.n_chunks, 14);
    assert!(rel < 0.005, "perplexity {} is {:.3}% away from llama.cpp's {reference}", r.ppl, rel * 100.0);
}

/// One case of a llama.cpp greedy fixture and the engine's greedy completion of it.
pub struct GreedyCase {
    pub prompt: String,
    /// llama.cpp's completion.
    pub want: String,
    pub got: Completion,
}

impl GreedyCase {
    /// Our text is llama.cpp's, up to trailing white space.
    pub fn identical(&self) -> bool {
        self.got.text.trim_end() == self.want.trim_end()
    }
}

/// Every case of the greedy fixture `rel` (`{"cases": [{"prompt", "completion", "n_predict"}]}`,
/// written by scripts/ from llama.cpp): the prompt tokenized with BOS, then `n_predict` tokens
/// generated greedily.
pub fn greedy_cases(e: &mut Engine<CpuBackend>, rel: &str) -> Vec<GreedyCase> {
    let fx: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(fixture(rel)).unwrap()).unwrap();
    let cases = fx["cases"].as_array().unwrap();
    assert!(!cases.is_empty(), "{rel}: no cases");
    cases
        .iter()
        .map(|c| {
            let prompt = c["prompt"].as_str().unwrap().to_string();
            let want = c["completion"].as_str().unwrap().to_string();
            let n = c["n_predict"].as_u64().unwrap() as usize;
            let ids = e.tokenize(&prompt, true);
            let params = GenerateParams { sampling: SamplingParams::greedy(), max_tokens: n, ..Default::default() };
            let got = e.generate(&ids, &params, &mut |_| true).unwrap();
            GreedyCase { prompt, want, got }
        })
        .collect()
}
