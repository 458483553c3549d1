//! `Engine::generate` and the service run the same decode logic (`decode::SeqDecoder`): on
//! SmolLM2 they give the same tokens, text and finish reason for greedy and seeded requests,
//! with stop strings, `max_tokens` and a full context; a logprobs request (picked on the host)
//! gives the tokens of the same request without logprobs (picked on the backend).

mod common;
use common::*;
use quarrel_engine::*;

fn drain(s: &mut RequestStream) -> (Vec<u32>, String, FinishReason, Vec<TokenLogprob>) {
    let (mut toks, mut text, mut fin, mut lps) = (vec![], String::new(), None, vec![]);
    while let Some(ev) = s.blocking_next() {
        match ev {
            StreamEvent::Token { id, text: t, logprob } => {
                toks.extend(id);
                text.push_str(&t);
                lps.extend(logprob);
            }
            StreamEvent::Done { finish_reason, .. } => fin = Some(finish_reason),
            StreamEvent::Error(e) => panic!("{e}"),
        }
    }
    (toks, text, fin.expect("the stream ends with Done"), lps)
}

const PROMPTS: [&str; 4] =
    ["The capital of France is", "Once upon a time, in a small village,", "def fibonacci(n):", "List three colors:\n1."];

fn sampled(seed: u64) -> SamplingParams {
    SamplingParams { temperature: 0.9, top_k: 40, top_p: 0.95, min_p: 0.05, seed, ..Default::default() }
}

/// Every case's request through `generate` and, all at once, through the service: the same
/// tokens, text and finish reason.
fn assert_paths_agree(n_ctx: usize, cases: &[(Vec<u32>, GenerateParams)]) {
    let Some(path) = smollm2() else { return };
    let opts = EngineOptions { n_ctx, n_seq: cases.len(), ..Default::default() };
    let mut alone = engine(&path, opts.clone());
    let want: Vec<Completion> = cases.iter().map(|(p, g)| alone.generate(p, g, &mut |_| true).unwrap()).collect();
    let h = EngineHandle::spawn(engine(&path, opts), ServiceOptions::default());
    let mut streams: Vec<RequestStream> =
        cases.iter().map(|(p, g)| h.submit(Request::new(Prompt::Tokens(p.clone()), g.clone())).unwrap()).collect();
    for (i, s) in streams.iter_mut().enumerate() {
        let (toks, text, fin, _) = drain(s);
        assert!(!want[i].tokens.is_empty(), "case {i}: nothing generated, the comparison would be empty");
        assert_eq!(toks, want[i].tokens, "case {i}: tokens differ between generate and the service");
        assert_eq!(text, want[i].text, "case {i}: text");
        assert_eq!(fin, want[i].finish_reason, "case {i}: finish reason");
    }
}

#[test]
fn greedy_generate_equals_the_service_with_stops_and_limits() {
    let Some(path) = smollm2() else { return };
    let e = engine(&path, EngineOptions { n_ctx: 256, ..Default::default() });
    let mut probe = engine(&path, EngineOptions { n_ctx: 256, ..Default::default() });
    let greedy =
        |max_tokens, stop: Vec<String>| GenerateParams { sampling: SamplingParams::greedy(), max_tokens, stop, ..Default::default() };
    let mut cases = vec![];
    for (i, p) in PROMPTS.iter().enumerate() {
        let ids = e.tokenize(p, true);
        cases.push((ids.clone(), greedy(6 + 5 * i, vec![])));
        // a stop string taken from the middle of the greedy text, so that it does match
        let text = probe.generate(&ids, &greedy(24, vec![]), &mut |_| true).unwrap().text;
        let mid: String = text.chars().skip(text.chars().count() / 2).take(3).collect();
        if !mid.trim().is_empty() {
            cases.push((ids.clone(), greedy(24, vec!["never in the text".into(), mid])));
        }
    }
    assert!(cases.len() >= 6);
    assert_paths_agree(256, &cases);
}

