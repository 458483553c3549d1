//! Encoders (`bert`) on their tiny synthetic model (`quarrel synth -p tiny-bert -q f32 --seed
//! 7`): every token's final hidden state vs llama.cpp's (tests/fixtures/encoders, made by
//! scripts/embed_fixtures.c; NMSE <= 1e-4 at every position), attention over the whole text
//! (a token's state depends on the tokens after it), and texts batched together equal to each
//! alone.

mod common;
use common::*;
use quarrel_engine::EngineOptions;
use quarrel_synth::archs::{ArchPreset, ArchSynthSpec};
use quarrel_synth::Ftype;

#[derive(serde::Deserialize)]
struct Fixture {
    tokens: Vec<u32>,
    n_embd: usize,
    hidden: Vec<Vec<f32>>,
}

fn tiny_bert(dir: &std::path::Path) -> std::path::PathBuf {
    ArchSynthSpec { preset: *ArchPreset::by_name("tiny-bert").unwrap(), ftype: Ftype::F32, seed: 7, vocab_from: None }
        .write_into(dir)
        .unwrap()
}

#[test]
fn hidden_states_match_llama_cpp() {
    let dir = tempfile::tempdir().unwrap();
    let f: Fixture = serde_json::from_str(&std::fs::read_to_string(fixture("encoders/tiny-bert.json")).unwrap()).unwrap();
    let mut e = engine(&tiny_bert(dir.path()), EngineOptions { n_ctx: 64, ..Default::default() });
    let ours = e.hidden_batch(std::slice::from_ref(&f.tokens)).unwrap().remove(0);
    assert_eq!((ours.len(), ours[0].len()), (f.hidden.len(), f.n_embd));
    let errs: Vec<f64> = f.hidden.iter().zip(&ours).map(|(a, b)| nmse(a, b)).collect();
    eprintln!("tiny-bert: worst nmse {:.2e} over {} positions", errs.iter().copied().fold(0f64, f64::max), errs.len());
    assert!(errs.iter().all(|&x| x <= 1e-4), "nmse per position {errs:?}");
    // and no logits: generating with an encoder is an error, not a crash
    assert!(e.eval_all(&f.tokens[..4]).is_err());
}

#[test]
fn every_token_sees_the_whole_text_and_batches_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut e = engine(&tiny_bert(dir.path()), EngineOptions { n_ctx: 64, n_seq: 4, ..Default::default() });
    let text: Vec<u32> = (0..12).map(|i| (i * 37 + 5) % 500).collect();
    let whole = e.hidden_batch(std::slice::from_ref(&text)).unwrap().remove(0);
    let mut changed = text.clone();
    changed[11] = 7;
    let other = e.hidden_batch(&[changed]).unwrap().remove(0);
    assert!(nmse(&whole[0], &other[0]) > 1e-6, "the first token's state ignores the last token");
    let seqs: Vec<Vec<u32>> = vec![text.clone(), text[2..7].to_vec(), text[..9].to_vec()];
    let batched = e.hidden_batch(&seqs).unwrap();
    for (s, b) in seqs.iter().zip(&batched) {
        let alone = e.hidden_batch(std::slice::from_ref(s)).unwrap().remove(0);
        assert_logits_close("batched vs alone", b, &alone, 1e-10);
    }
}
