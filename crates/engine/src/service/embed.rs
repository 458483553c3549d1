//! Embeddings as scheduled work. An embedding request is a job the step loop advances one
//! unit at a time, between generation steps: a packed forward of several short inputs, or one
//! chunk of a long input (its blocks held until its last chunk). So a large request shares the
//! engine with chat traffic instead of holding it, ends as soon as its client goes away or its
//! time is up, and shows in health and metrics while it runs.
//!
//! Fair sharing: with generation work present, a unit is sized to take about
//! [`EMBED_SHARE`] of the time of the generation step before it; without it, about
//! [`IDLE_UNIT_SECS`] (sizes in tokens from the measured speed of earlier units, within the
//! token budget). Jobs take turns unit by unit,
//! except that a long input keeps its turn until its last chunk (recurrent models carry its
//! state in the one scratch slot).

use super::pool::PoolAcc;
use super::scheduler::Scheduler;
use super::step_model::StepModel;
use super::types::{Embeddings, Pooling, ServiceError};
use quarrel_core::{ForwardBatch, SeqBatch};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// Time of an embedding unit, as a fraction of the generation step before it.
pub const EMBED_SHARE: f64 = 0.5;

/// Time of an embedding unit when no generation runs: what a chat request that arrives then
/// waits at most before its first step (a forward cannot be interrupted).
pub const IDLE_UNIT_SECS: f64 = 0.1;

pub(crate) type EmbedReply = oneshot::Sender<Result<Embeddings, ServiceError>>;

/// One embedding request in the scheduler.
pub(crate) struct EmbedJob {
    inputs: Vec<Vec<u32>>,
    pooling: Pooling,
    normalize: bool,
    deadline: Option<Instant>,
    reply: EmbedReply,
    out: Embeddings,
    /// `inputs[..next]` are pooled into `out`.
    next: usize,
    /// `inputs[next]`, run chunk by chunk.
    long: Option<LongInput>,
}

struct LongInput {
    table: Vec<u32>,
    pool: PoolAcc,
    done: usize,
}

impl EmbedJob {
    pub(crate) fn new(inputs: Vec<Vec<u32>>, pooling: Pooling, normalize: bool, deadline: Option<Instant>, reply: EmbedReply) -> EmbedJob {
        EmbedJob { inputs, pooling, normalize, deadline, reply, out: Embeddings::default(), next: 0, long: None }
    }

    fn finished(&self) -> bool {
        self.next == self.inputs.len()
    }
}

/// Speed of recent embedding units, to size the next one to a time.
#[derive(Default)]
pub(crate) struct EmbedPace {
    tokens_per_s: Option<f64>,
}

impl EmbedPace {
    fn record(&mut self, tokens: usize, took: Duration) {
        let secs = took.as_secs_f64();
        if tokens == 0 || secs <= 0.0 {
            return;
        }
        let r = tokens as f64 / secs;
        self.tokens_per_s = Some(self.tokens_per_s.map_or(r, |old| 0.5 * old + 0.5 * r));
    }

    /// Tokens that take about `secs` (at least one).
    fn tokens_in(&self, secs: f64) -> usize {
        self.tokens_per_s.map_or(1, |r| (r * secs) as usize).max(1)
    }
}

impl<M: StepModel> Scheduler<M> {
    /// Queue an embedding job (inputs checked first: none empty, none longer than the context).
    pub(crate) fn add_embed(&mut self, job: EmbedJob) {
        if let Some(e) = self.check_embed_inputs(&job.inputs) {
            let _ = job.reply.send(Err(e));
            return;
        }
        self.embeds.push_back(job);
        self.metrics.embeddings = self.embeds.len();
    }

    fn check_embed_inputs(&self, inputs: &[Vec<u32>]) -> Option<ServiceError> {
        inputs.iter().find_map(|t| {
            if t.is_empty() {
                Some(ServiceError::InvalidRequest("empty input".into()))
            } else if t.len() > self.n_ctx {
                Some(ServiceError::PromptTooLong { prompt: t.len(), ctx: self.n_ctx })
            } else {
                None
            }
        })
    }

    pub fn has_embeds(&self) -> bool {
        !self.embeds.is_empty()
    }

