//! Hostile or corrupt hyperparameters in a real model file (every tensor present, one header
//! value bad) fail the load with an error naming the key, before anything is sized by them:
//! no abort, no panic, no silent NaN, no silently dropped layers or tensors.

use quarrel_gguf::{Gguf, GgufWriter, Value};
use quarrel_synth::archs::{write_arch_synth, ArchPreset, ArchSynthSpec};
use std::sync::Arc;

/// The tiny preset `p` as a file, then rewritten with each `(key, value)` set (`None`:
/// removed; `{arch}` in a key is the file's architecture), tensors kept.
fn with_keys(p: &ArchPreset, edits: &[(&str, Option<Value>)]) -> Gguf {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    let spec = ArchSynthSpec { preset: *p, ftype: quarrel_synth::Ftype::F32, seed: 1, vocab_from: None };
    write_arch_synth(&spec, &path, &mut |_, _| {}).unwrap();
    let g = Gguf::open(&path).unwrap();
    let arch = g.architecture().unwrap().to_string();
    let edits: Vec<(String, Option<Value>)> = edits.iter().map(|(k, v)| (k.replace("{arch}", &arch), v.clone())).collect();
    let mut w = GgufWriter::new();
    for (k, val) in g.metadata() {
        if !edits.iter().any(|(e, _)| e == k) {
            w.set(k, val.clone());
        }
    }
    for (k, v) in &edits {
        if let Some(v) = v {
            w.set(k, v.clone());
        }
    }
    let mut data = vec![];
    for t in g.tensors() {
        w.add_tensor(&t.name, &t.dims, t.ty).unwrap();
        data.push(g.tensor(&t.name).unwrap().1.to_vec());
    }
    let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    Gguf::from_bytes(w.to_bytes(&refs).unwrap()).unwrap()
}

fn with_key(p: &ArchPreset, key: &str, v: Value) -> Gguf {
    with_keys(p, &[(key, Some(v))])
}

fn load_err(g: Gguf) -> String {
    let be = quarrel_cpu::CpuBackend::new(1).unwrap();
    match quarrel_models::registry::load(&be, &Arc::new(g)) {
        Ok(_) => "loaded".into(),
        Err(e) => e.to_string(),
    }
}

/// Every tiny preset: one model per registered architecture.
fn archs() -> impl Iterator<Item = &'static ArchPreset> {
    ArchPreset::tiny()
}

/// The presets whose attention layers apply RoPE (and so read the `rope.*` keys).
fn rope_archs() -> impl Iterator<Item = &'static ArchPreset> {
    archs().filter(|p| !matches!(p.arch, "mamba2" | "nemotron_h" | "nemotron_h_moe"))
}

#[test]
fn the_unchanged_files_load() {
    for p in archs() {
        assert_eq!(load_err(with_key(p, "general.name", Value::String("x".into()))), "loaded", "{}", p.name);
    }
}

#[test]
fn a_huge_block_count_is_an_error_not_an_abort() {
    for p in archs() {
        // 2^40: the count that aborted with "memory allocation of ... bytes failed"
        for n in [1u64 << 40, 1 << 20, 64] {
            let e = load_err(with_key(p, "{arch}.block_count", Value::U64(n)));
            assert!(e.contains("block_count") && e.contains(&n.to_string()), "{} block_count {n}: {e}", p.name);
        }
    }
}

#[test]
fn a_block_count_below_the_files_layers_is_an_error() {
    for p in archs() {
        let n = p.n_layer() as u64 - 1;
        let e = load_err(with_key(p, "{arch}.block_count", Value::U64(n)));
        assert!(e.contains("block_count") && e.contains(&format!("layer {n}")), "{} block_count {n}: {e}", p.name);
    }
}

#[test]
fn non_finite_float_hyperparameters_are_errors() {
    for p in archs() {
        for v in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            for key in ["{arch}.attention.layer_norm_rms_epsilon", "{arch}.rope.freq_base"] {
                let short = key.trim_start_matches("{arch}.");
                // models without RoPE (Mamba2, Nemotron-H's attention) do not read rope.freq_base
                if short == "rope.freq_base" && !rope_archs().any(|r| r.name == p.name) {
                    continue;
                }
                let e = load_err(with_key(p, key, Value::F32(v)));
                assert!(e.contains(short) && e.contains("finite"), "{} {key} = {v}: {e}", p.name);
            }
        }
    }
}

