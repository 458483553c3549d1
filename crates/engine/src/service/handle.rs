//! `EngineHandle`: the step loop on its own thread, fed by a command channel; requests
//! stream their events back over per-request channels.

use super::embed::EmbedJob;
use super::scheduler::Scheduler;
use super::seq::Seq;
use super::step_model::StepModel;
use super::types::*;
use crate::constraint::{Constraint, ConstraintCompiler, ConstraintSpec};
use crate::decode::{forward_picks, MaskJob, Picked, RowPick};
use crate::engine::Engine;
use crate::speculative::{DraftRequest, SpecOptions};
use quarrel_core::Backend;
use quarrel_tokenizer::Tokenizer;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::Instant;
use tokio::sync::{mpsc as tmpsc, oneshot};

enum Cmd {
    Submit(Box<Seq>),
    Abort(RequestId),
    Embed(Box<EmbedJob>),
    Shutdown,
}

struct Inner {
    tx: Mutex<mpsc::Sender<Cmd>>,
    tokenizer: Arc<Tokenizer>,
    info: ModelSummary,
    metrics: Arc<Mutex<EngineMetrics>>,
    queued: Arc<AtomicUsize>,
    next_id: AtomicU64,
    opts: ServiceOptions,
    n_ctx: usize,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// Built on the first constrained request (the token table takes a moment to build).
    compiler: OnceLock<Result<Arc<ConstraintCompiler>, String>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Ok(tx) = self.tx.lock() {
            let _ = tx.send(Cmd::Shutdown);
        }
        if let Some(t) = self.thread.lock().ok().and_then(|mut t| t.take()) {
            let _ = t.join();
        }
    }
}

/// A running engine. Cheap to clone; the step loop stops when the last clone is dropped
/// or `shutdown` is called.
#[derive(Clone)]
pub struct EngineHandle {
    inner: Arc<Inner>,
}

/// Adapter: an `Engine` drives the scheduler directly over its KV cache.
struct EngineModel<B: Backend>(Engine<B>);

impl<B: Backend> StepModel for EngineModel<B> {
    fn n_vocab(&self) -> usize {
        self.0.n_vocab()
    }

    fn forward(&mut self, batch: &quarrel_core::ForwardBatch) -> Result<Vec<f32>, String> {
        let e = &mut self.0;
        e.model.forward(&e.backend, batch, &mut e.kv).map_err(|e| e.to_string())
    }

    fn forward_picks(
        &mut self,
        batch: &quarrel_core::ForwardBatch,
        rows: &[RowPick],
        masks: Vec<MaskJob<'_>>,
    ) -> Result<Vec<Picked>, String> {
        let e = &mut self.0;
        forward_picks(&*e.model, &e.backend, batch, &mut e.kv, rows, masks).map_err(|e| e.to_string())
    }

    fn hidden(&mut self, batch: &quarrel_core::ForwardBatch) -> Result<Vec<f32>, String> {
        let e = &mut self.0;
        e.model.hidden(&e.backend, batch, &mut e.kv).map_err(|e| e.to_string())
    }

    fn causal(&self) -> bool {
        self.0.model.info().causal
    }

    fn classify(&mut self, pooled: &[f32], rows: usize) -> Result<Vec<f32>, String> {
        let e = &mut self.0;
        e.model.classify(&e.backend, pooled, rows).map_err(|e| e.to_string())
    }

    fn state_slots(&self) -> usize {
        self.0.n_state_slots
    }

    fn expert_selections(&self) -> Option<Vec<Vec<u64>>> {
        self.0.backend.moe_selections().ok().filter(|v| !v.is_empty())
    }

    fn op_times(&self) -> quarrel_models::layers::timing::OpTimes {
        self.0.model.op_times()
    }

    fn state_stats(&self) -> Option<(u64, u64)> {
        (self.0.n_state_slots > 0).then(|| self.0.backend.state_stats(&self.0.kv).ok()).flatten()
    }

    fn checkpoint_slots(&self) -> usize {
        if self.0.n_state_slots == 0 {
            0
        } else {
            self.0.opts.n_state_checkpoints
        }
    }

    fn drafting(&self) -> Option<SpecOptions> {
        let s = self.0.speculator.as_ref()?;
        // a host backend's matmuls turn compute-bound after a few rows; a GPU's after more
        // (and each drafted position is a drafter forward for every drafting request)
        let auto = if self.0.backend.computes_on_host() { 8 } else { 32 };
        Some(SpecOptions { step_budget: if s.opts.step_budget == 0 { auto } else { s.opts.step_budget }, ..s.opts })
    }

