//! Architecture-level checks on synthetic models (random weights, real layouts) written by
//! `quarrel synth`: they need no download, so they run everywhere.

mod common;
use common::*;
use quarrel_engine::{EngineOptions, GenerateParams, SamplingParams};
use quarrel_synth::{write_synth, Ftype, Preset, SynthSpec};

fn synth(ftype: &str, dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join(format!("tiny-{ftype}.gguf"));
    let spec = SynthSpec::new(*Preset::by_name("tiny").unwrap(), Ftype::from_name(ftype).unwrap()).seed(7);
    write_synth(&spec, &path, &mut |_, _| {}).unwrap();
    path
}

#[test]
fn prefill_equals_decode_and_batch_equals_singles_on_synthetic_models() {
    let dir = tempfile::tempdir().unwrap();
    for ftype in ["f32", "f16", "q8_0", "q4_0", "q4_1", "q5_0", "q4_k_m", "q6_k"] {
        let path = synth(ftype, dir.path());
        let mut whole = engine(&path, EngineOptions { n_ctx: 96, n_batch: 512, n_seq: 4, ..Default::default() });
        let mut single = engine(&path, EngineOptions { n_ctx: 96, n_batch: 1, ..Default::default() });
        let ids: Vec<u32> = (0..40).map(|i| (i * 37 + 5) % 500).collect();
        let (a, b) = (whole.eval_all(&ids).unwrap(), single.eval_all(&ids).unwrap());
        assert_logits_close(&format!("{ftype}: prefill vs decode"), &a, &b, 1e-10);
        let seqs: Vec<Vec<u32>> = vec![ids[..10].to_vec(), ids[3..20].to_vec(), ids[7..12].to_vec()];
        assert_batch_equals_singles(ftype, &mut whole, &seqs, 1e-10);
    }
}

#[test]
fn generation_streams_and_finishes_on_synthetic_model() {
    let dir = tempfile::tempdir().unwrap();
    let path = synth("q4_0", dir.path());
    let mut e = engine(&path, EngineOptions { n_ctx: 64, ..Default::default() });
    let ids = e.tokenize("hello world", true);
    let p = GenerateParams { sampling: SamplingParams::greedy(), max_tokens: 10, ignore_eos: true, ..Default::default() };
    let mut n_events = 0;
    let c = e
        .generate(&ids, &p, &mut |_| {
            n_events += 1;
            true
        })
        .unwrap();
    assert_eq!(c.tokens.len(), 10);
    assert_eq!(c.finish_reason, quarrel_engine::FinishReason::Length);
    assert!(n_events >= 10);
    // context exhaustion ends the generation cleanly
    let p = GenerateParams { max_tokens: 1000, ..p };
    let c = e.generate(&ids, &p, &mut |_| true).unwrap();
    assert_eq!(c.finish_reason, quarrel_engine::FinishReason::ContextFull);
    assert_eq!(ids.len() + c.tokens.len(), 64);
    // cancel after 3 tokens
    let mut k = 0;
    let c = e
        .generate(&ids, &p, &mut |_| {
            k += 1;
            k < 3
        })
        .unwrap();
    assert_eq!(c.finish_reason, quarrel_engine::FinishReason::Cancelled);
}

