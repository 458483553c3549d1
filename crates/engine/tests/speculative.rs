//! Speculative decoding keeps the target's output: the same tokens and finish as decoding one
//! token a step, greedy or sampled (same seed), with a model drafter or prompt lookup, and
//! the drafts are really used (accepted ones skip target steps).

mod common;
use common::*;
use quarrel_cpu::CpuBackend;
use quarrel_engine::{
    Completion, Engine, EngineOptions, FinishReason, GenerateParams, ModelDrafter, NgramDrafter, SamplingParams, SpecOptions, Speculator,
};
use quarrel_synth::archs::{ArchPreset, ArchSynthSpec};
use quarrel_synth::{write_synth, Ftype, Preset, SynthSpec};
use std::path::{Path, PathBuf};

fn synth(dir: &Path, ftype: &str, seed: u64) -> PathBuf {
    let path = dir.join(format!("tiny-{ftype}-{seed}.gguf"));
    let spec = SynthSpec::new(*Preset::by_name("tiny").unwrap(), Ftype::from_name(ftype).unwrap()).seed(seed);
    write_synth(&spec, &path, &mut |_, _| {}).unwrap();
    path
}

fn opts() -> EngineOptions {
    EngineOptions { n_ctx: 160, ..Default::default() }
}

fn run(e: &mut Engine<CpuBackend>, prompt: &[u32], p: &GenerateParams) -> Completion {
    e.generate(prompt, p, &mut |_| true).unwrap()
}

fn model_drafter(path: &Path, target: &Engine<CpuBackend>, spec: SpecOptions) -> Speculator {
    let d = ModelDrafter::new(engine(path, opts()), &target.tokenizer, spec.p_min).unwrap();
    Speculator { drafter: Box::new(d), opts: spec }
}

fn sampled(seed: u64) -> SamplingParams {
    SamplingParams { temperature: 0.9, top_k: 40, top_p: 0.95, min_p: 0.02, repeat_penalty: 1.1, seed, ..Default::default() }
}

/// `what` with speculation gives `plain`'s completion exactly.
fn assert_same(what: &str, plain: &Completion, spec: &Completion) {
    assert_eq!(plain.tokens, spec.tokens, "{what}: tokens");
    assert_eq!(plain.text, spec.text, "{what}: text");
    assert_eq!(plain.finish_reason, spec.finish_reason, "{what}: finish");
}