/// Finite values that still make every output NaN: a negative epsilon (square root of a
/// negative in RMSNorm), a RoPE base of zero or below, a negative RoPE scaling factor.
#[test]
fn float_hyperparameters_outside_their_range_are_errors() {
    for p in archs() {
        let e = load_err(with_key(p, "{arch}.attention.layer_norm_rms_epsilon", Value::F32(-1e-5)));
        assert!(e.contains("layer_norm_rms_epsilon = -0.00001") && e.contains("negative"), "{}: {e}", p.name);
    }
    for p in rope_archs() {
        for v in [0.0, -10000.0] {
            let e = load_err(with_key(p, "{arch}.rope.freq_base", Value::F32(v)));
            assert!(e.contains(&format!("rope.freq_base = {v}")) && e.contains("positive"), "{} freq_base {v}: {e}", p.name);
        }
    }
    // linear scaling is read by the architectures that support it
    for p in archs().filter(|p| matches!(p.arch, "llama" | "gemma3")) {
        let linear = |f: f32| {
            with_keys(
                p,
                &[("{arch}.rope.scaling.type", Some(Value::String("linear".into()))), ("{arch}.rope.scaling.factor", Some(Value::F32(f)))],
            )
        };
        let e = load_err(linear(-2.0));
        assert!(e.contains("rope.scaling.factor = -2") && e.contains("negative"), "{}: {e}", p.name);
        // 0 means "no scaling" in llama.cpp
        assert_eq!(load_err(linear(0.0)), "loaded", "{}", p.name);
        assert_eq!(load_err(linear(2.0)), "loaded", "{}", p.name);
    }
}

#[test]
fn rope_dimension_counts_outside_the_head_are_errors() {
    for p in rope_archs() {
        for n in [0u64, 3, p.head_dim as u64 + 2, 1 << 20] {
            let e = load_err(with_key(p, "{arch}.rope.dimension_count", Value::U64(n)));
            assert!(e.contains(&format!("rope.dimension_count = {n}")), "{} n_rot {n}: {e}", p.name);
        }
        // a partial rotation is a real layout (e.g. GPT-NeoX's rotary_pct), unless the file's
        // per-pair factors (Llama 3's rope_freqs, LongRoPE's) were written for another one
        let half = with_key(p, "{arch}.rope.dimension_count", Value::U64(p.head_dim as u64 / 2));
        let n_rot = if p.n_rot == 0 { p.head_dim } else { p.n_rot };
        if (p.llama3_rope.is_some() || p.longrope.is_some()) && n_rot != p.head_dim / 2 {
            let e = load_err(half);
            assert!(e.contains(&format!("values, expected {}", p.head_dim / 4)), "{}: {e}", p.name);
        } else {
            assert_eq!(load_err(half), "loaded", "{}", p.name);
        }
    }
}

#[test]
fn dimensions_no_model_has_are_errors() {
    for p in archs() {
        for key in ["{arch}.embedding_length", "{arch}.vocab_size", "{arch}.context_length"] {
            let e = load_err(with_key(p, key, Value::U64(1 << 40)));
            assert!(e.contains(key.trim_start_matches("{arch}.")), "{} {key}: {e}", p.name);
        }
    }
}

#[test]
fn head_counts_that_do_not_divide_are_errors() {
    for p in archs().filter(|p| p.n_head > 1 && p.arch != "mamba2") {
        // a head count the KV heads do not divide
        let v = p.n_head as u64 + 1;
        let e = load_err(with_key(p, "{arch}.attention.head_count_kv", Value::U64(v)));
        assert!(e.contains("head_count") && e.contains(&v.to_string()), "{} head_count_kv = {v}: {e}", p.name);
        // more heads than values (no key_length: heads of no values), or than the tensors have
        let e = load_err(with_key(p, "{arch}.attention.head_count", Value::U64(1 << 20)));
        assert!(e.contains("head_count = 1048576") || e.contains("attn_q.weight\" has shape"), "{}: {e}", p.name);
    }
}

#[test]
fn shared_expert_tensors_without_their_width_are_errors() {
    for p in archs().filter(|p| p.n_ff_shexp > 0) {
        for v in [None, Some(Value::U64(0))] {
            let e = load_err(with_keys(p, &[("{arch}.expert_shared_feed_forward_length", v.clone())]));
            assert!(e.contains("expert_shared_feed_forward_length") && e.contains("ffn_down_shexp"), "{} {v:?}: {e}", p.name);
        }
    }
}
