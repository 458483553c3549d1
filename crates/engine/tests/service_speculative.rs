//! Speculative decoding inside continuous batching: many concurrent requests, each checking
//! its own drafts in shared target steps, stream exactly what each would get alone without
//! speculation (greedy and seeded sampling, stop strings, limits, constrained and opted-out
//! requests), and the metrics count the drafts.

mod common;
use common::*;
use quarrel_cpu::CpuBackend;
use quarrel_engine::*;
use quarrel_synth::{write_synth, Ftype, Preset, SynthSpec};
use std::path::{Path, PathBuf};

fn synth(dir: &Path, ftype: &str, seed: u64) -> PathBuf {
    let path = dir.join(format!("tiny-{ftype}-{seed}.gguf"));
    let spec = SynthSpec::new(*Preset::by_name("tiny").unwrap(), Ftype::from_name(ftype).unwrap()).seed(seed);
    write_synth(&spec, &path, &mut |_, _| {}).unwrap();
    path
}

const N_CTX: usize = 192;

fn opts(n_seq: usize) -> EngineOptions {
    EngineOptions { n_ctx: N_CTX, n_seq, ..Default::default() }
}

/// The requests: varied prompts, greedy and sampled, limits and stop strings, one with
/// speculation off, one constrained.
fn requests(tok: &quarrel_tokenizer::Tokenizer) -> Vec<Request> {
    let texts = ["hello world", "the cat sat on the mat and the cat sat", "a", "one two three one two three one two", "xyz"];
    let mut out = vec![];
    for (i, t) in texts.iter().cycle().take(14).enumerate() {
        let sampling = if i % 2 == 0 {
            SamplingParams::greedy()
        } else {
            SamplingParams { temperature: 0.8, top_k: 30, top_p: 0.9, repeat_penalty: 1.05, seed: i as u64, ..Default::default() }
        };
        let mut p = GenerateParams { sampling, max_tokens: 20 + 7 * i, ignore_eos: true, ..Default::default() };
        if i == 5 {
            p.max_tokens = 1000; // runs into the context's end
        }
        let mut r = Request::new(Prompt::Tokens(tok.encode(t, true, false)), p);
        r.speculative = i != 3;
        if i == 7 {
            r.constraint = Some(ConstraintSpec::Regex("[a-z ]{3,40}".into()));
            r.params.ignore_eos = false;
        }
        out.push(r);
    }
    out
}

struct Outcome {
    text: String,
    tokens: Vec<u32>,
    finish: FinishReason,
}

fn collect(mut s: RequestStream) -> Outcome {
    let (mut text, mut tokens, mut finish) = (String::new(), vec![], None);
    while let Some(ev) = s.blocking_next() {
        match ev {
            StreamEvent::Token { id, text: t, .. } => {
                text.push_str(&t);
                tokens.extend(id);
            }
            StreamEvent::Done { finish_reason, .. } => finish = Some(finish_reason),
            StreamEvent::Error(e) => panic!("request failed: {e}"),
        }
    }
    Outcome { text, tokens, finish: finish.expect("a finished stream") }
}

fn run_all(h: &EngineHandle) -> Vec<Outcome> {
    let streams: Vec<RequestStream> = requests(h.tokenizer()).into_iter().map(|r| h.submit(r).unwrap()).collect();
    streams.into_iter().map(collect).collect()
}

fn spawn(path: &Path, spec: Option<Speculator>) -> EngineHandle {
    let mut e = engine(path, opts(16));
    e.set_speculator(spec).unwrap();
    EngineHandle::spawn(e, ServiceOptions { max_running: 16, ..Default::default() })
}

