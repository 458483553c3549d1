//! Encoders on their tiny synthetic models (`quarrel synth -p tiny-bert | tiny-nomic-bert |
//! tiny-bert-rerank -q f32 --seed 7`) and on nomic-embed-text-v1.5 (`QUARREL_NOMIC`), against
//! llama.cpp's outputs (tests/fixtures/encoders, made by scripts/embed_fixtures.c):
//! - every token's final hidden state, NMSE <= 1e-4 at every position;
//! - a reranker's scores through the scheduler's rank pooling, within 1e-4;
//! - nomic-embed on 200 texts (scripts/embed_texts.py): tokens identical, the pooled and
//!   normalized embeddings' cosine >= 0.9999, through the scheduler (texts batched together);
//! - attention over the whole text (a token's state depends on the tokens after it), and texts
//!   batched together equal to each alone.

mod common;
use common::*;
use quarrel_engine::service::{EngineHandle, Pooling, Prompt, ServiceOptions};
use quarrel_engine::EngineOptions;
use quarrel_synth::archs::{ArchPreset, ArchSynthSpec};
use quarrel_synth::Ftype;

#[derive(serde::Deserialize)]
struct Hidden {
    tokens: Vec<u32>,
    n_embd: usize,
    hidden: Vec<Vec<f32>>,
}

#[derive(serde::Deserialize)]
struct Ranks {
    seqs: Vec<Vec<u32>>,
    scores: Vec<Vec<f32>>,
}

#[derive(serde::Deserialize)]
struct Texts {
    items: Vec<TextItem>,
}

#[derive(serde::Deserialize)]
struct TextItem {
    tokens: Vec<u32>,
    embedding: Vec<f32>,
}

fn tiny(preset: &str, dir: &std::path::Path) -> std::path::PathBuf {
    ArchSynthSpec { preset: *ArchPreset::by_name(preset).unwrap(), ftype: Ftype::F32, seed: 7, vocab_from: None }.write_into(dir).unwrap()
}

fn hidden_states_match(preset: &str) {
    let dir = tempfile::tempdir().unwrap();
    let f: Hidden = serde_json::from_str(&std::fs::read_to_string(fixture(&format!("encoders/{preset}.json"))).unwrap()).unwrap();
    let mut e = engine(&tiny(preset, dir.path()), EngineOptions { n_ctx: 64, ..Default::default() });
    let ours = e.hidden_batch(std::slice::from_ref(&f.tokens)).unwrap().remove(0);
    assert_eq!((ours.len(), ours[0].len()), (f.hidden.len(), f.n_embd));
    let errs: Vec<f64> = f.hidden.iter().zip(&ours).map(|(a, b)| nmse(a, b)).collect();
    eprintln!("{preset}: worst nmse {:.2e} over {} positions", errs.iter().copied().fold(0f64, f64::max), errs.len());
    assert!(errs.iter().all(|&x| x <= 1e-4), "nmse per position {errs:?}");
    // and no logits: generating with an encoder is an error, not a crash
    assert!(e.eval_all(&f.tokens[..4]).is_err());
}

#[test]
fn bert_hidden_states_match_llama_cpp() {
    hidden_states_match("tiny-bert");
}

#[test]
fn nomic_bert_hidden_states_match_llama_cpp() {
    hidden_states_match("tiny-nomic-bert");
}

#[test]
fn reranker_scores_match_llama_cpp() {
    let dir = tempfile::tempdir().unwrap();
    let f: Ranks = serde_json::from_str(&std::fs::read_to_string(fixture("encoders/tiny-bert-rerank.json")).unwrap()).unwrap();
    let e = engine(&tiny("tiny-bert-rerank", dir.path()), EngineOptions { n_ctx: 64, n_seq: 4, ..Default::default() });
    let h = EngineHandle::spawn(e, ServiceOptions::default());
    assert_eq!((h.info().pooling, h.info().n_classes), (Pooling::Rank, 1));
    let prompts = f.seqs.iter().cloned().map(Prompt::Tokens).collect();
    let got = h.embed_matrix_blocking(prompts, Pooling::Rank, false).unwrap();
    for (i, want) in f.scores.iter().enumerate() {
        let ours = got.row(i);
        eprintln!("rerank seq {i}: ours {ours:?} llama.cpp {want:?}");
        assert_eq!(ours.len(), want.len());
        for (a, b) in ours.iter().zip(want) {
            assert!((a - b).abs() <= 1e-4 * b.abs().max(1.0), "seq {i}: {a} vs {b}");
        }
    }
    // an embedding model has no head to rank with: a clear error
    let plain = engine(&tiny("tiny-bert", dir.path()), EngineOptions { n_ctx: 64, ..Default::default() });
    let h = EngineHandle::spawn(plain, ServiceOptions::default());
    let err = h.embed_matrix_blocking(vec![Prompt::Tokens(f.seqs[0].clone())], Pooling::Rank, false).unwrap_err();
    assert!(err.to_string().contains("classification head"), "{err}");
}

