//! The prefix cache on SmolLM2: a request sharing a 1,000-token prefix with an earlier one
//! reaches its first token in a fraction of the time. Its own test binary so that no other
//! test competes for the cores while it is timed.

mod common;
use common::*;
use quarrel_engine::*;

fn greedy(max_tokens: usize) -> GenerateParams {
    GenerateParams { sampling: SamplingParams::greedy(), max_tokens, ..Default::default() }
}

#[test]
fn prefix_cache_cuts_time_to_first_token() {
    let Some(path) = smollm2() else { return };
    let text = std::fs::read_to_string(fixture("text/gpl-3.txt")).unwrap();
    let h = EngineHandle::spawn(engine(&path, EngineOptions { n_ctx: 2048, n_seq: 2, ..Default::default() }), ServiceOptions::default());
    let ids = h.tokenizer().encode(&text, true, false);
    let shared = ids[..1000].to_vec();
    let ttft = |suffix: &[u32]| {
        let mut p = shared.clone();
        p.extend_from_slice(suffix);
        let mut s = h.submit(Request::new(Prompt::Tokens(p), greedy(1))).unwrap();
        let mut t = None;
        let mut usage = None;
        while let Some(ev) = s.blocking_next() {
            if let StreamEvent::Done { timings, usage: u, .. } = ev {
                t = Some(timings.ttft);
                usage = Some(u);
            }
        }
        (t.unwrap(), usage.unwrap())
    };
    let (first, u1) = ttft(&ids[1000..1010]);
    let (second, u2) = ttft(&ids[2000..2012]);
    eprintln!("ttft first {first:?} (cached {}), second {second:?} (cached {})", u1.cached_tokens, u2.cached_tokens);
    assert_eq!(u1.cached_tokens, 0);
    assert!(u2.cached_tokens >= 992, "{u2:?}");
    assert!(second.as_secs_f64() <= 0.15 * first.as_secs_f64(), "second {second:?} vs first {first:?}");
}