#[test]
fn concurrent_speculative_requests_stream_what_plain_decoding_does() {
    let dir = tempfile::tempdir().unwrap();
    let target = synth(dir.path(), "q8_0", 7);
    let plain = run_all(&spawn(&target, None));
    let tok = engine(&target, opts(1)).tokenizer.clone();
    let drafters: Vec<(&str, Speculator)> = vec![
        (
            "same weights",
            Speculator {
                drafter: Box::new(ModelDrafter::new(engine(&target, opts(16)), &tok, 0.0).unwrap()),
                opts: SpecOptions { draft_max: 6, draft_min: 0, p_min: 0.0, step_budget: 48 },
            },
        ),
        (
            "q4_0 weights",
            Speculator {
                drafter: Box::new(ModelDrafter::new(engine(&synth(dir.path(), "q4_0", 7), opts(16)), &tok, 0.0).unwrap()),
                opts: SpecOptions { draft_max: 4, draft_min: 0, p_min: 0.0, step_budget: 0 },
            },
        ),
        (
            "ngram",
            Speculator {
                drafter: Box::new(NgramDrafter::default()),
                opts: SpecOptions { draft_max: 5, draft_min: 1, p_min: 0.0, step_budget: 0 },
            },
        ),
    ];
    for (name, s) in drafters {
        let h = spawn(&target, Some(s));
        let got = run_all(&h);
        for (i, (a, b)) in plain.iter().zip(&got).enumerate() {
            assert_eq!(a.tokens, b.tokens, "{name}: request {i}: tokens");
            assert_eq!(a.text, b.text, "{name}: request {i}: text");
            assert_eq!(a.finish, b.finish, "{name}: request {i}: finish");
        }
        let m = h.metrics();
        eprintln!(
            "{name}: {} of {} drafts accepted over {} sequence steps",
            m.spec_accepted_total, m.spec_drafted_total, m.spec_steps_total
        );
        assert!(m.spec_drafted_total > 0 && m.spec_steps_total > 0, "{name}: nothing drafted");
        assert!(m.spec_accepted_total <= m.spec_drafted_total);
        if name == "same weights" {
            assert!(m.spec_accepted_total > 0, "{name}: the target's own greedy drafts are accepted");
        }
    }
    // and the same as generating alone, one request at a time
    let mut alone = engine(&target, opts(1));
    for (i, r) in requests(&tok).into_iter().enumerate().filter(|(_, r)| r.constraint.is_none()) {
        let Prompt::Tokens(p) = &r.prompt else { unreachable!() };
        let c = alone.generate(p, &r.params, &mut |_| true).unwrap();
        assert_eq!(c.tokens, plain[i].tokens, "request {i}: the service vs generate");
    }
}

/// A drafter the target's block pool cannot fully serve (a tiny KV budget): drafts are
/// dropped rather than taking a decode's memory, and no request fails.
#[test]
fn drafts_yield_to_memory_pressure() {
    let dir = tempfile::tempdir().unwrap();
    let target = synth(dir.path(), "q8_0", 7);
    let plain = run_all(&spawn(&target, None));
    let tok = engine(&target, opts(1)).tokenizer.clone();
    // the drafter holds two sequences; the target's pool holds what 14 requests need barely
    let d = ModelDrafter::new(engine(&target, opts(2)), &tok, 0.0).unwrap();
    let mut e = Engine::load(CpuBackend::new(0).unwrap(), &target, EngineOptions { kv_mem: Some(400 << 10), ..opts(1) }).unwrap();
    e.set_speculator(Some(Speculator {
        drafter: Box::new(d),
        opts: SpecOptions { draft_max: 8, draft_min: 0, p_min: 0.0, step_budget: 64 },
    }))
    .unwrap();
    let h = EngineHandle::spawn(e, ServiceOptions { max_running: 16, ..Default::default() });
    let got = run_all(&h);
    for (i, (a, b)) in plain.iter().zip(&got).enumerate() {
        assert_eq!(a.tokens, b.tokens, "request {i}");
    }
    let m = h.metrics();
    eprintln!("pressure: {} of {} drafts accepted, {} preemptions", m.spec_accepted_total, m.spec_drafted_total, m.preemptions_total);
}