    fn draft(&mut self, reqs: &[DraftRequest<'_>]) -> Vec<Vec<u32>> {
        let Some(s) = self.0.speculator.as_mut() else { return vec![] };
        // drafts are an optimization: a failing drafter leaves the step plain
        s.drafter.draft_many(reqs).unwrap_or_default()
    }

    fn release_drafts(&mut self, key: u64) {
        if let Some(s) = self.0.speculator.as_mut() {
            s.drafter.release(key);
        }
    }

    fn copy_state(&mut self, src: u32, dst: u32) -> Result<(), String> {
        let e = &mut self.0;
        e.backend.state_copy(&mut e.kv, src as usize, dst as usize).map_err(|e| e.to_string())
    }
}

impl EngineHandle {
    /// Move `engine` onto a new thread running the step loop.
    pub fn spawn<B: Backend + Send + 'static>(engine: Engine<B>, opts: ServiceOptions) -> EngineHandle {
        let info = engine.summary();
        let n_ctx = engine.n_ctx();
        let (n_blocks, block_size) = (engine.pool.n_blocks(), engine.pool.block_size);
        let tokenizer = engine.tokenizer.clone();
        let opts = opts.resolved(engine.opts.n_batch);
        Self::spawn_model(EngineModel(engine), tokenizer, info, n_blocks, block_size, n_ctx, opts)
    }

