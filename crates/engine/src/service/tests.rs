//! Property tests of the scheduler against a fake model whose logits depend on exactly the
//! tokens stored in the KV slots its block table points at: wrong tables, wrong prefix
//! sharing or a lost recompute after preemption all change its outputs.

use super::scheduler::Scheduler;
use super::seq::Seq;
use super::step_model::StepModel;
use super::types::*;
use crate::generate::{FinishReason, GenerateParams};
use crate::sampler::SamplingParams;
use proptest::prelude::*;
use quarrel_core::ForwardBatch;
use quarrel_tokenizer::Tokenizer;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, OnceLock};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

const BS: usize = 4;
const N_VOCAB: usize = 96;

struct FakeModel {
    slots: Vec<Option<u32>>,
    max_batch: usize,
    /// Largest batch seen (the budget check).
    pub peak_batch: usize,
    eog: u32,
}

impl StepModel for FakeModel {
    fn n_vocab(&self) -> usize {
        N_VOCAB
    }

    fn forward(&mut self, b: &ForwardBatch) -> Result<Vec<f32>, String> {
        let mut out = vec![];
        for h in self.store_and_hash(b) {
            let mut logits = vec![0f32; N_VOCAB];
            // mostly ordinary tokens, sometimes end-of-generation
            let top = if h % 23 == 0 { self.eog as usize } else { (h % 90) as usize + 3 };
            logits[top] = 5.0;
            logits[(h >> 20) as usize % N_VOCAB] += 2.0;
            out.extend(logits);
        }
        Ok(out)
    }

    /// `[token, 1, f(tokens in the KV slots up to this position)]`: a wrong block table or
    /// a neighbour's tokens change the third value.
    fn hidden(&mut self, b: &ForwardBatch) -> Result<Vec<f32>, String> {
        let hs = self.store_and_hash(b);
        Ok(b.logits_rows.iter().zip(hs).flat_map(|(&r, h)| vec![b.tokens[r] as f32, 1.0, (h % 1021) as f32]).collect())
    }
}

impl FakeModel {
    /// Write the batch's tokens into their KV slots, then hash each logits row's sequence
    /// prefix as read back from the slots.
    fn store_and_hash(&mut self, b: &ForwardBatch) -> Vec<u64> {
        assert!(b.n_tokens() <= self.max_batch, "batch of {} over the budget {}", b.n_tokens(), self.max_batch);
        self.peak_batch = self.peak_batch.max(b.n_tokens());
        let slot = |table: &[u32], p: usize| table[p / BS] as usize * BS + p % BS;
        for s in &b.seqs {
            for t in s.start..s.start + s.len {
                self.slots[slot(&s.block_table, b.positions[t] as usize)] = Some(b.tokens[t]);
            }
        }
        let mut out = vec![];
        for &r in &b.logits_rows {
            let s = b.seqs.iter().find(|s| (s.start..s.start + s.len).contains(&r)).unwrap();
            let mut h: u64 = 1469598103934665603;
            for p in 0..=b.positions[r] as usize {
                let t = self.slots[slot(&s.block_table, p)].expect("reading a KV slot never written");
                h = (h ^ t as u64).wrapping_mul(1099511628211);
            }
            out.push(h);
        }
        out
    }
}

fn tokenizer() -> Arc<Tokenizer> {
    static TOK: OnceLock<Arc<Tokenizer>> = OnceLock::new();
    TOK.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny.gguf");
        quarrel_synth::write_tiny(&path, quarrel_synth::Ftype::F32, 1).unwrap();
        let g = quarrel_gguf::Gguf::open(&path).unwrap();
        Arc::new(Tokenizer::from_gguf(&g).unwrap())
    })
    .clone()
}

fn sched(n_blocks: usize, n_ctx: usize, opts: ServiceOptions) -> Scheduler<FakeModel> {
    let opts = opts.resolved(5);
    let tok = tokenizer();
    let eog = tok.eog_ids()[0];
    let model = FakeModel { slots: vec![None; n_blocks * BS], max_batch: opts.max_batch_tokens, peak_batch: 0, eog };
    Scheduler::new(model, tok, n_blocks, BS, n_ctx, opts, Arc::new(AtomicUsize::new(0)))
}

