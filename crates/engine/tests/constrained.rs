//! Constrained requests on a real (tiny synthetic) model through the service: their masks are
//! computed beside the forward pass and applied by the backend's sampler, in batches with
//! unconstrained, biased and logprobs requests. Each constrained request spells what its
//! regex allows and ends when it is complete; the others give what `Engine::generate` gives
//! them alone; a logprobs request picks the tokens of the same request without.

mod common;
use common::*;
use quarrel_engine::*;

fn drain(s: &mut RequestStream) -> (Vec<u32>, String, FinishReason, usize) {
    let (mut toks, mut text, mut fin, mut lps) = (vec![], String::new(), None, 0);
    while let Some(ev) = s.blocking_next() {
        match ev {
            StreamEvent::Token { id, text: t, logprob } => {
                toks.extend(id);
                text.push_str(&t);
                lps += logprob.is_some() as usize;
            }
            StreamEvent::Done { finish_reason, .. } => fin = Some(finish_reason),
            StreamEvent::Error(e) => panic!("{e}"),
        }
    }
    (toks, text, fin.expect("the stream ends with Done"), lps)
}

#[test]
fn constrained_requests_share_batches_with_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    quarrel_synth::write_tiny(&path, quarrel_synth::Ftype::Q8_0, 5).unwrap();
    let opts = EngineOptions { n_ctx: 96, n_seq: 8, ..Default::default() };
    let mut alone = engine(&path, opts.clone());
    let h = EngineHandle::spawn(engine(&path, opts), ServiceOptions::default());
    let sampled = |seed| SamplingParams { temperature: 0.8, top_k: 40, top_p: 0.95, seed, ..Default::default() };
    let digits = ConstraintSpec::Regex("[0-9]{2,6}".into());
    let prompt: Vec<u32> = (0..9).map(|i| (i * 37 + 11) % 200 + 3).collect();
    // (params, constrained, logprobs)
    let cases = [
        (GenerateParams { sampling: sampled(1), max_tokens: 16, ..Default::default() }, true, false),
        (GenerateParams { sampling: SamplingParams::greedy(), max_tokens: 16, ..Default::default() }, true, false),
        (GenerateParams { sampling: sampled(2), max_tokens: 16, logit_bias: vec![(40, 9.0)], ..Default::default() }, true, true),
        (GenerateParams { sampling: sampled(2), max_tokens: 16, logit_bias: vec![(40, 9.0)], ..Default::default() }, true, false),
        (GenerateParams { sampling: sampled(3), max_tokens: 10, ignore_eos: true, ..Default::default() }, false, false),
        (
            GenerateParams {
                sampling: SamplingParams::greedy(),
                max_tokens: 10,
                ignore_eos: true,
                logit_bias: vec![(7, 30.0)],
                ..Default::default()
            },
            false,
            false,
        ),
        (GenerateParams { sampling: sampled(4), max_tokens: 10, ignore_eos: true, ..Default::default() }, false, true),
    ];
    let mut streams: Vec<RequestStream> = cases
        .iter()
        .map(|(g, constrained, logprobs)| {
            let mut r = Request::new(Prompt::Tokens(prompt.clone()), g.clone());
            r.constraint = constrained.then(|| digits.clone());
            r.logprobs = logprobs.then_some(2);
            h.submit(r).unwrap()
        })
        .collect();
    let outs: Vec<_> = streams.iter_mut().map(drain).collect();
    for (i, ((g, constrained, logprobs), (toks, text, fin, lps))) in cases.iter().zip(&outs).enumerate() {
        assert_eq!(*lps, if *logprobs { toks.len() } else { 0 }, "case {i}: logprobs");
        if *constrained {
            assert!((2..=6).contains(&text.len()) && text.bytes().all(|b| b.is_ascii_digit()), "case {i}: {text:?}");
            assert_eq!(*fin, FinishReason::Stop, "case {i}");
        } else {
            let want = alone.generate(&prompt, g, &mut |_| true).unwrap();
            assert_eq!((toks, fin), (&want.tokens, &want.finish_reason), "case {i}: service vs generate");
        }
    }
    // the bias reaches the pick: token 7 at +30 wins every greedy step
    assert!(outs[5].0.iter().all(|&t| t == 7), "{:?}", outs[5].0);
    // logprobs change no pick
    assert_eq!(outs[2].0, outs[3].0);
}