    /// The step loop over any `StepModel` (tests use a fake model).
    pub fn spawn_model<M: StepModel + Send + 'static>(
        model: M,
        tokenizer: Arc<Tokenizer>,
        info: ModelSummary,
        n_blocks: usize,
        block_size: usize,
        n_ctx: usize,
        opts: ServiceOptions,
    ) -> EngineHandle {
        let opts = opts.resolved(512);
        let (tx, rx) = mpsc::channel();
        let queued = Arc::new(AtomicUsize::new(0));
        let metrics = Arc::new(Mutex::new(EngineMetrics::default()));
        let sched = Scheduler::new(model, tokenizer.clone(), n_blocks, block_size, n_ctx, opts.clone(), queued.clone());
        let m2 = metrics.clone();
        let thread = std::thread::Builder::new()
            .name(format!("quarrel-engine-{}", info.name))
            .spawn(move || step_loop(sched, rx, m2))
            .expect("spawning the engine thread");
        EngineHandle {
            inner: Arc::new(Inner {
                tx: Mutex::new(tx),
                tokenizer,
                info,
                metrics,
                queued,
                next_id: AtomicU64::new(1),
                opts,
                n_ctx,
                thread: Mutex::new(Some(thread)),
                compiler: OnceLock::new(),
            }),
        }
    }

    fn send(&self, cmd: Cmd) -> Result<(), ServiceError> {
        let tx = self.inner.tx.lock().map_err(|_| ServiceError::ShutDown)?;
        tx.send(cmd).map_err(|_| ServiceError::ShutDown)
    }

    pub fn info(&self) -> &ModelSummary {
        &self.inner.info
    }

    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.inner.tokenizer
    }

    pub fn n_ctx(&self) -> usize {
        self.inner.n_ctx
    }

    pub fn metrics(&self) -> EngineMetrics {
        self.inner.metrics.lock().map(|m| m.clone()).unwrap_or_default()
    }

    /// Prompt -> token ids, the way `submit` does it.
    pub fn tokenize_prompt(&self, prompt: &Prompt) -> Result<Vec<u32>, ServiceError> {
        let tok = &self.inner.tokenizer;
        Ok(match prompt {
            Prompt::Tokens(t) => {
                if let Some(&bad) = t.iter().find(|&&t| t as usize >= tok.n_vocab()) {
                    return Err(ServiceError::InvalidRequest(format!("token id {bad} is outside the vocabulary of {}", tok.n_vocab())));
                }
                t.clone()
            }
            Prompt::Text(s) => tok.encode(s, true, true),
            // message content stays text: a client cannot forge a turn with control-token texts
            Prompt::Chat { messages, options } => {
                tok.encode_chat_with(messages, true, options).map_err(|e| ServiceError::InvalidRequest(format!("chat template: {e}")))?
            }
        })
    }

    /// A matcher for `spec` over this model's vocabulary, or what is wrong with the spec.
    pub fn compile_constraint(&self, spec: &ConstraintSpec) -> Result<Constraint, ServiceError> {
        let compiler = self.inner.compiler.get_or_init(|| ConstraintCompiler::new(&self.inner.tokenizer).map(Arc::new));
        let compiler = compiler.as_ref().map_err(|e| ServiceError::InvalidRequest(format!("structured output is not available: {e}")))?;
        compiler.compile(spec).map_err(ServiceError::InvalidRequest)
    }

    /// Queue a request. Never blocks: a full queue answers `Overloaded`.
    pub fn submit(&self, req: Request) -> Result<RequestStream, ServiceError> {
        req.params.sampling.validate().map_err(ServiceError::InvalidRequest)?;
        let constraint = req.constraint.as_ref().map(|c| self.compile_constraint(c)).transpose()?;
        let tokens = self.tokenize_prompt(&req.prompt)?;
        if tokens.is_empty() {
            return Err(ServiceError::InvalidRequest("empty prompt".into()));
        }
        if tokens.len() >= self.inner.n_ctx {
            return Err(ServiceError::PromptTooLong { prompt: tokens.len(), ctx: self.inner.n_ctx });
        }
        let q = self.inner.queued.fetch_add(1, Ordering::Relaxed);
        if q >= self.inner.opts.max_queue {
            self.inner.queued.fetch_sub(1, Ordering::Relaxed);
            return Err(ServiceError::Overloaded { queued: q });
        }
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let timeout = req.timeout.or(self.inner.opts.default_timeout);
        let (tx, rx) = tmpsc::unbounded_channel();
        let seq = Seq::new(
            id,
            id,
            tokens,
            req.params,
            req.priority,
            req.logprobs,
            timeout.map(|t| Instant::now() + t),
            self.inner.tokenizer.detokenizer(),
            constraint,
            tx,
        );
        let mut seq = seq;
        seq.speculative = req.speculative;
        if let Err(e) = self.send(Cmd::Submit(Box::new(seq))) {
            self.inner.queued.fetch_sub(1, Ordering::Relaxed);
            return Err(e);
        }
        Ok(RequestStream { id, rx, handle: Some(self.clone()), done: false })
    }

    /// Cancel a request (its stream ends with `Done { finish_reason: Cancelled }`).
    pub fn abort(&self, id: RequestId) {
        let _ = self.send(Cmd::Abort(id));
    }

    /// Embeddings of each input, pooled and optionally L2-normalized.
    pub async fn embed(&self, inputs: Vec<Prompt>, pooling: Pooling, normalize: bool) -> Result<Vec<Vec<f32>>, ServiceError> {
        Ok(self.embed_matrix(inputs, pooling, normalize).await?.to_vecs())
    }

    /// `embed` as one row-major buffer (what columnar consumers such as Arrow take as is).
    pub async fn embed_matrix(&self, inputs: Vec<Prompt>, pooling: Pooling, normalize: bool) -> Result<Embeddings, ServiceError> {
        let ids = self.tokenize_inputs(&inputs)?;
        self.embed_tokens(ids, pooling, normalize, None).await
    }

    /// Token ids of embedding inputs, each checked: not empty, not longer than the context.
    /// (CPU work: async callers run it on a blocking thread.)
    pub fn tokenize_inputs(&self, inputs: &[Prompt]) -> Result<Vec<Vec<u32>>, ServiceError> {
        inputs
            .iter()
            .map(|p| {
                let t = self.tokenize_prompt(p)?;
                if t.is_empty() {
                    return Err(ServiceError::InvalidRequest("empty input".into()));
                }
                if t.len() > self.inner.n_ctx {
                    return Err(ServiceError::PromptTooLong { prompt: t.len(), ctx: self.inner.n_ctx });
                }
                Ok(t)
            })
            .collect()
    }

    /// A reranker's inputs: `query` paired with each document as the model's tokenizer pairs
    /// them ([`Tokenizer::rerank_pair`]), each checked as [`tokenize_inputs`](Self::tokenize_inputs)
    /// checks. (CPU work: async callers run it on a blocking thread.)
    pub fn rerank_inputs(&self, query: &str, documents: &[String]) -> Result<Vec<Vec<u32>>, ServiceError> {
        let tok = &self.inner.tokenizer;
        documents
            .iter()
            .map(|d| {
                let t = tok.rerank_pair(query, d);
                if t.len() > self.inner.n_ctx {
                    return Err(ServiceError::PromptTooLong { prompt: t.len(), ctx: self.inner.n_ctx });
                }
                Ok(t)
            })
            .collect()
    }

    /// Embeddings of token sequences, scheduled between generation steps. Fails with `Timeout`
    /// once `timeout` has passed; dropping the future cancels the work (the engine notices
    /// within one unit).
    pub async fn embed_tokens(
        &self,
        ids: Vec<Vec<u32>>,
        pooling: Pooling,
        normalize: bool,
        timeout: Option<std::time::Duration>,
    ) -> Result<Embeddings, ServiceError> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let (reply, rx) = oneshot::channel();
        self.send(Cmd::Embed(Box::new(EmbedJob::new(ids, pooling, normalize, deadline, reply))))?;
        rx.await.map_err(|_| ServiceError::ShutDown)?
    }

    /// Blocking variant of `embed` (outside async code).
    pub fn embed_blocking(&self, inputs: Vec<Prompt>, pooling: Pooling, normalize: bool) -> Result<Vec<Vec<f32>>, ServiceError> {
        futures_lite_block_on(self.embed(inputs, pooling, normalize))
    }

    /// Blocking variant of `embed_matrix` (outside async code).
    pub fn embed_matrix_blocking(&self, inputs: Vec<Prompt>, pooling: Pooling, normalize: bool) -> Result<Embeddings, ServiceError> {
        futures_lite_block_on(self.embed_matrix(inputs, pooling, normalize))
    }

    /// Stop the step loop: waiting and running requests end with `ShutDown`.
    pub fn shutdown(&self) {
        let _ = self.send(Cmd::Shutdown);
    }
}