#[derive(Clone, Debug)]
struct Req {
    prompt: Vec<u32>,
    max_tokens: usize,
    seed: Option<u64>,
    arrive: usize,
    cancel_after: Option<usize>,
    batch: bool,
}

fn params(r: &Req) -> GenerateParams {
    let sampling = match r.seed {
        None => SamplingParams::greedy(),
        Some(seed) => SamplingParams { temperature: 1.0, seed, ..Default::default() },
    };
    GenerateParams { sampling, max_tokens: r.max_tokens, ..Default::default() }
}

fn seq(id: u64, r: &Req) -> (Seq, UnboundedReceiver<StreamEvent>) {
    let (tx, rx) = unbounded_channel();
    let prio = if r.batch { Priority::Batch } else { Priority::Interactive };
    let s = Seq::new(id, id, r.prompt.clone(), params(r), prio, None, None, tokenizer().detokenizer(), None, tx);
    (s, rx)
}

/// Tokens and finish reason from draining a request's events.
fn collect(rx: &mut UnboundedReceiver<StreamEvent>) -> (Vec<u32>, Option<FinishReason>) {
    let (mut toks, mut fin) = (vec![], None);
    while let Ok(ev) = rx.try_recv() {
        match ev {
            StreamEvent::Token { id: Some(t), .. } => toks.push(t),
            StreamEvent::Done { finish_reason, .. } => fin = Some(finish_reason),
            StreamEvent::Error(e) => panic!("unexpected error {e}"),
            _ => {}
        }
    }
    (toks, fin)
}

fn solo(r: &Req, n_ctx: usize) -> Vec<u32> {
    let mut s = sched(n_ctx.div_ceil(BS), n_ctx, ServiceOptions { max_batch_tokens: 7, prompt_chunk: 5, ..Default::default() });
    let (q, mut rx) = seq(1, r);
    s.add(q);
    while !s.is_idle() {
        s.step();
    }
    collect(&mut rx).0
}