#[test]
fn a_full_context_ends_both_paths_alike() {
    let Some(path) = smollm2() else { return };
    let e = engine(&path, EngineOptions { n_ctx: 40, ..Default::default() });
    let ids = e.tokenize("Count: one, two, three, four, five, six, seven, eight, nine, ten,", true);
    assert!(ids.len() + 4 < 40, "the prompt leaves room to generate");
    let g = GenerateParams { sampling: SamplingParams::greedy(), max_tokens: 100, ignore_eos: true, ..Default::default() };
    let mut alone = engine(&path, EngineOptions { n_ctx: 40, ..Default::default() });
    assert_eq!(alone.generate(&ids, &g, &mut |_| true).unwrap().finish_reason, FinishReason::ContextFull);
    assert_paths_agree(40, &[(ids, g)]);
}

#[test]
fn seeded_sampling_generate_equals_the_service() {
    let Some(path) = smollm2() else { return };
    let e = engine(&path, EngineOptions { n_ctx: 256, ..Default::default() });
    let mut cases = vec![];
    for (i, p) in PROMPTS.iter().enumerate() {
        let ids = e.tokenize(p, true);
        cases.push((ids.clone(), GenerateParams { sampling: sampled(11 + i as u64), max_tokens: 20, ..Default::default() }));
        // penalties (a chain whose greedy pick is not the plain argmax) and all-token top-k
        let mut s = sampled(99);
        s.repeat_penalty = 1.3;
        s.top_k = if i % 2 == 0 { 0 } else { 5 };
        cases.push((ids.clone(), GenerateParams { sampling: s, max_tokens: 16, ..Default::default() }));
        // greedy with a penalty: the chain at temperature 0, next to sampled rows in a batch
        let g = SamplingParams { repeat_penalty: 1.5, ..SamplingParams::greedy() };
        cases.push((ids, GenerateParams { sampling: g, max_tokens: 12, ..Default::default() }));
    }
    assert_paths_agree(256, &cases);
    // different seeds give different samples (the comparison above is not of constants)
    let Some(path) = smollm2() else { return };
    let mut alone = engine(&path, EngineOptions { n_ctx: 256, ..Default::default() });
    let ids = alone.tokenize(PROMPTS[1], true);
    let outs: Vec<Vec<u32>> = (0..4)
        .map(|seed| {
            alone
                .generate(&ids, &GenerateParams { sampling: sampled(seed), max_tokens: 16, ..Default::default() }, &mut |_| true)
                .unwrap()
                .tokens
        })
        .collect();
    assert!(outs.iter().any(|o| o != &outs[0]), "four seeds gave one sample: {outs:?}");
}

#[test]
fn logprobs_requests_pick_the_same_tokens() {
    let Some(path) = smollm2() else { return };
    let opts = EngineOptions { n_ctx: 256, n_seq: 4, ..Default::default() };
    let mut alone = engine(&path, opts.clone());
    let h = EngineHandle::spawn(engine(&path, opts), ServiceOptions::default());
    for (i, sampling) in [SamplingParams::greedy(), sampled(5)].into_iter().enumerate() {
        let ids = alone.tokenize(PROMPTS[i], true);
        let g = GenerateParams { sampling, max_tokens: 12, ..Default::default() };
        let want = alone.generate(&ids, &g, &mut |_| true).unwrap();
        // with and without logprobs in one batch: host and backend picks side by side
        let mut with = Request::new(Prompt::Tokens(ids.clone()), g.clone());
        with.logprobs = Some(3);
        let mut a = h.submit(with).unwrap();
        let mut b = h.submit(Request::new(Prompt::Tokens(ids), g)).unwrap();
        let (ta, text_a, fa, lps) = drain(&mut a);
        let (tb, _, fb, none) = drain(&mut b);
        assert_eq!(ta, want.tokens, "case {i}: logprobs request vs generate");
        assert_eq!(tb, want.tokens, "case {i}: plain request vs generate");
        assert_eq!((text_a, fa, fb), (want.text.clone(), want.finish_reason, want.finish_reason));
        assert!(none.is_empty(), "no logprobs unless asked");
        assert_eq!(lps.len(), ta.len(), "one logprob per streamed token");
        for (lp, &t) in lps.iter().zip(&ta) {
            assert_eq!(lp.token, t);
            assert!(lp.logprob <= 0.0 && lp.logprob.is_finite());
            assert_eq!(lp.top.len(), 3);
            assert!(lp.top.windows(2).all(|w| w[0].2 >= w[1].2), "top alternatives most likely first");
            assert!(lp.top[0].2 >= lp.logprob);
        }
    }
}
