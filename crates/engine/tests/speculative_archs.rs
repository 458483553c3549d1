//! Speculative decoding on every architecture that allows it: greedy text identical with and
//! without a drafter; and sampled output drawn from the model's own distribution.

mod common;
use common::*;
use quarrel_engine::{EngineOptions, GenerateParams, ModelDrafter, NgramDrafter, SamplingParams, SpecOptions, Speculator};
use quarrel_synth::archs::{ArchPreset, ArchSynthSpec};
use quarrel_synth::Ftype;

fn opts() -> EngineOptions {
    EngineOptions { n_ctx: 128, ..Default::default() }
}

#[test]
fn greedy_text_is_unchanged_on_every_decoder_architecture() {
    let dir = tempfile::tempdir().unwrap();
    let archs = [
        "tiny-llama3",
        "tiny-qwen2",
        "tiny-qwen3",
        "tiny-qwen3moe",
        "tiny-phi3",
        "tiny-nemotron",
        "tiny-gemma3",
        "tiny-gpt-oss",
        "tiny-mixtral",
        "tiny-granite",
        "tiny-granitemoe",
    ];
    for name in archs {
        let path = ArchSynthSpec { preset: *ArchPreset::by_name(name).unwrap(), ftype: Ftype::Q8_0, seed: 5, vocab_from: None }
            .write_into(dir.path())
            .unwrap();
        let mut e = engine(&path, opts());
        let prompt = e.tokenize("the cat sat on the mat and the cat", true);
        let p = GenerateParams { sampling: SamplingParams::greedy(), max_tokens: 40, ignore_eos: true, ..Default::default() };
        let plain = e.generate(&prompt, &p, &mut |_| true).unwrap();
        for drafter in ["model", "ngram"] {
            let d: Box<dyn quarrel_engine::Drafter> = match drafter {
                "model" => Box::new(ModelDrafter::new(engine(&path, opts()), &e.tokenizer, 0.0).unwrap()),
                _ => Box::new(NgramDrafter::default()),
            };
            e.set_speculator(Some(Speculator { drafter: d, opts: SpecOptions { draft_max: 6, ..Default::default() } })).unwrap();
            let spec = e.generate(&prompt, &p, &mut |_| true).unwrap();
            assert_eq!(plain.tokens, spec.tokens, "{name}, {drafter} drafter");
            if drafter == "model" {
                assert!(spec.timings.spec.accepted > 0, "{name}: the model's own greedy drafts are accepted");
            }
        }
    }
}

/// The second token of many seeded samples, with a drafter guessing it, against the model's
/// softmax after the first: the draws follow the model's distribution (total variation
/// distance within what the sample size allows).
#[test]
fn sampled_tokens_follow_the_models_distribution() {
    let dir = tempfile::tempdir().unwrap();
    let path = ArchSynthSpec { preset: *ArchPreset::by_name("tiny-llama3").unwrap(), ftype: Ftype::Q8_0, seed: 3, vocab_from: None }
        .write_into(dir.path())
        .unwrap();
    let mut e = engine(&path, opts());
    let d = ModelDrafter::new(engine(&path, opts()), &e.tokenizer, 0.0).unwrap();
    e.set_speculator(Some(Speculator { drafter: Box::new(d), opts: SpecOptions { draft_max: 3, ..Default::default() } })).unwrap();
    let temperature = 0.35;
    let prompt = vec![e.tokenize("the", false)[0]];
    let n = 3000;
    let mut seconds: std::collections::HashMap<u32, Vec<u32>> = Default::default();
    let (mut drafted, mut accepted) = (0, 0);
    for seed in 0..n {
        let s = SamplingParams { temperature, top_k: 0, top_p: 1.0, min_p: 0.0, seed, ..Default::default() };
        let c = e
            .generate(&prompt, &GenerateParams { sampling: s, max_tokens: 2, ignore_eos: true, ..Default::default() }, &mut |_| true)
            .unwrap();
        seconds.entry(c.tokens[0]).or_default().push(c.tokens[1]);
        drafted += c.timings.spec.drafted;
        accepted += c.timings.spec.accepted;
    }
    assert!(accepted > 0 && accepted < drafted, "drafts both accepted and rejected: {accepted}/{drafted}");
    // the most frequent first token, and the second tokens drawn after it
    let (&first, draws) = seconds.iter().max_by_key(|(_, v)| v.len()).unwrap();
    let logits = e.eval_all(&[prompt[0], first]).unwrap().pop().unwrap();
    let m = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let w: Vec<f64> = logits.iter().map(|&l| (((l - m) / temperature) as f64).exp()).collect();
    let z: f64 = w.iter().sum();
    let mut counts = vec![0usize; logits.len()];
    draws.iter().for_each(|&t| counts[t as usize] += 1);
    let k = draws.len() as f64;
    let tv: f64 = w.iter().zip(&counts).map(|(p, &c)| (p / z - c as f64 / k).abs()).sum::<f64>() / 2.0;
    // an exact sampler's expected total variation: sum_i sqrt(p_i (1 - p_i) / (2 pi k)); a
    // sampler that kept the drafter's greedy guess would sit near 1 - max p
    let expected: f64 = w.iter().map(|p| p / z).map(|p| (p * (1.0 - p) / (2.0 * std::f64::consts::PI * k)).sqrt()).sum();
    let bound = 1.5 * expected + 0.01;
    let greedy_tv = 1.0 - w.iter().cloned().fold(0.0, f64::max) / z;
    eprintln!(
        "{} draws after token {first}: total variation {tv:.4} (exact sampler ~{expected:.4}, bound {bound:.4}; always the greedy token: {greedy_tv:.4}), drafts {accepted}/{drafted}",
        draws.len()
    );
    assert!(bound < greedy_tv / 2.0, "the test could not tell a biased sampler apart");
    assert!(draws.len() > 200, "too few draws after the most frequent first token");
    assert!(tv < bound, "total variation {tv} over {bound}");
}
