//! Continuous batching on SmolLM2: concurrent requests give exactly what each gives alone,
//! cancellation frees memory, errors and back-pressure, embeddings.

mod common;
use common::*;
use quarrel_engine::*;
use std::time::{Duration, Instant};

fn greedy(max_tokens: usize) -> GenerateParams {
    GenerateParams { sampling: SamplingParams::greedy(), max_tokens, ..Default::default() }
}

/// Prompts of different lengths from different places of the test text (no shared prefix).
fn prompts(e: &Engine<quarrel_cpu::CpuBackend>, n: usize) -> Vec<Vec<u32>> {
    let text = std::fs::read_to_string(fixture("text/gpl-3.txt")).unwrap();
    let ids = e.tokenize(&text, false);
    (0..n)
        .map(|i| {
            let len = 4 + (i * 37) % 150;
            let at = 100 + i * 411;
            let mut p = vec![e.tokenizer.bos_id().unwrap_or(0)];
            p.extend_from_slice(&ids[at..at + len]);
            p
        })
        .collect()
}

fn drain(s: &mut RequestStream) -> (Vec<u32>, String, Option<FinishReason>) {
    let (mut toks, mut text, mut fin) = (vec![], String::new(), None);
    while let Some(ev) = s.blocking_next() {
        match ev {
            StreamEvent::Token { id, text: t, .. } => {
                toks.extend(id);
                text.push_str(&t);
            }
            StreamEvent::Done { finish_reason, .. } => fin = Some(finish_reason),
            StreamEvent::Error(e) => panic!("{e}"),
        }
    }
    (toks, text, fin)
}

#[test]
fn sixteen_concurrent_greedy_requests_match_running_alone() {
    let Some(path) = smollm2() else { return };
    let opts = EngineOptions { n_ctx: 512, n_seq: 16, ..Default::default() };
    let mut alone = engine(&path, opts.clone());
    let ps = prompts(&alone, 16);
    let want: Vec<(Vec<u32>, String)> = ps
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let c = alone.generate(p, &greedy(8 + i * 3), &mut |_| true).unwrap();
            (c.tokens, c.text)
        })
        .collect();
    let h = EngineHandle::spawn(engine(&path, opts), ServiceOptions { prompt_chunk: 512, ..Default::default() });
    let mut streams: Vec<RequestStream> =
        ps.iter().enumerate().map(|(i, p)| h.submit(Request::new(Prompt::Tokens(p.clone()), greedy(8 + i * 3))).unwrap()).collect();
    for (i, s) in streams.iter_mut().enumerate() {
        let (toks, text, fin) = drain(s);
        assert_eq!(toks, want[i].0, "request {i}: tokens differ from running alone");
        assert_eq!(text, want[i].1, "request {i}");
        assert!(fin.is_some());
    }
    wait_all_free(&h);
    assert_eq!(h.metrics().requests_finished_total, 16);
}

#[test]
fn dropping_a_stream_frees_its_blocks_and_others_continue() {
    let Some(path) = smollm2() else { return };
    let h = EngineHandle::spawn(engine(&path, EngineOptions { n_ctx: 256, n_seq: 4, ..Default::default() }), ServiceOptions::default());
    let mut long = h
        .submit(Request::new(Prompt::Text("Once upon a time".into()), GenerateParams { max_tokens: 200, ignore_eos: true, ..greedy(200) }))
        .unwrap();
    let mut short = h.submit(Request::new(Prompt::Text("The capital of France is".into()), greedy(6))).unwrap();
    // wait until the long one streams
    while let Some(ev) = long.blocking_next() {
        if matches!(ev, StreamEvent::Token { id: Some(_), .. }) {
            break;
        }
    }
    // the metrics snapshot is published after the step that sent the token: wait for it
    let t0 = Instant::now();
    while h.metrics().kv_blocks_used == 0 {
        assert!(t0.elapsed() < Duration::from_secs(10), "a running request holds no blocks: {:?}", h.metrics());
        std::thread::sleep(Duration::from_millis(1));
    }
    drop(long);
    let (toks, _, fin) = drain(&mut short);
    assert!(!toks.is_empty() && fin.is_some());
    wait_all_free(&h);
}

/// The metrics snapshot is published right after the step that sent the last event.
fn wait_all_free(h: &EngineHandle) {
    let t0 = Instant::now();
    while h.metrics().kv_blocks_used > 0 {
        assert!(t0.elapsed() < Duration::from_secs(10), "blocks not freed: {:?}", h.metrics());
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn errors_are_clear_and_the_queue_bounded() {
    let Some(path) = smollm2() else { return };
    let h = EngineHandle::spawn(
        engine(&path, EngineOptions { n_ctx: 64, ..Default::default() }),
        ServiceOptions { max_queue: 2, ..Default::default() },
    );
    let long: String = "word ".repeat(200);
    assert!(matches!(h.submit(Request::new(Prompt::Text(long), greedy(4))), Err(ServiceError::PromptTooLong { .. })));
    assert!(matches!(h.submit(Request::new(Prompt::Tokens(vec![]), greedy(4))), Err(ServiceError::InvalidRequest(_))));
    assert!(matches!(h.submit(Request::new(Prompt::Tokens(vec![u32::MAX]), greedy(4))), Err(ServiceError::InvalidRequest(_))));
    let mut bad = greedy(4);
    bad.sampling.temperature = -1.0;
    assert!(matches!(h.submit(Request::new(Prompt::Text("hi".into()), bad)), Err(ServiceError::InvalidRequest(_))));
    // flood: beyond 2 waiting requests the service says overloaded
    let mut held = vec![];
    let mut overloaded = false;
    for _ in 0..50 {
        match h.submit(Request::new(Prompt::Text("hello".into()), greedy(30))) {
            Ok(s) => held.push(s),
            Err(ServiceError::Overloaded { .. }) => {
                overloaded = true;
                break;
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert!(overloaded);
    for s in &mut held {
        drain(s);
    }
    // a timeout ends a request with an error
    let mut r = Request::new(Prompt::Text("hello".into()), GenerateParams { ignore_eos: true, ..greedy(10_000) });
    r.timeout = Some(Duration::from_millis(200));
    let mut s = h.submit(r).unwrap();
    let mut timed_out = false;
    while let Some(ev) = s.blocking_next() {
        if let StreamEvent::Error(ServiceError::Timeout) = ev {
            timed_out = true;
        }
    }
    assert!(timed_out);
}

#[test]
fn embeddings_are_normalized_and_deterministic() {
    let Some(path) = smollm2() else { return };
    let h = EngineHandle::spawn(engine(&path, EngineOptions { n_ctx: 256, ..Default::default() }), ServiceOptions::default());
    let inputs = vec![
        Prompt::Text("The cat sat on the mat.".into()),
        Prompt::Text("A feline rested on a rug.".into()),
        Prompt::Text("Stock prices fell sharply.".into()),
    ];
    let v = h.embed_blocking(inputs.clone(), Pooling::Mean, true).unwrap();
    assert_eq!(v.len(), 3);
    for x in &v {
        assert_eq!(x.len(), h.info().n_embd);
        let n: f32 = x.iter().map(|a| a * a).sum::<f32>().sqrt();
        assert!((n - 1.0).abs() < 1e-4);
    }
    assert_eq!(h.embed_blocking(inputs, Pooling::Mean, true).unwrap(), v);
    wait_all_free(&h);
}
