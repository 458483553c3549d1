//! Prefix reuse on a hybrid (Mamba2 + attention + MoE) model: the recurrent state is
//! checkpointed at prompt-chunk boundaries, so a second request sharing a 1,000-token prefix
//! resumes from the checkpoint (plus the cached KV blocks) instead of recomputing the prompt
//! as llama.cpp does — with the same output as a cold run. Its own test binary so that no
//! other test competes for the cores while time to first token is measured.

mod common;
use common::*;
use quarrel_engine::*;
use quarrel_synth::archs::{write_arch_synth, ArchPreset, ArchSynthSpec};
use quarrel_synth::Ftype;
use std::time::Duration;

fn run(h: &EngineHandle, prompt: &[u32]) -> (Vec<u32>, Duration, Usage) {
    let params = GenerateParams { sampling: SamplingParams::greedy(), max_tokens: 4, ignore_eos: true, ..Default::default() };
    let mut s = h.submit(Request::new(Prompt::Tokens(prompt.to_vec()), params)).unwrap();
    let (mut toks, mut ttft, mut usage) = (vec![], None, None);
    while let Some(ev) = s.blocking_next() {
        match ev {
            StreamEvent::Token { id, .. } => toks.extend(id),
            StreamEvent::Done { timings, usage: u, .. } => {
                ttft = Some(timings.ttft);
                usage = Some(u);
            }
            StreamEvent::Error(e) => panic!("{e}"),
        }
    }
    (toks, ttft.unwrap(), usage.unwrap())
}

#[test]
fn shared_prefix_resumes_from_a_state_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hybrid.gguf");
    let spec = ArchSynthSpec { preset: *ArchPreset::by_name("tiny-granitehybrid").unwrap(), ftype: Ftype::Q8_0, seed: 5, vocab_from: None };
    write_arch_synth(&spec, &path, &mut |_, _| {}).unwrap();
    let shared: Vec<u32> = (0..1000).map(|i| (3 + (i * 131 + i / 7) % 505) as u32).collect();
    let with = |suffix: &[u32]| [shared.as_slice(), suffix].concat();
    let (a, b) = (with(&[7, 8, 9, 10, 11, 12, 13, 14, 15, 16]), with(&[40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51]));
    let opts = EngineOptions { n_ctx: 1100, n_seq: 2, ..Default::default() };

    // cold reference for the second prompt
    let cold = EngineHandle::spawn(engine(&path, opts.clone()), ServiceOptions::default());
    let (want, cold_ttft, u0) = run(&cold, &b);
    assert_eq!(u0.cached_tokens, 0);
    drop(cold);

    let h = EngineHandle::spawn(engine(&path, opts), ServiceOptions::default());
    let (_, first, u1) = run(&h, &a);
    let (got, second, u2) = run(&h, &b);
    eprintln!(
        "ttft: cold {cold_ttft:?}, first {first:?} (cached {}), second {second:?} (cached {}) = {:.1}% of first",
        u1.cached_tokens,
        u2.cached_tokens,
        100.0 * second.as_secs_f64() / first.as_secs_f64()
    );
    assert_eq!(u1.cached_tokens, 0);
    // checkpoints every 128 tokens: the one at 896 is the last inside the shared prefix
    assert_eq!(u2.cached_tokens, 896, "{u2:?}");
    assert_eq!(got, want, "output after resuming differs from a cold run");
    let m = h.metrics();
    assert!(m.state_checkpoints >= 7 && m.recurrent_state_bytes > 0 && m.ssm_nonfinite_total == 0, "{m:?}");
    assert!(second.as_secs_f64() <= 0.25 * first.as_secs_f64(), "second {second:?} vs first {first:?}");
}
