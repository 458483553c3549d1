//! The step loop's brain: each step builds one batch under a token budget from running
//! decodes, running prompt chunks and newly admitted requests (a prefix cache lookup on
//! admission), runs it (`execute`), and retires finished requests. Memory comes from the `BlockManager`; when a running decode
//! needs a block and none is free, the newest, lowest-priority request is preempted (its
//! blocks released, recomputed later), so no request fails for memory another will free.

use super::blocks::BlockManager;
use super::embed::{EmbedJob, EmbedPace};
use super::seq::Seq;
use super::state::Checkpoints;
use super::step_model::StepModel;
use super::types::{EngineMetrics, RequestId, ServiceError, ServiceOptions, StreamEvent};
use crate::generate::FinishReason;
use crate::speculative::DraftRequest;
use quarrel_tokenizer::Tokenizer;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Generated tokens re-fed after a preemption go in pieces below the attention kernels'
/// batch threshold (64), so they are computed exactly like the decode steps that made them.
const REFEED_CHUNK: usize = 32;

/// Below this share of drafts accepted (over all requests, lately) drafting pauses and only
/// probes, one step in [`PROBE_EVERY`]: short requests never learn their own rate.
const MIN_SPEC_RATE: f64 = 0.25;
const PROBE_EVERY: u64 = 16;

/// Recurrent models: prompt chunks (and so state checkpoints) every this many tokens at most.
const RECURRENT_CHUNK: usize = 128;

