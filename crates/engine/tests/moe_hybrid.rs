//! MoE and hybrid Mamba2 architectures on their tiny synthetic models (`quarrel synth`
//! presets `tiny-*`, written here exactly as scripts/moe-fixtures.sh wrote them for
//! llama.cpp): logits vs llama.cpp's (committed fixtures, NMSE <= 1e-4 at every position),
//! prefill == token-by-token decode (NMSE <= 1e-5), 8 sequences batched == each alone.

mod common;
use common::*;
use quarrel_engine::EngineOptions;
use quarrel_models::synth::archs::{write_arch_synth, ArchPreset, ArchSynthSpec};
use quarrel_models::synth::Ftype;
use std::path::{Path, PathBuf};

const PRESETS: &[&str] = &[
    "tiny-mixtral",
    "tiny-granite",
    "tiny-granitemoe",
    "tiny-granitehybrid",
    "tiny-mamba2",
    "tiny-nemotron-h",
    "tiny-nemotron-h-moe",
];

/// The fixture models: Q4_K_M, seed 7 (as scripts/moe-fixtures.sh).
fn synth(name: &str, dir: &Path) -> PathBuf {
    let path = dir.join(format!("{name}.gguf"));
    let spec = ArchSynthSpec { preset: *ArchPreset::by_name(name).unwrap(), ftype: Ftype::Q4_K_M, seed: 7, vocab_from: None };
    write_arch_synth(&spec, &path, &mut |_, _| {}).unwrap();
    path
}

/// The fixed token sequence of the fixtures.
fn fixture_tokens() -> Vec<u32> {
    (0..16u32).map(|i| if i == 0 { 1 } else { (i * 97 + 13) % 509 + 3 }).collect()
}

#[test]
fn prefill_equals_decode_and_batch_equals_singles() {
    let dir = tempfile::tempdir().unwrap();
    for name in PRESETS {
        let path = synth(name, dir.path());
        let mut whole = engine(&path, EngineOptions { n_ctx: 64, n_batch: 512, n_seq: 8, ..Default::default() });
        let mut single = engine(&path, EngineOptions { n_ctx: 64, n_batch: 1, ..Default::default() });
        let mut chunked = engine(&path, EngineOptions { n_ctx: 64, n_batch: 7, ..Default::default() });
        let ids: Vec<u32> = (0..40).map(|i| (i * 37 + 5) % 500).collect();
        let a = whole.eval_all(&ids).unwrap();
        let b = single.eval_all(&ids).unwrap();
        let c = chunked.eval_all(&ids).unwrap();
        for (p, ((x, y), z)) in a.iter().zip(&b).zip(&c).enumerate() {
            assert!(x.iter().all(|v| v.is_finite()), "{name}: non-finite logits at {p}");
            let e = nmse(x, y);
            assert!(e <= 1e-5, "{name}: position {p}: prefill vs decode nmse {e}");
            let e = nmse(x, z);
            assert!(e <= 1e-5, "{name}: position {p}: prefill vs chunks of 7 nmse {e}");
        }
        let seqs: Vec<Vec<u32>> = (0..8).map(|s| ids[s..s + 5 + 3 * s].to_vec()).collect();
        let batched = whole.forward_batch(&seqs).unwrap();
        for (s, toks) in seqs.iter().enumerate() {
            let alone = whole.eval_all(toks).unwrap();
            for (p, (x, y)) in batched[s].iter().zip(&alone).enumerate() {
                let e = nmse(x, y);
                assert!(e <= 1e-5, "{name}: sequence {s} position {p}: batched vs alone nmse {e}");
            }
        }
    }
}
