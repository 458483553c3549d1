//! Forward passes below the request level, for tools that build their own token sequences
//! and batches (benchmarks with llama-bench's protocols, numerics consistency checks): a
//! sequence is a block table the caller holds, grown by [`Engine::eval_sequence`] or
//! [`Engine::reserve_blocks`] and handed back with [`Engine::release_blocks`]. Requests,
//! sampling and streaming go through `generate` / `service` instead.

use crate::blocks::BlockPool;
use crate::engine::{Engine, EngineError};
use quarrel_core::{Backend, ForwardBatch};

impl<B: Backend> Engine<B> {
    /// Run `tokens` (positions `start_pos..`) of one sequence through the model in chunks of
    /// `n_batch`, growing `table` as needed; returns the logits of the positions in `want`
    /// (indices into `tokens`, ascending), in order.
    pub fn eval_sequence(
        &mut self,
        table: &mut Vec<u32>,
        tokens: &[u32],
        start_pos: usize,
        want: &[usize],
    ) -> Result<Vec<Vec<f32>>, EngineError> {
        let n_vocab = self.n_vocab();
        let mut out = Vec::with_capacity(want.len());
        let mut w = 0;
        for (ci, chunk) in tokens.chunks(self.opts.n_batch).enumerate() {
            let c0 = ci * self.opts.n_batch;
            self.pool.reserve(table, start_pos + c0 + chunk.len())?;
            let mut rows = vec![];
            while w < want.len() && want[w] < c0 + chunk.len() {
                rows.push(want[w] - c0);
                w += 1;
            }
            let batch = self.seq_batch(table, chunk, start_pos + c0, rows)?;
            let logits = self.model.forward(&self.backend, &batch, &mut self.kv)?;
            out.extend(logits.chunks(n_vocab).map(|r| r.to_vec()));
        }
        Ok(out)
    }

    /// Grow `table` to hold `n_pos` positions.
    pub fn reserve_blocks(&mut self, table: &mut Vec<u32>, n_pos: usize) -> Result<(), EngineError> {
        Ok(self.pool.reserve(table, n_pos)?)
    }

    /// Give `table`'s blocks back to the pool (the table is left empty).
    pub fn release_blocks(&mut self, table: &mut Vec<u32>) {
        self.pool.release(table);
    }

    /// The KV block pool (free and total block counts).
    pub fn block_pool(&self) -> &BlockPool {
        &self.pool
    }

    /// Recurrent-state slots for `n` sequences of one batch (empty when the model has no
    /// recurrent layers); an error when the cache has fewer.
    pub fn recurrent_slots(&self, n: usize) -> Result<Vec<u32>, EngineError> {
        self.state_slots(n)
    }

    /// One forward pass of a batch the caller built (block tables from `reserve_blocks`,
    /// slots from `recurrent_slots`); logits `(batch.logits_rows.len(), n_vocab)` row-major.
    pub fn forward_raw(&mut self, batch: &ForwardBatch) -> Result<Vec<f32>, EngineError> {
        Ok(self.model.forward(&self.backend, batch, &mut self.kv)?)
    }
}