    /// One round of the step loop: a generation step if there is generation work, then one
    /// embedding unit if there are embedding jobs (sized by [`EMBED_SHARE`] when both run).
    pub fn round(&mut self) {
        let generating = !self.generation_idle();
        let mut step_time = 0.0;
        if generating {
            let t0 = Instant::now();
            self.step();
            step_time = t0.elapsed().as_secs_f64();
        }
        if self.has_embeds() {
            let budget = self.opts.max_batch_tokens.max(1);
            let target = if generating { step_time * EMBED_SHARE } else { IDLE_UNIT_SECS };
            let cap = self.embed_pace.tokens_in(target).min(budget);
            self.embed_step(cap, generating);
        }
    }

    /// Advance the first embedding job by one unit of at most `cap` tokens; returns the tokens
    /// run. With `may_wait`, a unit short of KV blocks waits for generation to free some;
    /// otherwise the job fails as overloaded.
    pub(crate) fn embed_step(&mut self, cap: usize, may_wait: bool) -> usize {
        self.reap_embeds(Instant::now());
        let Some(mut job) = self.embeds.pop_front() else {
            self.refresh_metrics(0);
            return 0;
        };
        let t0 = Instant::now();
        let r = self.embed_unit(&mut job, cap, may_wait);
        let n = *r.as_ref().unwrap_or(&0);
        self.embed_pace.record(n, t0.elapsed());
        self.metrics.embedded_tokens_total += n as u64;
        self.metrics.steps_total += u64::from(n > 0);
        match r {
            Err(e) => self.end_embed(job, Err(e)),
            Ok(_) if job.finished() => {
                let out = std::mem::take(&mut job.out);
                self.end_embed(job, Ok(out));
            }
            // a long input keeps its turn (and the scratch state slot) until its last chunk
            Ok(_) if job.long.is_some() => self.embeds.push_front(job),
            Ok(_) => self.embeds.push_back(job),
        }
        self.refresh_metrics(n);
        n
    }

    fn end_embed(&mut self, mut job: EmbedJob, r: Result<Embeddings, ServiceError>) {
        if let Some(mut l) = job.long.take() {
            self.blocks.release(&mut l.table);
        }
        self.metrics.embed_requests_finished_total += 1;
        let _ = job.reply.send(r);
    }

    /// Drop jobs whose client went away (nobody to answer) or whose time is up.
    fn reap_embeds(&mut self, now: Instant) {
        let mut i = 0;
        while i < self.embeds.len() {
            let j = &self.embeds[i];
            if j.reply.is_closed() || j.deadline.is_some_and(|d| now >= d) {
                let job = self.embeds.remove(i).expect("index in range");
                self.end_embed(job, Err(ServiceError::Timeout));
            } else {
                i += 1;
            }
        }
    }

    /// Fail every embedding job (shutdown).
    pub(super) fn fail_embeds(&mut self, err: &ServiceError) {
        while let Some(job) = self.embeds.pop_front() {
            self.end_embed(job, Err(err.clone()));
        }
        self.metrics.embeddings = 0;
    }

    /// Embed token sequences now, outside the step loop (tests, single-user tools): the same
    /// units as scheduled jobs, run back to back with the whole budget.
    pub fn embed(&mut self, inputs: &[Vec<u32>], pooling: Pooling, normalize: bool) -> Result<Vec<Vec<f32>>, ServiceError> {
        Ok(self.embed_matrix(inputs, pooling, normalize)?.rows().map(<[f32]>::to_vec).collect())
    }

    /// `embed` into one row-major `(inputs, dim)` buffer (vectors written in place, no
    /// copies afterwards: Arrow and other columnar consumers take it as it is).
    pub fn embed_matrix(&mut self, inputs: &[Vec<u32>], pooling: Pooling, normalize: bool) -> Result<Embeddings, ServiceError> {
        let (tx, mut rx) = oneshot::channel();
        self.add_embed(EmbedJob::new(inputs.to_vec(), pooling, normalize, None, tx));
        let budget = self.opts.max_batch_tokens.max(1);
        loop {
            match rx.try_recv() {
                Ok(r) => return r,
                Err(oneshot::error::TryRecvError::Closed) => return Err(ServiceError::ShutDown),
                Err(oneshot::error::TryRecvError::Empty) => {
                    self.embed_step(budget, false);
                }
            }
        }
    }