/// Quantized KV caches: the key offset comes from the load-time calibration pass, so a
/// sequence's logits do not depend on what the engine ran before it (bit for bit), and they
/// stay close to the f16 cache's.
#[test]
fn quantized_kv_results_do_not_depend_on_earlier_requests() {
    use quarrel_core::KvType;
    let dir = tempfile::tempdir().unwrap();
    let path = synth("q8_0", dir.path());
    let a: Vec<u32> = (0..33).map(|i| (i * 37 + 5) % 500).collect();
    let b: Vec<u32> = (0..40).map(|i| (i * 11 + 200) % 500).collect();
    let opts = |kv_type| EngineOptions { n_ctx: 96, n_seq: 2, kv_type, ..Default::default() };
    let mut reference = engine(&path, opts(KvType::F16));
    let want = reference.eval_all(&b).unwrap();
    for kv in [KvType::Q8_0, KvType::Q4_0] {
        let mut fresh = engine(&path, opts(kv));
        let alone = fresh.eval_all(&b).unwrap();
        let mut used = engine(&path, opts(kv));
        used.eval_all(&a).unwrap();
        let after = used.eval_all(&b).unwrap();
        assert_eq!(alone, after, "{kv:?}: logits depend on an earlier request");
        let e: f64 = alone.iter().zip(&want).map(|(x, y)| nmse(x, y)).sum::<f64>() / want.len() as f64;
        assert!(e < if kv == KvType::Q8_0 { 1e-3 } else { 5e-2 }, "{kv:?}: mean nmse vs f16 cache {e}");
    }
}

/// A token list longer than the model's embedding rows (`vocab_size` smaller than the list)
/// would let text tokenize to ids with no embedding: refused at load, naming both counts.
#[test]
fn a_tokenizer_larger_than_the_model_vocabulary_is_refused() {
    use quarrel_gguf::{Gguf, GgufWriter, Value};
    let dir = tempfile::tempdir().unwrap();
    let path = synth("f32", dir.path());
    let g = Gguf::open(&path).unwrap();
    let n = g.get_array("tokenizer.ggml.tokens").unwrap().unwrap().len();
    let arch = g.architecture().unwrap().to_string();
    let mut w = GgufWriter::new();
    for (k, v) in g.metadata() {
        let v = match (k.as_str(), v) {
            // two more tokens, with their types and scores where the file has them
            ("tokenizer.ggml.tokens", Value::Array(t, items)) => {
                Value::Array(*t, items.iter().cloned().chain(["<x1>", "<x2>"].map(|s| Value::String(s.into()))).collect())
            }
            ("tokenizer.ggml.token_type", Value::Array(t, items)) => Value::Array(*t, [items.clone(), vec![Value::I32(1); 2]].concat()),
            ("tokenizer.ggml.scores", Value::Array(t, items)) => Value::Array(*t, [items.clone(), vec![Value::F32(0.0); 2]].concat()),
            _ => v.clone(),
        };
        w.set(k, v);
    }
    w.set(&format!("{arch}.vocab_size"), Value::U32(n as u32));
    let mut data = vec![];
    for t in g.tensors() {
        w.add_tensor(&t.name, &t.dims, t.ty).unwrap();
        data.push(g.tensor(&t.name).unwrap().1.to_vec());
    }
    let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    let bad = dir.path().join("bad.gguf");
    std::fs::write(&bad, w.to_bytes(&refs).unwrap()).unwrap();
    let be = quarrel_cpu::CpuBackend::new(1).unwrap();
    let e = match quarrel_engine::Engine::load(be, &bad, EngineOptions { n_ctx: 32, ..Default::default() }) {
        Ok(_) => panic!("loaded a tokenizer of {} tokens over {n} embedding rows", n + 2),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("tokenizer.ggml.tokens") && e.contains(&format!("{} tokens", n + 2)) && e.contains(&format!("has {n}")), "{e}");
}

/// A model split over three files as llama.cpp's `gguf-split` writes them (opened by its
/// first file) gives the logits of the single file, bit for bit.
#[test]
fn a_split_model_runs_as_the_single_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = synth("q4_k_m", dir.path());
    let g = quarrel_gguf::Gguf::open(&path).unwrap();
    let first = quarrel_gguf::write_split(&g, &dir.path().join("split").to_string_lossy(), 3).unwrap().remove(0);
    let ids: Vec<u32> = (0..12).map(|i| (i * 37 + 5) % 500).collect();
    let opts = || EngineOptions { n_ctx: 32, ..Default::default() };
    let whole = engine(&path, opts()).eval_all(&ids).unwrap();
    let split = engine(&first, opts()).eval_all(&ids).unwrap();
    assert_logits_close("split vs single file", &whole, &split, 0.0);
}
