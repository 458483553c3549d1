//! Embeddings between steps: inputs packed several per forward (or long ones chunked) over
//! temporary blocks, pooled (mean / last / CLS) in f64 and optionally L2-normalized.

use super::scheduler::Scheduler;
use super::step_model::StepModel;
use super::types::{Embeddings, Pooling, ServiceError};
use quarrel_core::{ForwardBatch, SeqBatch};

impl<M: StepModel> Scheduler<M> {
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
