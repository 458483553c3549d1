//! `quarrel serve --models-dir` with a corrupt model file beside a good one: a request for
//! the bad file gets a JSON error that names the bad key (and no server path), the process
//! keeps running, and the good model keeps answering. A header with a 2^40 `block_count`
//! once aborted the whole process on the allocation its loader sized from it.

mod common;
use common::Server;
use quarrel_gguf::{Gguf, GgufWriter, Value};
use quarrel_synth::{write_synth, Ftype, Preset, SynthSpec};
use serde_json::{json, Value as Json};
use std::path::Path;
use std::time::Duration;

/// A copy of the model at `src` with `key` set to `v`, tensors kept.
fn rewrite(src: &Path, dst: &Path, key: &str, v: Value) {
    let g = Gguf::open(src).unwrap();
    let mut w = GgufWriter::new();
    for (k, val) in g.metadata() {
        w.set(k, if k == key { v.clone() } else { val.clone() });
    }
    let mut data = vec![];
    for t in g.tensors() {
        w.add_tensor(&t.name, &t.dims, t.ty).unwrap();
        data.push(g.tensor(&t.name).unwrap().1.to_vec());
    }
    let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    std::fs::write(dst, w.to_bytes(&refs).unwrap()).unwrap();
}

impl Server {
    fn complete(&mut self, model: &str) -> (u16, Json) {
        self.post(
            "/v1/completions",
            &json!({"model": model, "prompt": "hello", "max_tokens": 2, "temperature": 0}),
            Some(Duration::from_secs(120)),
        )
    }
}

#[test]
fn a_bad_model_file_is_an_error_for_its_requests_only() {
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("models");
    std::fs::create_dir(&models).unwrap();
    let good = models.join("good.gguf");
    let spec = SynthSpec::new(*Preset::by_name("tiny").unwrap(), Ftype::from_name("q8_0").unwrap()).seed(3);
    write_synth(&spec, &good, &mut |_, _| {}).unwrap();
    let arch = Gguf::open(&good).unwrap().architecture().unwrap().to_string();
    let key = format!("{arch}.block_count");
    rewrite(&good, &models.join("bad.gguf"), &key, Value::U64(1 << 40));
    rewrite(&good, &models.join("nan.gguf"), &format!("{arch}.attention.layer_norm_rms_epsilon"), Value::F32(f32::NAN));

    let mut s =
        Server::start(&["-t", "1", "-m", good.to_str().unwrap(), "--models-dir", models.to_str().unwrap()], &dir.path().join("home"));
    let (code, ok) = s.complete("good");
    assert_eq!(code, 200, "{ok}");
    for round in 0..2 {
        for (name, want) in [("bad", key.as_str()), ("nan", "layer_norm_rms_epsilon")] {
            let (code, e) = s.complete(name);
            assert!((400..600).contains(&code), "{name}: status {code}: {e}");
            let msg = e["error"]["message"].as_str().unwrap_or_else(|| panic!("{name}: no error message: {e}"));
            assert!(msg.contains(want), "{name} (round {round}): {msg}");
            assert!(!msg.contains(models.to_str().unwrap()), "{name}: the server's path reached the client: {msg}");
        }
        let (code, ok) = s.complete("good");
        assert_eq!(code, 200, "good after the bad files (round {round}): {ok}");
        assert!(ok["choices"][0]["text"].is_string(), "{ok}");
    }
    assert!(s.child.try_wait().unwrap().is_none(), "the server exited");
}