#[test]
fn nomic_embed_matches_llama_cpp_on_200_texts() {
    let Some(path) = nomic() else { return };
    // one fixture for every SIMD level: llama.cpp's AVX2 and AVX-512 builds differ far below
    // this test's cosine bar
    let f: Texts = serde_json::from_str(&std::fs::read_to_string(fixture("encoders/nomic-embed.json")).unwrap()).unwrap();
    let texts: Vec<String> = std::fs::read_to_string(fixture("encoders/nomic-texts.txt")).unwrap().lines().map(str::to_string).collect();
    assert_eq!(texts.len(), f.items.len());
    // as `quarrel embed` and `serve` run it: F16 weights on AMX where the CPU has it
    let e = encoder_engine(&path, EngineOptions { n_ctx: 2048, n_seq: 8, ..Default::default() });
    let h = EngineHandle::spawn(e, ServiceOptions { max_batch_tokens: 2048, ..Default::default() });
    let mut bad_tokens = 0;
    for (t, item) in texts.iter().zip(&f.items) {
        let ours = h.tokenize_prompt(&Prompt::Text(t.clone())).unwrap();
        if ours != item.tokens {
            bad_tokens += 1;
            eprintln!("tokens differ for {t:?}:\n  ours     {ours:?}\n  llama.cpp {:?}", item.tokens);
        }
    }
    assert_eq!(bad_tokens, 0, "texts tokenized differently from llama.cpp");
    let longest = f.items.iter().map(|i| i.tokens.len()).max().unwrap();
    let got = h.embed_matrix_blocking(texts.into_iter().map(Prompt::Text).collect(), Pooling::Mean, true).unwrap();
    let cos: Vec<f64> = f
        .items
        .iter()
        .enumerate()
        .map(|(i, item)| got.row(i).iter().zip(&item.embedding).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>())
        .collect();
    let worst = cos.iter().copied().fold(1f64, f64::min);
    eprintln!("nomic-embed: {} texts of 1..{longest} tokens, worst cosine vs llama.cpp {worst:.7}", cos.len());
    assert!(worst >= 0.9999, "cosines {cos:?}");
}

#[test]
fn every_token_sees_the_whole_text_and_batches_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    for preset in ["tiny-bert", "tiny-nomic-bert"] {
        let mut e = engine(&tiny(preset, dir.path()), EngineOptions { n_ctx: 64, n_seq: 4, ..Default::default() });
        let text: Vec<u32> = (0..12).map(|i| (i * 37 + 5) % 500).collect();
        let whole = e.hidden_batch(std::slice::from_ref(&text)).unwrap().remove(0);
        let mut changed = text.clone();
        changed[11] = 7;
        let other = e.hidden_batch(&[changed]).unwrap().remove(0);
        assert!(nmse(&whole[0], &other[0]) > 1e-6, "{preset}: the first token's state ignores the last token");
        let seqs: Vec<Vec<u32>> = vec![text.clone(), text[2..7].to_vec(), text[..9].to_vec()];
        let batched = e.hidden_batch(&seqs).unwrap();
        for (s, b) in seqs.iter().zip(&batched) {
            let alone = e.hidden_batch(std::slice::from_ref(s)).unwrap().remove(0);
            assert_logits_close(&format!("{preset}: batched vs alone"), b, &alone, 1e-10);
        }
    }
}

#[test]
fn f16_encoders_on_matrix_units_agree_with_the_vector_kernels_and_ignore_the_batch() {
    let dir = tempfile::tempdir().unwrap();
    for preset in ["tiny-bert", "tiny-nomic-bert"] {
        let spec = ArchSynthSpec { preset: *ArchPreset::by_name(preset).unwrap(), ftype: Ftype::F16, seed: 7, vocab_from: None };
        let path = spec.write_into(dir.path()).unwrap();
        let opts = EngineOptions { n_ctx: 64, n_seq: 4, ..Default::default() };
        let (mut vector, mut matrix) = (engine(&path, opts.clone()), encoder_engine(&path, opts));
        let text: Vec<u32> = (0..40).map(|i| (i * 37 + 5) % 500).collect();
        let seqs: Vec<Vec<u32>> = vec![text.clone(), text[2..7].to_vec(), text[..33].to_vec(), vec![text[9]]];
        let batched = matrix.hidden_batch(&seqs).unwrap();
        for (s, b) in seqs.iter().zip(&batched) {
            let alone = matrix.hidden_batch(std::slice::from_ref(s)).unwrap().remove(0);
            assert_eq!(b, &alone, "{preset}: a text's hidden states depend on what shares its forward");
            let reference = vector.hidden_batch(std::slice::from_ref(s)).unwrap().remove(0);
            // another f32 order: a sum that lands on the other side of an F16 rounding of the
            // next matmul's input moves that input by one F16 ulp (2^-11)
            assert_logits_close(&format!("{preset}: matrix units vs vector kernels"), b, &reference, 1e-5);
        }
    }
}

#[test]
fn requests_from_many_clients_share_forwards() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(&tiny("tiny-nomic-bert", dir.path()), EngineOptions { n_ctx: 64, n_seq: 32, ..Default::default() });
    let h = EngineHandle::spawn(e, ServiceOptions { max_batch_tokens: 512, ..Default::default() });
    let texts: Vec<Vec<u32>> = (0..24).map(|i| (0..8).map(|j| (i * 13 + j * 7) % 500 + 3).collect()).collect();
    let one = |t: &Vec<u32>| h.embed_matrix_blocking(vec![Prompt::Tokens(t.clone())], Pooling::Mean, true).unwrap().row(0).to_vec();
    // each alone (this also tells the scheduler how fast units run)
    let alone: Vec<Vec<f32>> = texts.iter().map(one).collect();
    let f0 = h.metrics().embed_forwards_total;
    // 24 clients at once, one text each
    let together: Vec<Vec<f32>> = std::thread::scope(|s| {
        let clients: Vec<_> = texts.iter().map(|t| s.spawn(move || one(t))).collect();
        clients.into_iter().map(|c| c.join().unwrap()).collect()
    });
    let forwards = h.metrics().embed_forwards_total - f0;
    eprintln!("24 single-text requests at once: {forwards} forwards");
    assert!(forwards <= 16, "{forwards} forwards for 24 concurrent single-text requests: they were not packed together");
    for (a, b) in alone.iter().zip(&together) {
        assert_eq!(a, b, "a text's vector depends on the requests it shared a forward with");
    }
}
