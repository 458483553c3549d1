//! Hostile or corrupt hyperparameters in a real model file (every tensor present, one header
//! value bad) fail the load with an error naming the key, before anything is sized by them:
//! no abort, no panic, no silent NaN.

use quarrel_gguf::{Gguf, GgufWriter, Value};
use quarrel_synth::archs::{write_arch_synth, ArchPreset, ArchSynthSpec};
use std::sync::Arc;

/// The tiny preset `name` as a file, then rewritten with `key` set to `v` (tensors kept).
fn with_key(name: &str, key: &str, v: Value) -> Gguf {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    let spec = ArchSynthSpec { preset: *ArchPreset::by_name(name).unwrap(), ftype: quarrel_synth::Ftype::F32, seed: 1, vocab_from: None };
    write_arch_synth(&spec, &path, &mut |_, _| {}).unwrap();
    let g = Gguf::open(&path).unwrap();
    let arch = g.architecture().unwrap().to_string();
    let key = key.replace("{arch}", &arch);
    let mut w = GgufWriter::new();
    for (k, val) in g.metadata() {
        w.set(k, if *k == key { v.clone() } else { val.clone() });
    }
    if !g.metadata().iter().any(|(k, _)| *k == key) {
        w.set(&key, v);
    }
    let mut data = vec![];
    for t in g.tensors() {
        w.add_tensor(&t.name, &t.dims, t.ty).unwrap();
        data.push(g.tensor(&t.name).unwrap().1.to_vec());
    }
    let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    Gguf::from_bytes(w.to_bytes(&refs).unwrap()).unwrap()
}

fn load_err(g: Gguf) -> String {
    let be = quarrel_cpu::CpuBackend::new(1).unwrap();
    match quarrel_models::registry::load(&be, &Arc::new(g)) {
        Ok(_) => "loaded".into(),
        Err(e) => e.to_string(),
    }
}

const ARCHS: [&str; 6] = ["tiny-mixtral", "tiny-granite", "tiny-nemotron-h", "tiny-mamba2", "tiny-gemma3", "tiny-granitehybrid"];

#[test]
fn the_unchanged_files_load() {
    for name in ARCHS {
        assert_eq!(load_err(with_key(name, "general.name", Value::String("x".into()))), "loaded", "{name}");
    }
}

#[test]
fn a_huge_block_count_is_an_error_not_an_abort() {
    for name in ARCHS {
        for n in [1u64 << 40, 1 << 20, 64] {
            let e = load_err(with_key(name, "{arch}.block_count", Value::U64(n)));
            assert!(e.contains("block_count"), "{name} block_count {n}: {e}");
        }
    }
}

#[test]
fn non_finite_float_hyperparameters_are_errors() {
    for name in ARCHS {
        for v in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            for key in ["{arch}.attention.layer_norm_rms_epsilon", "{arch}.rope.freq_base"] {
                let e = load_err(with_key(name, key, Value::F32(v)));
                let short = key.trim_start_matches("{arch}.");
                // models without RoPE (Mamba2, Nemotron-H's attention) do not read rope.freq_base
                if matches!(name, "tiny-mamba2" | "tiny-nemotron-h") && short == "rope.freq_base" {
                    continue;
                }
                assert!(e.contains(short) && e.contains("finite"), "{name} {key} = {v}: {e}");
            }
        }
    }
}

#[test]
fn dimensions_no_model_has_are_errors() {
    for name in ARCHS {
        let e = load_err(with_key(name, "{arch}.embedding_length", Value::U64(1 << 40)));
        assert!(e.contains("embedding_length"), "{name}: {e}");
    }
}
