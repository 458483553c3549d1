//! `Consistency::consistency` on every tiny MoE / hybrid synthetic model (`quarrel synth`
//! presets `tiny-*`) on the CPU backend.

use quarrel_bench::{Consistency, ConsistencyOptions};
use quarrel_cpu::CpuBackend;
use quarrel_engine::{Engine, EngineOptions};
use quarrel_synth::archs::{ArchPreset, ArchSynthSpec};
use quarrel_synth::Ftype;
use std::path::{Path, PathBuf};

fn synth_as(name: &str, dir: &Path, ftype: Ftype) -> PathBuf {
    ArchSynthSpec { preset: *ArchPreset::by_name(name).unwrap(), ftype, seed: 7, vocab_from: None }.write_into(dir).unwrap()
}

fn engine(path: &Path, opts: EngineOptions) -> Engine<CpuBackend> {
    let t = std::env::var("QUARREL_TEST_THREADS").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    Engine::load(CpuBackend::new(t).unwrap(), path, opts).unwrap()
}

/// `Consistency::consistency` (`quarrel consistency`) on the CPU, which computes batch-invariantly:
/// every compared position bit for bit identical, past the 64-token attention switch and across
/// prefill chunks; a wrong request gets an error, not a panic.
#[test]
fn consistency_report_is_exact_on_the_cpu() {
    let dir = tempfile::tempdir().unwrap();
    for name in ArchPreset::tiny().map(|p| p.name) {
        let path = synth_as(name, dir.path(), Ftype::Q4_K_M);
        let mut e = engine(&path, EngineOptions { n_ctx: 80, n_batch: 33, n_seq: 4, ..Default::default() });
        let o = ConsistencyOptions { n_tokens: 80, n_prefill: 37, n_seqs: 4, seed: 3 };
        let checks = e.consistency(&o).unwrap();
        assert_eq!(
            checks.iter().map(|c| c.name).collect::<Vec<_>>(),
            ["prefill vs prefill+decode", "prefill vs decode", "batched vs alone"]
        );
        for c in &checks {
            // every check covers 80 positions (the batched one: 4 sequences x 20 decoded tokens)
            assert!(c.nmse.len() >= 80, "{name} {}: {} positions", c.name, c.nmse.len());
            assert_eq!(c.identical(), c.nmse.len(), "{name} {}: worst nmse {:.2e}", c.name, c.worst());
            assert_eq!(c.argmax_differ, 0);
        }
        assert!(e.consistency(&ConsistencyOptions { n_seqs: 5, ..o.clone() }).is_err(), "more sequences than the cache holds");
        assert!(e.consistency(&ConsistencyOptions { n_tokens: 81, ..o.clone() }).is_err(), "longer than the context");
        assert!(e.consistency(&ConsistencyOptions { n_prefill: 81, ..o.clone() }).is_err(), "prefill past the tokens");
        // the engine still works after the refused requests
        assert_eq!(e.consistency(&o).unwrap()[1].worst(), 0.0);
    }
}
