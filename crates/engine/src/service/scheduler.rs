//! The step loop's brain: each step builds one batch under a token budget from running
//! decodes, running prompt chunks and newly admitted requests; runs it; samples; streams;
//! retires finished requests. Memory comes from the `BlockManager`; when a running decode
//! needs a block and none is free, the newest, lowest-priority request is preempted (its
//! blocks released, recomputed later), so no request fails for memory another will free.

use super::blocks::BlockManager;
use super::seq::Seq;
use super::state::Checkpoints;
use super::types::{Embeddings, EngineMetrics, Pooling, RequestId, ServiceError, ServiceOptions, StreamEvent};
use crate::generate::FinishReason;
use quarrel_core::{ForwardBatch, SeqBatch};
use quarrel_tokenizer::Tokenizer;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Generated tokens re-fed after a preemption go in pieces below the attention kernels'
/// batch threshold (64), so they are computed exactly like the decode steps that made them.
const REFEED_CHUNK: usize = 32;

/// What the scheduler needs from a model: a batched forward over the paged cache.
pub trait StepModel {
    fn n_vocab(&self) -> usize;
    /// Logits `(batch.logits_rows.len(), n_vocab)`.
    fn forward(&mut self, batch: &ForwardBatch) -> Result<Vec<f32>, String>;
    /// Final hidden states `(batch.logits_rows.len(), n_embd)` (embeddings).
    fn hidden(&mut self, batch: &ForwardBatch) -> Result<Vec<f32>, String>;
    /// Recurrent-state slots the model's cache holds (0: no recurrent layers). The last
    /// slot is scratch (embeddings); running requests get one of the others each.
    fn state_slots(&self) -> usize {
        0
    }
    /// Of `state_slots`, how many (the last ones) hold prefix checkpoints.
    fn checkpoint_slots(&self) -> usize {
        0
    }
    /// Recurrent state: (bytes allocated, non-finite values met so far).
    fn state_stats(&self) -> Option<(u64, u64)> {
        None
    }
    /// MoE models: expert selections so far, `[layer][expert]`.
    fn expert_selections(&self) -> Option<Vec<Vec<u64>>> {
        None
    }
    /// MoE routing and Mamba2 conv / scan time since load.
    fn op_times(&self) -> quarrel_models::layers::timing::OpTimes {
        Default::default()
    }
    /// Copy recurrent state slot `src` to `dst`.
    fn copy_state(&mut self, _src: u32, _dst: u32) -> Result<(), String> {
        Err("the model has no recurrent state".into())
    }
}

/// Recurrent models: prompt chunks (and so state checkpoints) every this many tokens at most.
const RECURRENT_CHUNK: usize = 128;

pub struct Scheduler<M: StepModel> {
    pub model: M,
    tok: Arc<Tokenizer>,
    blocks: BlockManager,
    opts: ServiceOptions,
    n_ctx: usize,
    waiting: Vec<Seq>,
    running: Vec<Seq>,
    /// Requests accepted but not yet admitted (shared with the handle for back-pressure).
    queued: Arc<AtomicUsize>,
    pub metrics: EngineMetrics,
    /// Recurrent models: the state slot of each running request, and the free ones.
    slot_of: std::collections::HashMap<RequestId, u32>,
    free_slots: Vec<u32>,
    scratch_slot: Option<u32>,
    /// Recurrent models: state checkpoints by the hash of the full block they end with.
    ckpt: Checkpoints,
}

