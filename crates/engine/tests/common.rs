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