#[test]
fn greedy_and_sampled_outputs_are_the_targets_own() {
    let dir = tempfile::tempdir().unwrap();
    let target_path = synth(dir.path(), "q8_0", 7);
    let mut target = engine(&target_path, opts());
    let prompts: Vec<Vec<u32>> =
        ["hello world", "the cat sat on the mat and the cat", "a"].iter().map(|t| target.tokenize(t, true)).collect();
    let params: Vec<(String, GenerateParams)> = std::iter::once(("greedy".to_string(), SamplingParams::greedy()))
        .chain((0..6).map(|s| (format!("sampled seed {s}"), sampled(s))))
        .map(|(n, sampling)| (n, GenerateParams { sampling, max_tokens: 48, ignore_eos: true, ..Default::default() }))
        .collect();
    let mut plain = vec![];
    for prompt in &prompts {
        for (_, p) in &params {
            plain.push(run(&mut target, prompt, p));
        }
    }
    // the same weights at a lower type draft well but not perfectly; another seed's model
    // drafts badly; prompt lookup drafts from the history
    let drafters: Vec<(&str, Speculator)> = vec![
        ("same weights", model_drafter(&target_path, &target, SpecOptions { draft_max: 5, draft_min: 0, p_min: 0.0, step_budget: 0 })),
        (
            "q4_0 drafter",
            model_drafter(&synth(dir.path(), "q4_0", 7), &target, SpecOptions { draft_max: 6, draft_min: 0, p_min: 0.0, step_budget: 0 }),
        ),
        (
            "other-seed drafter",
            model_drafter(&synth(dir.path(), "q8_0", 99), &target, SpecOptions { draft_max: 4, draft_min: 0, p_min: 0.0, step_budget: 0 }),
        ),
        (
            "p_min drafter",
            model_drafter(&synth(dir.path(), "q4_0", 7), &target, SpecOptions { draft_max: 8, draft_min: 2, p_min: 0.3, step_budget: 0 }),
        ),
        (
            "ngram",
            Speculator {
                drafter: Box::new(NgramDrafter::default()),
                opts: SpecOptions { draft_max: 5, draft_min: 1, p_min: 0.0, step_budget: 0 },
            },
        ),
    ];
    let mut q4_drafted = 0;
    for (name, s) in drafters {
        target.set_speculator(Some(s)).unwrap();
        let (mut drafted, mut accepted) = (0, 0);
        let (mut greedy_drafted, mut greedy_accepted) = (0, 0);
        let mut i = 0;
        for (pi, prompt) in prompts.iter().enumerate() {
            for (pn, p) in &params {
                let c = run(&mut target, prompt, p);
                assert_same(&format!("{name}, prompt {pi}, {pn}"), &plain[i], &c);
                drafted += c.timings.spec.drafted;
                accepted += c.timings.spec.accepted;
                if p.sampling.temperature == 0.0 {
                    greedy_drafted += c.timings.spec.drafted;
                    greedy_accepted += c.timings.spec.accepted;
                }
                assert!(
                    c.timings.spec.target_steps + c.timings.spec.accepted + 1 >= c.tokens.len(),
                    "{name}: every token from a step or an accepted draft"
                );
                i += 1;
            }
        }
        eprintln!("{name}: {accepted} of {drafted} drafts accepted");
        if name == "p_min drafter" {
            // a random model is rarely sure of a token: p_min holds back most drafts
            assert!(drafted < q4_drafted, "{name}: p_min drafts less ({drafted} vs {q4_drafted})");
            continue;
        }
        assert!(drafted > 0, "{name}: nothing drafted");
        if name == "q4_0 drafter" {
            q4_drafted = drafted;
        }
        if name == "same weights" {
            assert!(greedy_drafted > 0 && greedy_accepted == greedy_drafted, "{name}: greedy drafts of the target itself are all accepted");
            assert!(accepted < drafted, "{name}: sampled picks reject some greedy drafts");
        }
        if name == "other-seed drafter" {
            assert!(accepted < drafted, "{name}: some drafts must be rejected ({accepted}/{drafted})");
        }
    }
}

#[test]
fn finishes_are_the_same_at_stops_limits_and_a_full_context() {
    let dir = tempfile::tempdir().unwrap();
    let path = synth(dir.path(), "q8_0", 7);
    let small = EngineOptions { n_ctx: 40, ..Default::default() };
    let mut target = engine(&path, small.clone());
    let prompt = target.tokenize("the cat sat on the mat", true);
    let base = GenerateParams { sampling: SamplingParams::greedy(), max_tokens: 1000, ignore_eos: true, ..Default::default() };
    let full = run(&mut target, &prompt, &base);
    assert_eq!(full.finish_reason, FinishReason::ContextFull);
    // a stop string taken from the middle of the plain output
    let stop: String = full.text.chars().skip(full.text.chars().count() / 2).take(3).collect();
    let cases = [
        ("context full", base.clone()),
        ("max tokens", GenerateParams { max_tokens: 7, ..base.clone() }),
        ("one token", GenerateParams { max_tokens: 1, ..base.clone() }),
        ("stop string", GenerateParams { stop: vec![stop], ..base.clone() }),
    ];
    let plain: Vec<Completion> = cases.iter().map(|(_, p)| run(&mut target, &prompt, p)).collect();
    let d = ModelDrafter::new(engine(&path, small), &target.tokenizer, 0.0).unwrap();
    target
        .set_speculator(Some(Speculator {
            drafter: Box::new(d),
            opts: SpecOptions { draft_max: 16, draft_min: 0, p_min: 0.0, step_budget: 0 },
        }))
        .unwrap();
    for ((name, p), want) in cases.iter().zip(&plain) {
        let c = run(&mut target, &prompt, p);
        assert_same(name, want, &c);
        if *name == "context full" {
            assert_eq!(prompt.len() + c.tokens.len(), 40);
            assert!(c.timings.spec.accepted > 0, "the same model drafts exactly");
        }
    }
    // cancelling mid-step stops at once
    let mut n = 0;
    let c = target
        .generate(&prompt, &base, &mut |_| {
            n += 1;
            n < 3
        })
        .unwrap();
    assert_eq!((c.tokens.len(), c.finish_reason), (3, FinishReason::Cancelled));
}

