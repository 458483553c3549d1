//! Perplexity with llama.cpp's protocol (`llama-perplexity -c N -b N`): chunks of `n_ctx`
//! tokens, BOS written over each chunk's first token when the model adds BOS, and only the
//! second half of each chunk scored (positions n_ctx/2 .. n_ctx-2 predicting the next token).

use crate::engine::{Engine, EngineError};
use crate::sampler::log_softmax_at;
use quarrel_core::Backend;

#[derive(Clone, Debug)]
pub struct PerplexityChunk {
    pub index: usize,
    /// Perplexity over all chunks so far.
    pub running_ppl: f64,
}

#[derive(Clone, Debug)]
pub struct PerplexityResult {
    pub ppl: f64,
    pub n_chunks: usize,
    pub n_scored: usize,
    pub n_tokens: usize,
}

impl<B: Backend> Engine<B> {
    pub fn perplexity(
        &mut self,
        text: &str,
        n_ctx: usize,
        on_chunk: &mut dyn FnMut(&PerplexityChunk),
    ) -> Result<PerplexityResult, EngineError> {
        if n_ctx < 4 || n_ctx > self.opts.n_ctx {
            return Err(EngineError::InvalidRequest(format!(
                "perplexity context {n_ctx} must be in 4..={} (the engine's context)",
                self.opts.n_ctx
            )));
        }
        let tokens = self.tokenize(text, true);
        let n_chunks = tokens.len() / n_ctx;
        if n_chunks == 0 {
            return Err(EngineError::InvalidRequest(format!("the text has {} tokens, fewer than one chunk of {n_ctx}", tokens.len())));
        }
        let bos = self.tokenizer.add_bos().then(|| self.tokenizer.bos_id()).flatten();
        let first = n_ctx / 2;
        let (mut nll, mut count) = (0f64, 0usize);
        for c in 0..n_chunks {
            let mut chunk = tokens[c * n_ctx..(c + 1) * n_ctx].to_vec();
            if let Some(b) = bos {
                chunk[0] = b;
            }
            let mut table = vec![];
            let want: Vec<usize> = (first..n_ctx - 1).collect();
            let r = self.eval_sequence(&mut table, &chunk, 0, &want);
            self.pool.release(&mut table);
            for (row, &j) in r?.iter().zip(&want) {
                nll -= log_softmax_at(row, chunk[j + 1] as usize);
                count += 1;
            }
            on_chunk(&PerplexityChunk { index: c, running_ppl: (nll / count as f64).exp() });
        }
        Ok(PerplexityResult { ppl: (nll / count as f64).exp(), n_chunks, n_scored: count, n_tokens: tokens.len() })
    }
}