    /// One unit of `job`: the next chunk of its long input, or a packed forward of as many short
    /// inputs as `cap` tokens and the free blocks allow. Every sequence attends only to its own
    /// blocks, so a text's vector does not depend on what it is batched with.
    fn embed_unit(&mut self, job: &mut EmbedJob, cap: usize, may_wait: bool) -> Result<usize, ServiceError> {
        // an encoder's token attends to its whole text: no text is cut into chunks, and the
        // unit grows to hold the next text whole (up to the most one forward may take)
        let encoder = !self.model.causal();
        let next_len = job.inputs[job.next].len();
        let most = self.opts.max_batch_tokens.max(1);
        if encoder && next_len > most {
            return Err(ServiceError::PromptTooLong { prompt: next_len, ctx: most });
        }
        let cap = if encoder { cap.max(next_len) } else { cap };
        let chunk = if encoder { cap.max(1) } else { self.opts.prompt_chunk.clamp(1, cap.max(1)) };
        if job.long.is_none() && job.inputs[job.next].len() > chunk {
            let mut table = vec![];
            if !self.blocks.reserve(&mut table, job.inputs[job.next].len()) {
                return if may_wait { Ok(0) } else { Err(ServiceError::Overloaded { queued: self.waiting.len() }) };
            }
            job.long = Some(LongInput { table, pool: PoolAcc::new(0), done: 0 });
        }
        if let Some(long) = &mut job.long {
            let toks = &job.inputs[job.next];
            let (p0, n) = (long.done, chunk.min(toks.len() - long.done));
            let last = p0 + n == toks.len();
            let want: Vec<usize> = match (job.pooling, encoder) {
                (Pooling::Mean, _) => (0..n).collect(),
                (Pooling::Cls, _) | (Pooling::Rank, true) if p0 == 0 => vec![0],
                (Pooling::Last, _) | (Pooling::Rank, false) if last => vec![n - 1],
                _ => vec![],
            };
            let batch = ForwardBatch {
                tokens: toks[p0..p0 + n].to_vec(),
                positions: (p0..p0 + n).map(|p| p as u32).collect(),
                seqs: vec![SeqBatch { start: 0, len: n, block_table: long.table.clone() }],
                logits_rows: want.clone(),
                state_slots: self.scratch_slot.into_iter().collect(),
            };
            let h = self.model.hidden(&batch).map_err(ServiceError::Inference)?;
            if !want.is_empty() {
                h.chunks(h.len() / want.len()).for_each(|r| long.pool.add(r));
            }
            long.done += n;
            if last {
                let mut l = job.long.take().expect("long input in progress");
                self.blocks.release(&mut l.table);
                let pooled = self.classify_if_rank(vec![l.pool.with(job.pooling, toks.len())], job.pooling)?;
                for p in pooled {
                    job.out.push(p, job.normalize, job.inputs.len())?;
                }
                job.next += 1;
            }
            return Ok(n);
        }
        self.embed_packed(job, cap, chunk, may_wait)
    }

