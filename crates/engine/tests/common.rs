//! Shared helpers for the engine's integration tests.
#![allow(dead_code)]

use quarrel_cpu::CpuBackend;
use quarrel_engine::{Engine, EngineOptions};
use std::path::PathBuf;

pub fn fixture(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(rel)
}

/// The SmolLM2 model from `QUARREL_SMOLLM2`; None (test skipped with a message) when unset.
pub fn smollm2() -> Option<PathBuf> {
    match std::env::var_os("QUARREL_SMOLLM2") {
        Some(p) => Some(PathBuf::from(p)),
        None => {
            eprintln!("QUARREL_SMOLLM2 not set: skipping (scripts/test.sh sets it)");
            None
        }
    }
}

/// The Gemma-3-270m model from `QUARREL_GEMMA3`; None (test skipped with a message) when unset.
pub fn gemma3() -> Option<PathBuf> {
    match std::env::var_os("QUARREL_GEMMA3") {
        Some(p) => Some(PathBuf::from(p)),
        None => {
            eprintln!("QUARREL_GEMMA3 not set: skipping (scripts/test.sh sets it)");
            None
        }
    }
}

/// An engine on the CPU backend; `QUARREL_TEST_THREADS` overrides the thread count (all
/// cores by default).
pub fn engine(path: &std::path::Path, opts: EngineOptions) -> Engine<CpuBackend> {
    let t = std::env::var("QUARREL_TEST_THREADS").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    Engine::load(CpuBackend::new(t).unwrap(), path, opts).unwrap()
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