/// Minimal executor for one future whose wake-up comes from another thread.
fn futures_lite_block_on<F: std::future::Future>(f: F) -> F::Output {
    use std::task::{Context, Poll, Wake, Waker};
    struct ThreadWaker(std::thread::Thread);
    impl Wake for ThreadWaker {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}

fn step_loop<M: StepModel>(mut sched: Scheduler<M>, rx: mpsc::Receiver<Cmd>, metrics: Arc<Mutex<EngineMetrics>>) {
    let publish = |s: &Scheduler<M>| {
        if let Ok(mut m) = metrics.lock() {
            *m = s.metrics.clone();
        }
    };
    publish(&sched);
    loop {
        // block only when there is nothing to do
        let first = if sched.is_idle() {
            match rx.recv() {
                Ok(c) => Some(c),
                Err(_) => break,
            }
        } else {
            None
        };
        let mut shutdown = false;
        for cmd in first.into_iter().chain(std::iter::from_fn(|| rx.try_recv().ok())) {
            match cmd {
                Cmd::Submit(s) => sched.add(*s),
                Cmd::Abort(id) => sched.abort(id),
                Cmd::Embed(job) => sched.add_embed(*job),
                Cmd::Shutdown => shutdown = true,
            }
        }
        if shutdown {
            sched.fail_all(ServiceError::ShutDown);
            publish(&sched);
            break;
        }
        if !sched.is_idle() {
            sched.round();
        }
        publish(&sched);
    }
}

/// The events of one request. Dropping it cancels the request; its KV pages are freed
/// within one engine step.
pub struct RequestStream {
    pub id: RequestId,
    rx: tmpsc::UnboundedReceiver<StreamEvent>,
    handle: Option<EngineHandle>,
    done: bool,
}

impl RequestStream {
    fn filter(&mut self, ev: Option<StreamEvent>) -> Option<StreamEvent> {
        match &ev {
            Some(StreamEvent::Done { .. }) | Some(StreamEvent::Error(_)) | None => self.done = true,
            _ => {}
        }
        ev
    }

    /// The next event; `None` after `Done` or `Error`.
    pub async fn next(&mut self) -> Option<StreamEvent> {
        if self.done {
            return None;
        }
        let ev = self.rx.recv().await;
        self.filter(ev)
    }

    pub fn blocking_next(&mut self) -> Option<StreamEvent> {
        if self.done {
            return None;
        }
        let ev = futures_lite_block_on(self.rx.recv());
        self.filter(ev)
    }
}

impl Drop for RequestStream {
    fn drop(&mut self) {
        if !self.done {
            if let Some(h) = self.handle.take() {
                // the closed channel is noticed by the next step anyway; this wakes an idle loop
                h.abort(self.id);
            }
        }
    }
}