#[test]
fn mismatched_vocabularies_and_recurrent_targets_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let target = engine(&synth(dir.path(), "q8_0", 7), opts());
    let mut big = *ArchPreset::by_name("tiny-llama3").unwrap();
    big.n_vocab = target.n_vocab() + 512;
    let big = ArchSynthSpec { preset: big, ftype: Ftype::Q8_0, seed: 7, vocab_from: None }.write_into(dir.path()).unwrap();
    let other = Engine::load(CpuBackend::new(1).unwrap(), &big, opts()).unwrap();
    let err = ModelDrafter::new(other, &target.tokenizer, 0.0).err().expect("a drafter with 512 more tokens is refused").to_string();
    assert!(err.contains("vocabulary differs"), "{err}");

    let hybrid = ArchSynthSpec { preset: *ArchPreset::by_name("tiny-mamba2").unwrap(), ftype: Ftype::Q8_0, seed: 7, vocab_from: None }
        .write_into(dir.path())
        .unwrap();
    let mut h = engine(&hybrid, opts());
    let err = h
        .set_speculator(Some(Speculator { drafter: Box::new(NgramDrafter::default()), opts: SpecOptions::default() }))
        .unwrap_err()
        .to_string();
    assert!(err.contains("recurrent"), "{err}");
}

/// SmolLM2 (real weights) asked to repeat its prompt: prompt lookup drafts most of the
/// answer, and greedy output is unchanged.
#[test]
fn prompt_lookup_on_a_real_model_copies_from_the_prompt() {
    let Some(path) = smollm2() else { return };
    let mut e = engine(&path, EngineOptions { n_ctx: 512, ..Default::default() });
    let code = "fn area(w: f64, h: f64) -> f64 {\n    let a = w * h;\n    println!(\"area {}\", a);\n    a\n}\n";
    let msgs = [quarrel_tokenizer::ChatMessage::new(
        "user",
        format!("Rename the function area to surface in this code and print the code:\n{code}"),
    )];
    let prompt = e.tokenizer.encode_chat(&msgs, true).unwrap();
    let p = GenerateParams { sampling: SamplingParams::greedy(), max_tokens: 80, ..Default::default() };
    let plain = run(&mut e, &prompt, &p);
    e.set_speculator(Some(Speculator {
        drafter: Box::new(NgramDrafter::default()),
        opts: SpecOptions { draft_max: 8, draft_min: 1, p_min: 0.0, step_budget: 0 },
    }))
    .unwrap();
    let spec = run(&mut e, &prompt, &p);
    assert_same("smollm2 ngram", &plain, &spec);
    let s = spec.timings.spec;
    eprintln!(
        "smollm2 ngram: {} of {} drafts accepted, {} target steps for {} tokens",
        s.accepted,
        s.drafted,
        s.target_steps,
        spec.tokens.len()
    );
    assert!(s.accepted * 3 > spec.tokens.len(), "most of a copied answer comes from drafts: {s:?}");
}