impl<M: StepModel> Scheduler<M> {
    pub fn new(
        model: M,
        tok: Arc<Tokenizer>,
        n_blocks: usize,
        block_size: usize,
        n_ctx: usize,
        opts: ServiceOptions,
        queued: Arc<AtomicUsize>,
    ) -> Scheduler<M> {
        let mut opts = opts;
        let n_slots = model.state_slots();
        let n_ckpt = model.checkpoint_slots().min(n_slots.saturating_sub(2));
        let n_run = n_slots.saturating_sub(1 + n_ckpt);
        if n_slots > 0 {
            // recurrent state is per sequence, not per block: cached KV blocks resume a
            // sequence only together with a state checkpoint taken where they end. Those are
            // taken at prompt-chunk boundaries, so chunks are kept short (and whole blocks).
            if n_ckpt == 0 {
                opts.prefix_cache = false;
            } else {
                let pc = opts.prompt_chunk.min(RECURRENT_CHUNK.max(block_size));
                opts.prompt_chunk = (pc / block_size).max(1) * block_size;
            }
            opts.max_running = opts.max_running.min(n_run).max(1);
        }
        let blocks = BlockManager::new(n_blocks, block_size, opts.prefix_cache);
        debug_assert!(opts.prompt_chunk > 0 && opts.max_batch_tokens > 0, "ServiceOptions::resolved first");
        let mut s = Scheduler {
            model,
            tok,
            blocks,
            opts,
            n_ctx,
            waiting: vec![],
            running: vec![],
            queued,
            metrics: EngineMetrics::default(),
            slot_of: Default::default(),
            free_slots: (0..n_run as u32).rev().collect(),
            scratch_slot: (n_slots > 0).then_some(n_run as u32),
            ckpt: Checkpoints::new(n_run as u32 + 1..(n_run + 1 + n_ckpt) as u32),
        };
        s.refresh_metrics(0);
        s
    }

    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty()
    }

    pub(crate) fn add(&mut self, seq: Seq) {
        self.waiting.push(seq);
        self.metrics.queue_depth = self.waiting.len();
    }

    /// Cancel a request wherever it is; its pages are freed now.
    pub fn abort(&mut self, id: RequestId) {
        let found = if let Some(i) = self.waiting.iter().position(|s| s.id == id) {
            Some(self.waiting.remove(i))
        } else {
            self.running.iter().position(|s| s.id == id).map(|i| self.running.remove(i))
        };
        if let Some(mut s) = found {
            self.retire(&mut s, FinishReason::Cancelled);
        }
        self.refresh_metrics(self.metrics.last_batch_tokens);
    }

    /// Fail every request (shutdown).
    pub fn fail_all(&mut self, err: ServiceError) {
        for mut s in self.waiting.drain(..).chain(self.running.drain(..)).collect::<Vec<_>>() {
            self.release(&mut s);
            s.send(StreamEvent::Error(err.clone()));
        }
        self.refresh_metrics(0);
    }

    fn release(&mut self, s: &mut Seq) {
        self.blocks.release(&mut s.table);
        if !s.admitted {
            s.admitted = true;
            self.queued.fetch_sub(1, Ordering::Relaxed);
        }
    }

    fn retire(&mut self, s: &mut Seq, reason: FinishReason) {
        self.release(s);
        self.metrics.requests_finished_total += 1;
        s.send(StreamEvent::Done { finish_reason: reason, usage: s.usage(), timings: s.timings() });
    }

    /// Drop requests whose client went away or whose time is up.
    fn reap(&mut self, now: Instant) {
        for from_running in [false, true] {
            let list = if from_running { &mut self.running } else { &mut self.waiting };
            let mut gone = vec![];
            let mut i = 0;
            while i < list.len() {
                let s = &list[i];
                if s.tx.is_closed() || s.deadline.is_some_and(|d| now >= d) {
                    gone.push(list.remove(i));
                } else {
                    i += 1;
                }
            }
            for mut s in gone {
                self.release(&mut s);
                self.metrics.requests_finished_total += 1;
                if !s.tx.is_closed() {
                    s.send(StreamEvent::Error(ServiceError::Timeout));
                }
            }
        }
    }

    /// Tokens `s` should run this step: the rest of its current prompt chunk (chunks aligned
    /// to multiples of `prompt_chunk`, as when running alone), re-fed generated tokens in
    /// pieces small enough to take the decode path, or its one decode token. A chunk larger
    /// than the budget waits, unless the step is still empty (`full`): then it is cut.
    fn chunk_len(&self, s: &Seq, budget: usize, full: bool) -> Option<usize> {
        let pc = self.opts.prompt_chunk;
        let want = if s.n_computed < s.prompt_len {
            ((s.n_computed / pc + 1) * pc).min(s.prompt_len) - s.n_computed
        } else {
            s.remaining().min(REFEED_CHUNK)
        };
        match want {
            0 => None,
            w if w <= budget => Some(w),
            _ if full => Some(budget),
            _ => None,
        }
    }

    fn preempt(&mut self, idx: usize) {
        let s = &mut self.running[idx];
        self.blocks.release(&mut s.table);
        s.reset_kv();
        self.metrics.preemptions_total += 1;
    }

    /// One schedule -> execute -> update round. Returns the tokens processed.
    pub fn step(&mut self) -> usize {
        self.reap(Instant::now());
        let bs = self.blocks.block_size();
        let mut budget = self.opts.max_batch_tokens;
        for s in &mut self.running {
            s.sched = 0;
        }
        // 1. running requests: decodes first, then prompt chunks; older and interactive first
        let mut order: Vec<usize> = (0..self.running.len()).collect();
        order.sort_by_key(|&i| {
            let s = &self.running[i];
            (s.remaining() > 1, s.priority, s.order)
        });
        let mut victims = order.clone();
        victims.sort_by_key(|&i| {
            let s = &self.running[i];
            (std::cmp::Reverse(s.priority), std::cmp::Reverse(s.order))
        });
        let mut preempted = vec![false; self.running.len()];
        for &i in &order {
            if budget == 0 {
                break;
            }
            if preempted[i] {
                continue;
            }
            let full = budget == self.opts.max_batch_tokens;
            let Some(mut n) = self.chunk_len(&self.running[i], budget, full) else { continue };
            let (have, done) = (self.running[i].table.len(), self.running[i].n_computed);
            if self.blocks.blocks_needed(have, done + n) > self.blocks.n_available() {
                if n == 1 {
                    // a decode must not stall: take memory from the newest unscheduled request
                    for &v in &victims {
                        if self.blocks.blocks_needed(have, done + 1) <= self.blocks.n_available() {
                            break;
                        }
                        if v != i && !preempted[v] && self.running[v].sched == 0 && !self.running[v].table.is_empty() {
                            self.preempt(v);
                            preempted[v] = true;
                        }
                    }
                    if self.blocks.blocks_needed(have, done + 1) > self.blocks.n_available() {
                        self.preempt(i);
                        preempted[i] = true;
                        continue;
                    }
                } else {
                    // a prompt chunk waits for memory, or shrinks to what fits when alone
                    let fit = ((have + self.blocks.n_available()) * bs).saturating_sub(done);
                    if !full || fit == 0 {
                        continue;
                    }
                    n = n.min(fit);
                }
            }
            let s = &mut self.running[i];
            let ok = self.blocks.reserve(&mut s.table, s.n_computed + n);
            debug_assert!(ok);
            s.sched = n;
            budget -= n;
        }
        // preempted requests go back to the queue, keeping their place by arrival
        let mut i = 0;
        while i < self.running.len() {
            if preempted[i] {
                preempted.remove(i);
                let s = self.running.remove(i);
                self.waiting.push(s);
            } else {
                i += 1;
            }
        }
        // 2. admissions, in (priority, arrival) order, while memory and budget allow
        self.waiting.sort_by_key(|s| (s.priority, s.order));
        while budget > 0 && self.running.len() < self.opts.max_running && !self.waiting.is_empty() {
            let mut s = self.waiting.remove(0);
            if s.n_computed == 0 && s.table.is_empty() {
                let chain = s.cacheable_chain(bs);
                let mut hits = self.blocks.lookup(&chain);
                if self.scratch_slot.is_some() && !hits.is_empty() {
                    // recurrent: resume only where a state checkpoint exists
                    let keep = self.restore_checkpoint(s.id, &chain[..hits.len()].iter().map(|c| c.0).collect::<Vec<_>>());
                    let mut extra = hits.split_off(keep);
                    self.blocks.release(&mut extra);
                }
                s.hashes = chain[..hits.len()].iter().map(|c| c.0).collect();
                s.n_computed = hits.len() * bs;
                if !s.admitted {
                    s.cached_tokens = s.n_computed;
                    self.metrics.prefix_hit_tokens_total += s.n_computed as u64;
                }
                s.table = hits;
            }
            let full = budget == self.opts.max_batch_tokens;
            let mut n = self.chunk_len(&s, budget, full).unwrap_or(0);
            let avail = self.blocks.n_available();
            if n > 0 && self.blocks.blocks_needed(s.table.len(), s.n_computed + n) > avail {
                let fit = ((s.table.len() + avail) * bs).saturating_sub(s.n_computed);
                // a partial chunk only when nothing else runs (otherwise wait for memory)
                n = if self.running.is_empty() { n.min(fit) } else { 0 };
            }
            if n == 0 {
                self.blocks.release(&mut s.table);
                s.reset_kv();
                self.waiting.insert(0, s);
                break;
            }
            let ok = self.blocks.reserve(&mut s.table, s.n_computed + n);
            debug_assert!(ok);
            if !s.admitted {
                s.admitted = true;
                self.queued.fetch_sub(1, Ordering::Relaxed);
            }
            s.first_scheduled.get_or_insert_with(Instant::now);
            s.sched = n;
            budget -= n;
            self.running.push(s);
        }
        // 3. execute
        let n_tokens = self.opts.max_batch_tokens - budget;
        if n_tokens > 0 {
            self.execute();
        } else if self.running.len() > 1 {
            // prompt chunks of several requests hold all memory and none can grow: free the newest
            let newest = (0..self.running.len()).max_by_key(|&i| (self.running[i].priority, self.running[i].order));
            if let Some(v) = newest {
                self.preempt(v);
                let s = self.running.remove(v);
                self.waiting.push(s);
            }
        }
        self.metrics.steps_total += u64::from(n_tokens > 0);
        self.refresh_metrics(n_tokens);
        n_tokens
    }

    /// Give every running request a state slot (recurrent models); slots of requests no
    /// longer running return to the free list first.
    fn assign_slots(&mut self) {
        if self.scratch_slot.is_none() {
            return;
        }
        self.gc_slots(None);
        let ids: Vec<RequestId> = self.running.iter().map(|s| s.id).collect();
        for id in ids {
            self.slot_for(id);
        }
    }

    /// Return the slots of requests no longer running (`keep`: one about to run).
    fn gc_slots(&mut self, keep: Option<RequestId>) {
        let running: std::collections::HashSet<RequestId> = self.running.iter().map(|s| s.id).chain(keep).collect();
        let free = &mut self.free_slots;
        self.slot_of.retain(|id, slot| {
            let keep = running.contains(id);
            if !keep {
                free.push(*slot);
            }
            keep
        });
    }

    fn slot_for(&mut self, id: RequestId) -> Option<u32> {
        if let Some(&s) = self.slot_of.get(&id) {
            return Some(s);
        }
        let slot = self.free_slots.pop()?;
        self.slot_of.insert(id, slot);
        Some(slot)
    }

    /// Recurrent models: the longest prefix of the cached blocks `hashes` that ends where a
    /// state checkpoint was taken; that checkpoint is copied into the request's slot. Returns
    /// the number of blocks to keep (0: recompute from the start).
    fn restore_checkpoint(&mut self, id: RequestId, hashes: &[u64]) -> usize {
        let Some(k) = (1..=hashes.len()).rev().find(|&k| self.ckpt.slot_of.contains_key(&hashes[k - 1])) else { return 0 };
        self.gc_slots(Some(id));
        let (Some(src), Some(dst)) = (self.ckpt.get(hashes[k - 1]), self.slot_for(id)) else { return 0 };
        match self.model.copy_state(src, dst) {
            Ok(()) => k,
            Err(_) => {
                self.ckpt.forget(hashes[k - 1]);
                0
            }
        }
    }

    /// Recurrent models: snapshot the state of requests whose prompt processing just ended a
    /// chunk on a block boundary, under the hash of that block.
    fn take_checkpoints(&mut self, done: &[(RequestId, usize, u64)]) {
        for &(id, _, hash) in done {
            if self.ckpt.slot_of.contains_key(&hash) {
                continue;
            }
            let Some(&src) = self.slot_of.get(&id) else { continue };
            let Some(dst) = self.ckpt.insert(hash) else { continue };
            if self.model.copy_state(src, dst).is_err() {
                self.ckpt.forget(hash);
            }
        }
    }

    fn execute(&mut self) {
        self.assign_slots();
        let mut batch = ForwardBatch::default();
        let mut row_of: Vec<Option<usize>> = vec![None; self.running.len()];
        for (i, s) in self.running.iter().enumerate() {
            if s.sched == 0 {
                continue;
            }
            let start = batch.tokens.len();
            batch.tokens.extend_from_slice(&s.tokens[s.n_computed..s.n_computed + s.sched]);
            batch.positions.extend((s.n_computed..s.n_computed + s.sched).map(|p| p as u32));
            batch.seqs.push(SeqBatch { start, len: s.sched, block_table: s.table.clone() });
            if self.scratch_slot.is_some() {
                // max_running <= slots, so every running request has one
                batch.state_slots.push(self.slot_of.get(&s.id).copied().unwrap_or(u32::MAX));
            }
            if s.n_computed + s.sched == s.tokens.len() {
                row_of[i] = Some(batch.logits_rows.len());
                batch.logits_rows.push(start + s.sched - 1);
            }
        }
        let n_vocab = self.model.n_vocab();
        let logits = match self.model.forward(&batch) {
            Ok(l) => l,
            Err(e) => {
                // fail the requests of this batch; the others keep going
                let mut i = 0;
                while i < self.running.len() {
                    if self.running[i].sched > 0 {
                        let mut s = self.running.remove(i);
                        self.release(&mut s);
                        s.send(StreamEvent::Error(ServiceError::Inference(e.clone())));
                    } else {
                        i += 1;
                    }
                }
                return;
            }
        };
        let bs = self.blocks.block_size();
        let mut finished = vec![];
        let mut checkpoints = vec![];
        let (recurrent_cache, pc) = (self.scratch_slot.is_some() && self.opts.prefix_cache, self.opts.prompt_chunk);
        for (i, s) in self.running.iter_mut().enumerate() {
            if s.sched == 0 {
                continue;
            }
            s.n_computed += s.sched;
            if s.n_computed <= s.prompt_len {
                self.metrics.prompt_tokens_total += s.sched as u64;
            }
            // newly completed full blocks join the prefix cache
            while s.hashes.len() < s.n_computed / bs {
                let b = s.hashes.len();
                let parent = s.hashes.last().copied().unwrap_or(0);
                let toks = &s.tokens[b * bs..(b + 1) * bs];
                let h = super::blocks::block_hash(parent, toks);
                self.blocks.register(s.table[b], parent, h, toks);
                s.hashes.push(h);
            }
            let n = s.n_computed;
            if recurrent_cache && n <= s.prompt_len && n % bs == 0 && n % pc == 0 && n / bs >= 1 && n / bs <= s.hashes.len() {
                checkpoints.push((s.id, n, s.hashes[n / bs - 1]));
            }
            if let Some(r) = row_of[i] {
                let row = &logits[r * n_vocab..(r + 1) * n_vocab];
                let before = s.generated;
                let fin = s.accept(row, &self.tok, self.n_ctx);
                self.metrics.generated_tokens_total += (s.generated - before) as u64;
                if let Some(reason) = fin {
                    finished.push((s.id, reason));
                }
            }
        }
        self.take_checkpoints(&checkpoints);
        for (id, reason) in finished {
            if let Some(i) = self.running.iter().position(|s| s.id == id) {
                let mut s = self.running.remove(i);
                self.retire(&mut s, reason);
            }
        }
    }

    /// Embed token sequences (run between steps; each uses temporary blocks). Inputs that fit
    /// one prompt chunk are packed, several sequences per forward, up to the token budget;
    /// longer ones run alone in chunks. Every sequence attends only to its own blocks, so a
    /// text's vector does not depend on what it is batched with.
    pub fn embed(&mut self, inputs: &[Vec<u32>], pooling: Pooling, normalize: bool) -> Result<Vec<Vec<f32>>, ServiceError> {
        Ok(self.embed_matrix(inputs, pooling, normalize)?.rows().map(<[f32]>::to_vec).collect())
    }

    /// `embed` into one row-major `(inputs, dim)` buffer (vectors written in place, no
    /// copies afterwards: Arrow and other columnar consumers take it as it is).
    pub fn embed_matrix(&mut self, inputs: &[Vec<u32>], pooling: Pooling, normalize: bool) -> Result<Embeddings, ServiceError> {
        for toks in inputs {
            if toks.is_empty() {
                return Err(ServiceError::InvalidRequest("empty input".into()));
            }
            if toks.len() > self.n_ctx {
                return Err(ServiceError::PromptTooLong { prompt: toks.len(), ctx: self.n_ctx });
            }
        }
        let budget = self.opts.max_batch_tokens.max(1);
        let chunk = self.opts.prompt_chunk.clamp(1, budget);
        let mut out = Embeddings { dim: 0, data: vec![] };
        let mut i = 0;
        while i < inputs.len() {
            if inputs[i].len() > chunk {
                let mut table = vec![];
                if !self.blocks.reserve(&mut table, inputs[i].len()) {
                    return Err(ServiceError::Overloaded { queued: self.waiting.len() });
                }
                let r = self.embed_one(&inputs[i], &table, pooling);
                self.blocks.release(&mut table);
                out.push(r?, normalize, inputs.len())?;
                i += 1;
                continue;
            }
            // a group of short inputs: as many as the budget and the free blocks allow
            let mut tables: Vec<Vec<u32>> = vec![];
            let mut n_tok = 0;
            while i + tables.len() < inputs.len() {
                let toks = &inputs[i + tables.len()];
                // recurrent models have one scratch state slot: one text per forward
                if toks.len() > chunk || n_tok + toks.len() > budget || (self.scratch_slot.is_some() && !tables.is_empty()) {
                    break;
                }
                let mut t = vec![];
                if !self.blocks.reserve(&mut t, toks.len()) {
                    break;
                }
                n_tok += toks.len();
                tables.push(t);
            }
            if tables.is_empty() {
                return Err(ServiceError::Overloaded { queued: self.waiting.len() });
            }
            let r = self.embed_group(&inputs[i..i + tables.len()], &tables, pooling);
            for t in &mut tables {
                self.blocks.release(t);
            }
            for v in r? {
                out.push(v, normalize, inputs.len())?;
            }
            i += tables.len();
        }
        Ok(out)
    }

    /// One forward over several short sequences, each with its own block table.
    fn embed_group(&mut self, inputs: &[Vec<u32>], tables: &[Vec<u32>], pooling: Pooling) -> Result<Vec<PoolAcc>, ServiceError> {
        let mut batch = ForwardBatch { tokens: vec![], positions: vec![], seqs: vec![], logits_rows: vec![], state_slots: self.scratch_slot.into_iter().collect() };
        let mut rows_per_seq = Vec::with_capacity(inputs.len());
        for (toks, table) in inputs.iter().zip(tables) {
            let start = batch.tokens.len();
            batch.tokens.extend_from_slice(toks);
            batch.positions.extend(0..toks.len() as u32);
            batch.seqs.push(SeqBatch { start, len: toks.len(), block_table: table.clone() });
            let want: Vec<usize> = match pooling {
                Pooling::Mean => (start..start + toks.len()).collect(),
                Pooling::Cls => vec![start],
                Pooling::Last => vec![start + toks.len() - 1],
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

    fn embed_one(&mut self, toks: &[u32], table: &[u32], pooling: Pooling) -> Result<PoolAcc, ServiceError> {
        let chunk = self.opts.prompt_chunk.clamp(1, self.opts.max_batch_tokens.max(1));
        let mut pool = PoolAcc::new(0);
        for (ci, c) in toks.chunks(chunk).enumerate() {
            let p0 = ci * chunk;
            let want: Vec<usize> = match pooling {
                Pooling::Mean => (0..c.len()).collect(),
                Pooling::Cls if ci == 0 => vec![0],
                Pooling::Last if p0 + c.len() == toks.len() => vec![c.len() - 1],
                _ => vec![],
            };
            let batch = ForwardBatch {
                tokens: c.to_vec(),
                positions: (p0..p0 + c.len()).map(|p| p as u32).collect(),
                seqs: vec![SeqBatch { start: 0, len: c.len(), block_table: table.to_vec() }],
                logits_rows: want.clone(),
                state_slots: self.scratch_slot.into_iter().collect(),
            };
            let h = self.model.hidden(&batch).map_err(ServiceError::Inference)?;
            if want.is_empty() {
                continue;
            }
            h.chunks(h.len() / want.len()).for_each(|r| pool.add(r));
        }
        Ok(pool.with(pooling, toks.len()))
    }

    fn refresh_metrics(&mut self, batch_tokens: usize) {
        let m = &mut self.metrics;
        m.queue_depth = self.waiting.len();
        m.running = self.running.len();
        m.last_batch_tokens = batch_tokens;
        m.kv_blocks_total = self.blocks.n_blocks();
        m.kv_blocks_used = self.blocks.n_used();
        m.kv_blocks_free = self.blocks.n_available();
        m.kv_blocks_cached = self.blocks.n_cached();
        m.kv_block_size = self.blocks.block_size();
        if let Some(sel) = self.model.expert_selections() {
            m.expert_selections = sel;
        }
        let t = self.model.op_times();
        m.moe_routing_seconds_total = t.moe_routing.time.as_secs_f64();
        m.ssm_conv_seconds_total = t.ssm_conv.time.as_secs_f64();
        m.ssm_scan_seconds_total = t.ssm_scan.time.as_secs_f64();
        if let Some((bytes, bad)) = self.model.state_stats() {
            m.recurrent_state_bytes = bytes;
            m.ssm_nonfinite_total = bad;
            m.state_checkpoints = self.ckpt.slot_of.len();
        }
    }

    /// Drop cached prefixes (e.g. after the model's KV was reused for something else).
    pub fn clear_prefix_cache(&mut self) {
        self.blocks.clear_cache();
    }
}

/// Pooling accumulator shared by the packed and the chunked embedding paths, so both add
/// rows in the same order and precision (f64 sums).
struct PoolAcc {
    sum: Vec<f64>,
    last: Vec<f32>,
    pooling: Pooling,
    n_tokens: usize,
}

impl PoolAcc {
    fn new(d: usize) -> PoolAcc {
        PoolAcc { sum: vec![0.0; d], last: vec![], pooling: Pooling::Mean, n_tokens: 1 }
    }

    fn add(&mut self, row: &[f32]) {
        if self.sum.len() != row.len() {
            self.sum = vec![0.0; row.len()];
        }
        self.sum.iter_mut().zip(row).for_each(|(a, &b)| *a += b as f64);
        self.last.clear();
        self.last.extend_from_slice(row);
    }

    fn with(mut self, pooling: Pooling, n_tokens: usize) -> PoolAcc {
        self.pooling = pooling;
        self.n_tokens = n_tokens.max(1);
        self
    }

    fn dim(&self) -> usize {
        self.last.len()
    }

    /// The pooled vector, appended to `out`.
    fn write(&self, out: &mut Vec<f32>) {
        match self.pooling {
            Pooling::Mean => out.extend(self.sum.iter().map(|&s| (s / self.n_tokens as f64) as f32)),
            Pooling::Cls | Pooling::Last => out.extend_from_slice(&self.last),
        }
    }
}

impl Embeddings {
    /// Append one pooled vector (L2-normalized in f64 when asked); `total` sizes the buffer.
    fn push(&mut self, p: PoolAcc, normalize: bool, total: usize) -> Result<(), ServiceError> {
        if self.data.is_empty() {
            self.dim = p.dim();
            self.data.reserve_exact(total * self.dim);
        } else if p.dim() != self.dim {
            return Err(ServiceError::Inference(format!("embedding of {} values after ones of {}", p.dim(), self.dim)));
        }
        let start = self.data.len();
        p.write(&mut self.data);
        if normalize {
            let v = &mut self.data[start..];
            let norm = v.iter().map(|x| (*x as f64) * (*x as f64)).sum::<f64>().sqrt();
            if norm > 0.0 {
                v.iter_mut().for_each(|x| *x = (*x as f64 / norm) as f32);
            }
        }
        Ok(())
    }
}
