//! One scheduled step run: the `ForwardBatch` assembled from the scheduled requests, the
//! picks (each request's `SeqDecoder` says how, its constraint which tokens it may pick; the
//! model picks on its backend, the masks computed during the forward), the constraints
//! advanced past the picks (in parallel), then per request: KV progress, newly full blocks into
//! the prefix cache, state checkpoints, and the picked token handed to the request's decoder
//! (stream, finish).

use super::blocks::block_hash;
use super::scheduler::Scheduler;
use super::step_model::StepModel;
use super::types::{ServiceError, StreamEvent};
use crate::decode::advance_constraints;
use quarrel_core::{ForwardBatch, SeqBatch};

impl<M: StepModel> Scheduler<M> {
    pub(super) fn execute(&mut self) {
        self.assign_slots();
        let mut batch = ForwardBatch::default();
        let mut row_of: Vec<Option<usize>> = vec![None; self.running.len()];
        let mut picks = vec![];
        for (i, s) in self.running.iter_mut().enumerate() {
            if s.sched == 0 {
                continue;
            }
            let start = batch.tokens.len();
            let real = s.sched - s.drafts.len();
            batch.tokens.extend_from_slice(&s.tokens[s.n_computed..s.n_computed + real]);
            batch.tokens.extend_from_slice(&s.drafts);
            batch.positions.extend((s.n_computed..s.n_computed + s.sched).map(|p| p as u32));
            batch.seqs.push(SeqBatch { start, len: s.sched, block_table: s.table.clone() });
            if self.scratch_slot.is_some() {
                // max_running <= slots, so every running request has one
                batch.state_slots.push(self.slot_of.get(&s.id).copied().unwrap_or(u32::MAX));
            }
            if !s.drafts.is_empty() {
                // one row per checked position: after the last real token and each draft
                row_of[i] = Some(batch.logits_rows.len());
                batch.logits_rows.extend(start + real - 1..start + s.sched);
                picks.extend(s.draft_picks());
            } else if s.n_computed + s.sched == s.tokens.len() {
                row_of[i] = Some(batch.logits_rows.len());
                batch.logits_rows.push(start + s.sched - 1);
                picks.push(s.next_pick());
            }
        }
        let n_picks = picks.len();
        let masks = self.running.iter_mut().zip(&row_of).filter_map(|(s, r)| s.mask_job((*r)?)).collect();
        let picked = match self.model.forward_picks(&batch, &picks, masks) {
            Ok(p) if p.len() == n_picks => p,
            Ok(p) => {
                let e = format!("the model picked {} tokens for {} rows", p.len(), n_picks);
                self.fail_scheduled(&e);
                return;
            }
            Err(e) => {
                self.fail_scheduled(&e);
                return;
            }
        };
        // the constraints take their picks in parallel, before the accepts below read them
        let tok = &self.tok;
        advance_constraints(self.running.iter_mut().zip(&row_of).filter_map(|(s, r)| Some((s.decoder(), picked[(*r)?].id))), tok);
        let bs = self.blocks.block_size();
        let mut finished = vec![];
        let mut checkpoints = vec![];
        let (recurrent_cache, pc) = (self.scratch_slot.is_some() && self.opts.prefix_cache, self.opts.prompt_chunk);
        for (i, s) in self.running.iter_mut().enumerate() {
            if s.sched == 0 {
                continue;
            }
            let n_drafts = s.drafts.len();
            s.n_computed += s.sched - n_drafts;
            if s.n_computed <= s.prompt_len {
                self.metrics.prompt_tokens_total += s.sched as u64;
            }
            let mut fin = None;
            if let Some(r) = row_of[i] {
                // the picks in order: each drafted token that is the target's own pick is kept
                // (its keys and values are already in); the first that is not, or the pick
                // after the last draft, is the step's last token
                let (before, mut accepted) = (s.generated(), 0);
                for j in 0..=n_drafts {
                    fin = s.accept(&picked[r + j], &self.tok, self.n_ctx);
                    if fin.is_some() {
                        break;
                    }
                    if s.drafts.get(j) != Some(&picked[r + j].id) {
                        if n_drafts > 0 {
                            s.return_draws(j);
                        }
                        break;
                    }
                    s.n_computed += 1;
                    accepted += 1;
                }
                self.metrics.generated_tokens_total += (s.generated() - before) as u64;
                if n_drafts > 0 {
                    self.metrics.spec_drafted_total += n_drafts as u64;
                    self.metrics.spec_accepted_total += accepted as u64;
                    self.metrics.spec_steps_total += 1;
                    s.draft_len.update(n_drafts, accepted);
                    self.spec_rate = 0.9 * self.spec_rate + 0.1 * accepted as f64 / n_drafts as f64;
                }
            }
            // newly completed full blocks join the prefix cache
            while s.hashes.len() < s.n_computed / bs {
                let b = s.hashes.len();
                let parent = s.hashes.last().copied().unwrap_or(0);
                let toks = &s.tokens[b * bs..(b + 1) * bs];
                let h = block_hash(parent, toks);
                self.blocks.register(s.table[b], parent, h, toks);
                s.hashes.push(h);
            }
            let n = s.n_computed;
            if recurrent_cache && n <= s.prompt_len && n % bs == 0 && n % pc == 0 && n / bs >= 1 && n / bs <= s.hashes.len() {
                checkpoints.push((s.id, n, s.hashes[n / bs - 1]));
            }
            if let Some(reason) = fin {
                finished.push((s.id, reason));
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

    /// Fail the requests of this step's batch (the others keep going).
    fn fail_scheduled(&mut self, e: &str) {
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].sched > 0 {
                let mut s = self.running.remove(i);
                self.release(&mut s);
                s.send(StreamEvent::Error(ServiceError::Inference(e.to_string())));
            } else {
                i += 1;
            }
        }
    }
}