pub struct Scheduler<M: StepModel> {
    pub model: M,
    pub(super) tok: Arc<Tokenizer>,
    pub(super) blocks: BlockManager,
    pub(super) opts: ServiceOptions,
    pub(super) n_ctx: usize,
    pub(super) waiting: Vec<Seq>,
    pub(super) running: Vec<Seq>,
    /// Requests accepted but not yet admitted (shared with the handle for back-pressure).
    pub(super) queued: Arc<AtomicUsize>,
    pub metrics: EngineMetrics,
    /// Recurrent models: the state slot of each running request, and the free ones.
    pub(super) slot_of: std::collections::HashMap<RequestId, u32>,
    pub(super) free_slots: Vec<u32>,
    pub(super) scratch_slot: Option<u32>,
    /// Recurrent models: state checkpoints by the hash of the full block they end with.
    pub(super) ckpt: Checkpoints,
    /// Embedding requests, advanced one unit per round (`embed`).
    pub(super) embeds: std::collections::VecDeque<EmbedJob>,
    pub(super) embed_pace: EmbedPace,
    /// Speculative decoding: the share of drafted tokens accepted lately, over all requests.
    pub(super) spec_rate: f64,
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
            embeds: Default::default(),
            embed_pace: Default::default(),
            spec_rate: 1.0,
        };
        s.refresh_metrics(0);
        s
    }

    pub fn is_idle(&self) -> bool {
        self.generation_idle() && self.embeds.is_empty()
    }

    /// No generation request waiting or running (embedding jobs aside).
    pub fn generation_idle(&self) -> bool {
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
        self.fail_embeds(&err);
        self.refresh_metrics(0);
    }

    pub(super) fn release(&mut self, s: &mut Seq) {
        self.blocks.release(&mut s.table);
        s.drafts.clear();
        self.model.release_drafts(s.id);
        if !s.admitted {
            s.admitted = true;
            self.queued.fetch_sub(1, Ordering::Relaxed);
        }
    }

    pub(super) fn retire(&mut self, s: &mut Seq, reason: FinishReason) {
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
        } else if !s.drafts.is_empty() {
            1 + s.drafts.len()
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

    /// Drop request `i`'s drafts: it runs as a plain decode (1 token).
    fn without_drafts(&mut self, i: usize) -> Option<usize> {
        let s = &mut self.running[i];
        if s.drafts.is_empty() {
            return None;
        }
        s.drafts.clear();
        Some(1)
    }

    /// Speculative decoding: drafts for the decoding requests that allow it, within the
    /// drafter's step budget shared among them (fewer each as more requests decode, none
    /// when a step is large enough that checking them would cost more than it saves), and
    /// each request's own draft length, which follows how many of its drafts are accepted.
    fn plan_drafts(&mut self) {
        for s in &mut self.running {
            s.drafts.clear();
        }
        let Some(spec) = self.model.drafting() else { return };
        if self.scratch_slot.is_some() {
            return; // recurrent state cannot step back over rejected drafts
        }
        // a drafter that rarely guesses this traffic only probes, one step in PROBE_EVERY
        if self.spec_rate < MIN_SPEC_RATE && !self.metrics.steps_total.is_multiple_of(PROBE_EVERY) {
            return;
        }
        let cands: Vec<usize> = (0..self.running.len()).filter(|&i| self.running[i].may_draft()).collect();
        if cands.is_empty() {
            return;
        }
        // fewer than two tokens each: checking drafts no longer pays for a batch this large
        let share = (spec.step_budget / cands.len()).min(spec.draft_max);
        if share < 2 || share < spec.draft_min {
            return;
        }
        let n_ctx = self.n_ctx;
        let wants: Vec<(usize, usize)> = cands
            .into_iter()
            .filter_map(|i| {
                let s = &mut self.running[i];
                let n = s.draft_len.next(spec.draft_max).min(share).min(s.room_after_next(n_ctx));
                (n > 0 && n >= spec.draft_min).then_some((i, n))
            })
            .collect();
        let reqs: Vec<DraftRequest<'_>> =
            wants.iter().map(|&(i, n)| DraftRequest { key: self.running[i].id, history: &self.running[i].tokens, n_max: n }).collect();
        let drafts = self.model.draft(&reqs);
        for (&(i, _), d) in wants.iter().zip(drafts) {
            if d.len() >= spec.draft_min.max(1) {
                self.running[i].drafts = d;
            }
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
        let mut budget = self.opts.max_batch_tokens;
        for s in &mut self.running {
            s.sched = 0;
        }
        self.plan_drafts();
        self.schedule_running(&mut budget);
        self.admit(&mut budget);
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

    /// Running requests take their tokens of this step from `budget`: decodes first, then
    /// prompt chunks; older and interactive first. A decode short of memory preempts the
    /// newest unscheduled request (or itself); preempted requests go back to the queue.
    fn schedule_running(&mut self, budget: &mut usize) {
        let bs = self.blocks.block_size();
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
            if *budget == 0 {
                break;
            }
            if preempted[i] {
                continue;
            }
            let full = *budget == self.opts.max_batch_tokens;
            let Some(mut n) = self.chunk_len(&self.running[i], *budget, full).or_else(|| self.without_drafts(i)) else { continue };
            let (have, done) = (self.running[i].table.len(), self.running[i].n_computed);
            if !self.running[i].drafts.is_empty() && self.blocks.blocks_needed(have, done + n) > self.blocks.n_available() {
                // drafts never take memory a decode needs
                n = self.without_drafts(i).unwrap_or(1);
            }
            if let Some(d) = n.checked_sub(1).filter(|_| !self.running[i].drafts.is_empty()) {
                self.running[i].drafts.truncate(d);
            }
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
            *budget -= n;
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
    }

    /// Admit waiting requests in (priority, arrival) order while memory, `budget` and
    /// `max_running` allow; a new request first takes what the prefix cache holds of its prompt.
    fn admit(&mut self, budget: &mut usize) {
        let bs = self.blocks.block_size();
        self.waiting.sort_by_key(|s| (s.priority, s.order));
        while *budget > 0 && self.running.len() < self.opts.max_running && !self.waiting.is_empty() {
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
            let full = *budget == self.opts.max_batch_tokens;
            let mut n = self.chunk_len(&s, *budget, full).unwrap_or(0);
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
            *budget -= n;
            self.running.push(s);
        }
    }

    pub(super) fn refresh_metrics(&mut self, batch_tokens: usize) {
        let m = &mut self.metrics;
        m.queue_depth = self.waiting.len();
        m.running = self.running.len();
        m.embeddings = self.embeds.len();
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