fn arb_req() -> impl Strategy<Value = Req> {
    (
        1usize..30,
        0u32..3,
        1usize..20,
        proptest::option::weighted(0.3, any::<u64>()),
        0usize..25,
        proptest::option::weighted(0.2, 0usize..15),
        any::<bool>(),
    )
        .prop_map(|(len, prefix_kind, max_tokens, seed, arrive, cancel_after, batch)| {
            // a few shared prefixes so that the prefix cache gets hits
            let prompt = (0..len as u32).map(|i| if i < 9 { i + prefix_kind * 10 + 3 } else { (i * 7 + len as u32) % 90 + 3 }).collect();
            Req { prompt, max_tokens, seed, arrive, cancel_after, batch }
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn traces_keep_budget_never_leak_and_match_solo_runs(
        reqs in proptest::collection::vec(arb_req(), 1..12),
        n_blocks in 13usize..40,
        max_batch_tokens in 1usize..24,
        prompt_chunk in 1usize..9,
        max_running in 1usize..8,
        prefix_cache in any::<bool>(),
    ) {
        let n_ctx = 52;
        let opts = ServiceOptions { max_batch_tokens, prompt_chunk, max_running, prefix_cache, ..Default::default() };
        let mut s = sched(n_blocks, n_ctx, opts);
        let mut rxs: Vec<Option<UnboundedReceiver<StreamEvent>>> = (0..reqs.len()).map(|_| None).collect();
        let mut results: Vec<Option<(Vec<u32>, Option<FinishReason>)>> = vec![None; reqs.len()];
        let mut got: Vec<Vec<u32>> = vec![vec![]; reqs.len()];
        let mut step = 0;
        loop {
            for (i, r) in reqs.iter().enumerate() {
                if r.arrive == step {
                    let (q, rx) = seq(i as u64 + 1, r);
                    s.add(q);
                    rxs[i] = Some(rx);
                }
            }
            // drain events; cancel by dropping the receiver
            for (i, r) in reqs.iter().enumerate() {
                if let Some(rx) = rxs[i].as_mut() {
                    let (t, fin) = collect(rx);
                    got[i].extend(t);
                    if fin.is_some() {
                        results[i] = Some((got[i].clone(), fin));
                        rxs[i] = None;
                    } else if r.cancel_after.is_some_and(|c| got[i].len() >= c) {
                        rxs[i] = None;
                        results[i] = Some((got[i].clone(), Some(FinishReason::Cancelled)));
                    }
                }
            }
            let arrivals_left = reqs.iter().any(|r| r.arrive > step);
            if s.is_idle() && !arrivals_left {
                break;
            }
            let n = s.step();
            prop_assert!(n <= max_batch_tokens);
            step += 1;
            prop_assert!(step < 10_000, "no progress");
        }
        // pool whole again: every block free (cached blocks count as free)
        prop_assert_eq!(s.metrics.kv_blocks_free, n_blocks);
        prop_assert_eq!(s.metrics.kv_blocks_used, 0);
        prop_assert!(s.model.peak_batch <= max_batch_tokens);
        for (i, r) in reqs.iter().enumerate() {
            let (toks, fin) = results[i].clone().expect("every request finished");
            let alone = solo(r, n_ctx);
            if fin == Some(FinishReason::Cancelled) {
                prop_assert_eq!(&toks[..], &alone[..toks.len()], "request {} (cancelled) diverged", i);
            } else {
                prop_assert_eq!(&toks, &alone, "request {} diverged from its solo run", i);
            }
        }
    }
}

#[test]
fn interactive_requests_go_first() {
    let mut s = sched(64, 52, ServiceOptions { max_batch_tokens: 64, max_running: 1, ..Default::default() });
    let batch = Req { prompt: vec![5, 6, 7], max_tokens: 3, seed: None, arrive: 0, cancel_after: None, batch: true };
    let inter = Req { batch: false, ..batch.clone() };
    let (a, mut ra) = seq(1, &batch);
    let (b, mut rb) = seq(2, &inter);
    s.add(a);
    s.add(b);
    s.step();
    assert!(!collect(&mut rb).0.is_empty(), "the interactive request ran first");
    assert!(collect(&mut ra).0.is_empty());
}

#[test]
fn prefix_cache_skips_shared_blocks() {
    let mut s = sched(64, 200, ServiceOptions { max_batch_tokens: 256, ..Default::default() });
    let prompt: Vec<u32> = (0..101).map(|i| i % 90 + 3).collect();
    let r = Req { prompt, max_tokens: 2, seed: None, arrive: 0, cancel_after: None, batch: false };
    let (a, _ra) = seq(1, &r);
    s.add(a);
    while !s.is_idle() {
        s.step();
    }
    let computed_before = s.metrics.prompt_tokens_total;
    let (b, _rb) = seq(2, &r);
    s.add(b);
    while !s.is_idle() {
        s.step();
    }
    // 100 of 101 prompt tokens are in full blocks before the last token: 25 blocks of 4
    assert_eq!(s.metrics.prefix_hit_tokens_total, 100);
    assert_eq!(s.metrics.prompt_tokens_total - computed_before, 1);
}

#[test]
fn embeddings_pool_and_normalize() {
    let mut s = sched(16, 52, ServiceOptions { max_batch_tokens: 3, ..Default::default() });
    let v = s.embed(&[vec![3, 5, 7, 9]], Pooling::Mean, false).unwrap();
    assert_eq!(v[0][..2], [6.0, 1.0]);
    let v = s.embed(&[vec![3, 5, 7, 9]], Pooling::Last, true).unwrap();
    let n = v[0].iter().map(|x| x * x).sum::<f32>().sqrt();
    assert!((n - 1.0).abs() < 1e-6 && (v[0][0] / v[0][1] - 9.0).abs() < 1e-4, "{:?}", v[0]);
    assert_eq!(s.embed(&[vec![3, 5]], Pooling::Cls, false).unwrap()[0][..2], [3.0, 1.0]);
    assert_eq!(s.metrics.kv_blocks_used, 0);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// Inputs packed several per forward (and long ones chunked) give exactly the vectors
    /// each input gets alone; the token budget holds and no block leaks.
    #[test]
    fn embeddings_batched_equal_alone(
        inputs in prop::collection::vec(prop::collection::vec(3u32..90, 1..14), 1..12),
        budget in 3usize..20,
        pool in 0usize..3,
        n_blocks in 4usize..40,
    ) {
        let pooling = [Pooling::Mean, Pooling::Last, Pooling::Cls][pool];
        let opts = ServiceOptions { max_batch_tokens: budget, prompt_chunk: budget.min(6), ..Default::default() };
        let mut s = sched(n_blocks, 52, opts.clone());
        let together = s.embed(&inputs, pooling, true).unwrap();
        prop_assert_eq!(s.metrics.kv_blocks_used, 0);
        prop_assert_eq!(together.len(), inputs.len());
        for (inp, v) in inputs.iter().zip(&together) {
            let mut alone = sched(40, 52, opts.clone());
            let a = alone.embed(std::slice::from_ref(inp), pooling, true).unwrap();
            prop_assert_eq!(&a[0], v);
        }
    }
}

#[test]
fn memory_pressure_preempts_and_still_matches_solo_runs() {
    let n_ctx = 52;
    let mut s = sched(14, n_ctx, ServiceOptions { max_batch_tokens: 16, max_running: 8, ..Default::default() });
    let reqs: Vec<Req> = (0..8)
        .map(|i| Req {
            prompt: (0..(10 + i * 3) as u32).map(|t| (t * 5 + i as u32) % 90 + 3).collect(),
            max_tokens: 19,
            seed: (i % 2 == 0).then_some(i as u64),
            arrive: 0,
            cancel_after: None,
            batch: i % 3 == 0,
        })
        .collect();
    let mut rxs = vec![];
    for (i, r) in reqs.iter().enumerate() {
        let (q, rx) = seq(i as u64 + 1, r);
        s.add(q);
        rxs.push(rx);
    }
    let mut got = vec![vec![]; reqs.len()];
    while !s.is_idle() {
        s.step();
        for (i, rx) in rxs.iter_mut().enumerate() {
            got[i].extend(collect(rx).0);
        }
    }
    assert!(s.metrics.preemptions_total > 0, "the trace was meant to run out of blocks");
    for (i, r) in reqs.iter().enumerate() {
        assert_eq!(got[i], solo(r, n_ctx), "request {i}");
    }
    assert_eq!(s.metrics.kv_blocks_free, 14);
}

/// The finish rules of the decoder both paths share, in their order: end of generation
/// (not streamed; ignored with `ignore_eos`), then `max_tokens`, then the context.
#[test]
fn decoder_finish_rules() {
    use crate::decode::SeqDecoder;
    let tok = tokenizer();
    let eog = tok.eog_ids()[0];
    let plain = (0..tok.n_vocab() as u32).find(|&t| !tok.is_eog(t)).unwrap();
    let g = |max_tokens, ignore_eos| GenerateParams { sampling: SamplingParams::greedy(), max_tokens, ignore_eos, ..Default::default() };
    let mut d = SeqDecoder::new(&g(3, false), None, tok.detokenizer());
    let a = d.accept(&tok, eog, None, 5, 100);
    assert!(a.token.is_none() && a.finish == Some(FinishReason::Stop), "end of generation: {a:?}");
    assert_eq!(d.generated(), 0);
    let mut d = SeqDecoder::new(&g(3, true), None, tok.detokenizer());
    let a = d.accept(&tok, eog, None, 5, 100);
    assert!(a.token.as_ref().is_some_and(|t| t.0 == eog) && a.finish.is_none(), "ignore_eos keeps going: {a:?}");
    assert_eq!(d.accept(&tok, plain, None, 6, 100).finish, None);
    assert_eq!(d.accept(&tok, plain, None, 7, 100).finish, Some(FinishReason::Length));
    assert_eq!(d.generated(), 3);
    let mut d = SeqDecoder::new(&g(3, false), None, tok.detokenizer());
    assert_eq!(d.accept(&tok, plain, None, 99, 100).finish, None);
    assert_eq!(d.accept(&tok, plain, None, 100, 100).finish, Some(FinishReason::ContextFull));
    assert_eq!(d.finish(FinishReason::ContextFull).1, FinishReason::ContextFull);
    // logprobs need the logits row: none without it
    let mut d = SeqDecoder::new(&g(3, false), Some(2), tok.detokenizer());
    let mut logits = vec![0f32; tok.n_vocab()];
    logits[plain as usize] = 3.0;
    let a = d.accept(&tok, plain, Some(&logits), 5, 100);
    let lp = a.logprob.expect("a logprob with the logits");
    assert_eq!((lp.token, lp.top.len(), lp.top[0].0), (plain, 2, plain));
    assert!(d.accept(&tok, plain, None, 6, 100).logprob.is_none());
}

/// An embedding job as the step loop gets it, and the receiver of its answer.
fn embed_job(
    inputs: &[Vec<u32>],
    deadline: Option<std::time::Instant>,
) -> (super::embed::EmbedJob, tokio::sync::oneshot::Receiver<Result<Embeddings, ServiceError>>) {
    let (tx, rx) = tokio::sync::oneshot::channel();
    (super::embed::EmbedJob::new(inputs.to_vec(), Pooling::Mean, true, deadline, tx), rx)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]
    /// Embedding jobs advanced unit by unit between generation steps (`round`): generation
    /// gives the tokens of solo runs, every vector equals the one its input gets alone, the
    /// budget holds, and no block leaks.
    #[test]
    fn embeddings_between_steps_match_alone_and_leave_generation_exact(
        reqs in proptest::collection::vec(arb_req(), 1..6),
        jobs in prop::collection::vec(prop::collection::vec(prop::collection::vec(3u32..90, 1..20), 1..6), 1..4),
        n_blocks in 16usize..40,
        max_batch_tokens in 2usize..16,
    ) {
        let n_ctx = 52;
        let opts = ServiceOptions { max_batch_tokens, prompt_chunk: max_batch_tokens.min(5), max_running: 4, ..Default::default() };
        let mut s = sched(n_blocks, n_ctx, opts.clone());
        let mut rxs = vec![];
        for (i, r) in reqs.iter().enumerate() {
            let r = Req { cancel_after: None, ..r.clone() };
            let (q, rx) = seq(i as u64 + 1, &r);
            s.add(q);
            rxs.push((r, rx));
        }
        let mut answers = vec![];
        for inputs in &jobs {
            let (job, rx) = embed_job(inputs, None);
            s.add_embed(job);
            answers.push(rx);
        }
        let mut rounds = 0;
        while !s.is_idle() {
            s.round();
            rounds += 1;
            prop_assert!(rounds < 10_000, "no progress");
        }
        prop_assert!(s.model.peak_batch <= max_batch_tokens);
        prop_assert_eq!(s.metrics.kv_blocks_used, 0);
        prop_assert_eq!(s.metrics.embeddings, 0);
        for (r, mut rx) in rxs {
            let (toks, fin) = collect(&mut rx);
            prop_assert!(fin.is_some());
            prop_assert_eq!(toks, solo(&r, n_ctx));
        }
        for (inputs, mut rx) in jobs.iter().zip(answers) {
            let got = rx.try_recv().expect("answered").expect("embedded");
            prop_assert_eq!(got.len(), inputs.len());
            for (i, inp) in inputs.iter().enumerate() {
                let mut alone = sched(40, n_ctx, opts.clone());
                let a = alone.embed(std::slice::from_ref(inp), Pooling::Mean, true).unwrap();
                prop_assert_eq!(&a[0][..], got.row(i));
            }
        }
    }
}

#[test]
fn embedding_jobs_take_turns_and_end_on_cancel_deadline_and_shutdown() {
    let opts = ServiceOptions { max_batch_tokens: 4, prompt_chunk: 4, ..Default::default() };
    let mut s = sched(24, 52, opts);
    // a long input holds its blocks between units; dropping the receiver frees them
    let (job, rx) = embed_job(&[(3..40).collect()], None);
    s.add_embed(job);
    assert_eq!(s.embed_step(4, true), 4);
    assert!(s.metrics.kv_blocks_used > 0 && s.metrics.embeddings == 1);
    drop(rx);
    assert_eq!(s.embed_step(4, true), 0);
    assert_eq!((s.metrics.kv_blocks_used, s.metrics.embeddings), (0, 0));
    // jobs of short inputs take turns unit by unit: the small one is not stuck behind the big one
    let (big, mut big_rx) = embed_job(&vec![vec![5, 6, 7, 8]; 6], None);
    let (small, mut small_rx) = embed_job(&[vec![9, 10]], None);
    s.add_embed(big);
    s.add_embed(small);
    s.embed_step(4, true);
    s.embed_step(4, true);
    assert!(small_rx.try_recv().expect("small job answered").is_ok());
    assert!(big_rx.try_recv().is_err(), "big job still running");
    // a passed deadline ends the job with Timeout at the next unit, whichever job that unit is for
    let (late, mut late_rx) = embed_job(&[vec![3, 4]], Some(std::time::Instant::now()));
    s.add_embed(late);
    s.embed_step(4, true);
    assert!(matches!(late_rx.try_recv(), Ok(Err(ServiceError::Timeout))));
    while s.has_embeds() {
        s.embed_step(4, true);
    }
    assert_eq!(big_rx.try_recv().expect("big job answered").expect("embedded").len(), 6);
    // shutdown answers what is left
    let (job, mut rx) = embed_job(&[vec![3, 4, 5]], None);
    s.add_embed(job);
    s.fail_all(ServiceError::ShutDown);
    assert!(matches!(rx.try_recv(), Ok(Err(ServiceError::ShutDown))));
    assert_eq!((s.metrics.kv_blocks_used, s.metrics.embeddings), (0, 0));
    // bad inputs are refused at once
    let (job, mut rx) = embed_job(&[vec![]], None);
    s.add_embed(job);
    assert!(matches!(rx.try_recv(), Ok(Err(ServiceError::InvalidRequest(_)))));
    let (job, mut rx) = embed_job(&[vec![3; 53]], None);
    s.add_embed(job);
    assert!(matches!(rx.try_recv(), Ok(Err(ServiceError::PromptTooLong { .. }))));
}

/// Constrained and unconstrained requests share batches: the constrained ones spell what
/// their regex allows and end when it is complete; the others are untouched (their solo runs).
#[test]
fn constrained_requests_follow_their_grammar_inside_a_batch() {
    use crate::constraint::{ConstraintCompiler, ConstraintSpec};
    let tok = tokenizer();
    let compiler = ConstraintCompiler::new(&tok).unwrap();
    let n_ctx = 64;
    let mut s = sched(48, n_ctx, ServiceOptions { max_batch_tokens: 16, prompt_chunk: 4, max_running: 6, ..Default::default() });
    let mut runs = vec![];
    for i in 0..6u64 {
        let prompt = (0..5 + i as u32).map(|t| (t * 7 + i as u32) % 90 + 3).collect();
        let r = Req { prompt, max_tokens: 12, seed: (i % 2 == 1).then_some(i), arrive: 0, cancel_after: None, batch: false };
        let (tx, rx) = unbounded_channel();
        let c = (i % 3 != 0).then(|| compiler.compile(&ConstraintSpec::Regex("[0-9]{2,6}".into())).unwrap());
        let constrained = c.is_some();
        s.add(Seq::new(i + 1, i + 1, r.prompt.clone(), params(&r), Priority::Interactive, None, None, tok.detokenizer(), c, tx));
        runs.push((r, constrained, rx));
    }
    while !s.is_idle() {
        s.step();
    }
    for (r, constrained, mut rx) in runs {
        let (toks, fin) = collect(&mut rx);
        if constrained {
            let text: Vec<u8> = toks.iter().flat_map(|&t| tok.token_to_piece(t, false)).collect();
            assert!((2..=6).contains(&text.len()) && text.iter().all(u8::is_ascii_digit), "{:?}", String::from_utf8_lossy(&text));
            assert_eq!(fin, Some(FinishReason::Stop));
        } else {
            assert_eq!(toks, solo(&r, n_ctx));
        }
    }
}