    /// A packed forward of short inputs: `job`'s next ones first, then those of the jobs queued
    /// behind it with the same pooling, as many as `cap` tokens and the free blocks allow (one
    /// forward for many clients' texts). Results go to each job; the others that finish are
    /// answered here. Returns the tokens run.
    fn embed_packed(&mut self, job: &mut EmbedJob, cap: usize, chunk: usize, may_wait: bool) -> Result<usize, ServiceError> {
        let mut tables: Vec<Vec<u32>> = vec![];
        let mut inputs: Vec<Vec<u32>> = vec![];
        // (queue index or None for `job`, inputs taken)
        let mut takes: Vec<(Option<usize>, usize)> = vec![];
        let mut n_tok = 0;
        let one_per_forward = self.scratch_slot.is_some();
        'jobs: for qi in std::iter::once(None).chain((0..self.embeds.len()).map(Some)) {
            let j = match qi {
                None => &*job,
                Some(i) => &self.embeds[i],
            };
            if qi.is_some() && (j.long.is_some() || j.pooling != job.pooling) {
                continue;
            }
            let mut taken = 0;
            while j.next + taken < j.inputs.len() {
                let toks = &j.inputs[j.next + taken];
                // recurrent models have one scratch state slot: one text per forward
                if toks.len() > chunk || n_tok + toks.len() > cap || (one_per_forward && !tables.is_empty()) {
                    break;
                }
                let mut t = vec![];
                if !self.blocks.reserve(&mut t, toks.len()) {
                    if taken > 0 {
                        takes.push((qi, taken));
                    }
                    break 'jobs;
                }
                n_tok += toks.len();
                tables.push(t);
                inputs.push(toks.clone());
                taken += 1;
            }
            if taken > 0 {
                takes.push((qi, taken));
            }
            if n_tok >= cap || (one_per_forward && !tables.is_empty()) {
                break;
            }
        }
        if tables.is_empty() {
            return if may_wait { Ok(0) } else { Err(ServiceError::Overloaded { queued: self.waiting.len() }) };
        }
        let r = self.embed_group(&inputs, &tables, job.pooling).and_then(|p| self.classify_if_rank(p, job.pooling));
        for t in &mut tables {
            self.blocks.release(t);
        }
        self.metrics.embed_forward_texts_total += inputs.len() as u64;
        self.metrics.embed_forwards_total += 1;
        let mut pooled = match r {
            Ok(p) => p.into_iter(),
            Err(e) => {
                // the forward failed for every text in it
                self.fail_queued(takes.iter().filter_map(|t| t.0).collect(), &e);
                return Err(e);
            }
        };
        let mut finished = vec![];
        for &(qi, n) in &takes {
            let j = match qi {
                None => &mut *job,
                Some(i) => &mut self.embeds[i],
            };
            let total = j.inputs.len();
            for p in pooled.by_ref().take(n) {
                j.out.push(p, j.normalize, total)?;
            }
            j.next += n;
            if let Some(i) = qi.filter(|_| j.finished()) {
                finished.push(i);
            }
        }
        for i in finished.into_iter().rev() {
            let mut j = self.embeds.remove(i).expect("index in range");
            let out = std::mem::take(&mut j.out);
            self.end_embed(j, Ok(out));
        }
        Ok(n_tok)
    }

    /// Fail the queued jobs at `indices` with `e`.
    fn fail_queued(&mut self, mut indices: Vec<usize>, e: &ServiceError) {
        indices.sort_unstable();
        for i in indices.into_iter().rev() {
            if let Some(j) = self.embeds.remove(i) {
                self.end_embed(j, Err(e.clone()));
            }
        }
    }

    /// With rank pooling, the pooled states through the model's classification head (one
    /// call for the group); other poolings pass through.
    fn classify_if_rank(&mut self, pooled: Vec<PoolAcc>, pooling: Pooling) -> Result<Vec<PoolAcc>, ServiceError> {
        if pooling != Pooling::Rank || pooled.is_empty() {
            return Ok(pooled);
        }
        let rows = pooled.len();
        let flat: Vec<f32> = pooled.iter().flat_map(|p| p.row().iter().copied()).collect();
        let scores = self.model.classify(&flat, rows).map_err(ServiceError::InvalidRequest)?;
        if scores.is_empty() || scores.len() % rows != 0 {
            return Err(ServiceError::Inference(format!("{} scores for {rows} inputs", scores.len())));
        }
        Ok(scores.chunks(scores.len() / rows).map(|s| PoolAcc::of(s.to_vec())).collect())
    }

    /// One forward over several short sequences, each with its own block table.
    fn embed_group(&mut self, inputs: &[Vec<u32>], tables: &[Vec<u32>], pooling: Pooling) -> Result<Vec<PoolAcc>, ServiceError> {
        let encoder = !self.model.causal();
        let mut batch = ForwardBatch {
            tokens: vec![],
            positions: vec![],
            seqs: vec![],
            logits_rows: vec![],
            state_slots: self.scratch_slot.into_iter().collect(),
        };
        let mut rows_per_seq = Vec::with_capacity(inputs.len());
        for (toks, table) in inputs.iter().zip(tables) {
            let start = batch.tokens.len();
            batch.tokens.extend_from_slice(toks);
            batch.positions.extend(0..toks.len() as u32);
            batch.seqs.push(SeqBatch { start, len: toks.len(), block_table: table.clone() });
            let want: Vec<usize> = match (pooling, encoder) {
                (Pooling::Mean, _) => (start..start + toks.len()).collect(),
                (Pooling::Cls, _) | (Pooling::Rank, true) => vec![start],
                (Pooling::Last, _) | (Pooling::Rank, false) => vec![start + toks.len() - 1],
            };
            rows_per_seq.push(want.len());
            batch.logits_rows.extend(want);
        }
        let h = self.model.hidden(&batch).map_err(ServiceError::Inference)?;
        let n_rows = batch.logits_rows.len();
        if n_rows == 0 || h.len() % n_rows != 0 {
            return Err(ServiceError::Inference(format!("hidden states of {} values for {n_rows} rows", h.len())));
        }
        let d = h.len() / n_rows;
        let mut rows = h.chunks(d);
        let mut out = Vec::with_capacity(inputs.len());
        for (toks, &n) in inputs.iter().zip(&rows_per_seq) {
            let mut pool = PoolAcc::new(d);
            rows.by_ref().take(n).for_each(|r| pool.add(r));
            out.push(pool.with(pooling, toks.len()));
        }
        Ok(out)
    }
}
