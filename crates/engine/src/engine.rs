//! `Engine`: a loaded model with its tokenizer, KV cache and block pool.

use crate::blocks::{BlockPool, OutOfBlocks};
use crate::decode::{forward_picks, MaskJob, Picked, RowPick};
use crate::speculative::Speculator;
use quarrel_core::{Backend, CoreError, ForwardBatch, KvSpec, KvType, SeqBatch, StateSpec};
use quarrel_gguf::Gguf;
use quarrel_models::Model;
use quarrel_tokenizer::Tokenizer;
use std::path::Path;
use std::sync::Arc;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum EngineError {
    #[error(transparent)]
    Core(#[from] CoreError),
    #[error(transparent)]
    Gguf(#[from] quarrel_gguf::GgufError),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error(transparent)]
    OutOfBlocks(#[from] OutOfBlocks),
    #[error("prompt of {prompt} tokens does not fit the context of {ctx} tokens")]
    PromptTooLong { prompt: usize, ctx: usize },
    #[error("invalid request: {0}")]
    InvalidRequest(String),
}

#[derive(Clone, Debug)]
pub struct EngineOptions {
    /// Context length per sequence (0 = the model's training context, capped at 4096).
    pub n_ctx: usize,
    /// Tokens per forward pass during prompt processing.
    pub n_batch: usize,
    /// Number of sequences the KV cache holds at full context.
    pub n_seq: usize,
    pub kv_type: KvType,
    pub block_size: usize,
    /// KV memory budget in bytes: when set, the block pool holds as many blocks as fit in it
    /// (at least one full context), instead of `n_seq` full contexts.
    pub kv_mem: Option<usize>,
    /// Recurrent models: state snapshots kept for prefix reuse (each a copy of one
    /// sequence's whole recurrent state), taken at prompt-chunk boundaries.
    pub n_state_checkpoints: usize,
    /// A chat template (Jinja source) in place of the model's.
    pub chat_template: Option<String>,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            n_ctx: 0,
            n_batch: 512,
            n_seq: 1,
            kv_type: KvType::F16,
            block_size: 16,
            kv_mem: None,
            n_state_checkpoints: 8,
            chat_template: None,
        }
    }
}

pub struct Engine<B: Backend> {
    pub backend: B,
    pub gguf: Arc<Gguf>,
    pub model: Box<dyn Model<B>>,
    pub tokenizer: Arc<Tokenizer>,
    /// The file the model came from, when loaded from one.
    pub path: Option<std::path::PathBuf>,
    pub(crate) kv: B::Kv,
    pub(crate) pool: BlockPool,
    pub opts: EngineOptions,
    /// Recurrent-state slots in the cache (0 for models without recurrent layers):
    /// `n_seq` for concurrent sequences, one scratch slot (embeddings), then
    /// `n_state_checkpoints` prefix checkpoints.
    pub(crate) n_state_slots: usize,
    /// Speculative decoding for `generate` (None: one token per forward).
    pub(crate) speculator: Option<Speculator>,
}

impl<B: Backend> Engine<B> {
    /// Open a GGUF file and load model and tokenizer on `backend`.
    pub fn load(backend: B, path: &Path, opts: EngineOptions) -> Result<Engine<B>, EngineError> {
        let gguf = Arc::new(Gguf::open(path)?);
        let mut e = Self::from_gguf(backend, gguf, opts)?;
        e.path = Some(path.to_path_buf());
        Ok(e)
    }

    pub fn from_gguf(backend: B, gguf: Arc<Gguf>, mut opts: EngineOptions) -> Result<Engine<B>, EngineError> {
        let mut tokenizer = Tokenizer::from_gguf(&gguf).map_err(|e| EngineError::Tokenizer(e.to_string()))?;
        if let Some(t) = opts.chat_template.take() {
            tokenizer.set_chat_template(t).map_err(|e| EngineError::Tokenizer(format!("chat template: {e}")))?;
        }
        let tokenizer = Arc::new(tokenizer);
        let mut model = quarrel_models::load(&backend, &gguf)?;
        let info = model.info().clone();
        // every id the tokenizer can produce must have an embedding row (llama.cpp sizes
        // token_embd by the token list, so it refuses such a file too)
        if tokenizer.n_vocab() > info.n_vocab {
            return Err(EngineError::Tokenizer(format!(
                "tokenizer.ggml.tokens has {} tokens, but the model's vocabulary ({}.vocab_size, token_embd) has {}",
                tokenizer.n_vocab(),
                info.arch,
                info.n_vocab
            )));
        }
        if opts.n_ctx == 0 {
            opts.n_ctx = info.n_ctx_train.clamp(1, 4096);
        }
        model.set_context_len(opts.n_ctx);
        if opts.block_size == 0 || opts.n_batch == 0 || opts.n_seq == 0 {
            return Err(EngineError::InvalidRequest("block size, batch size and sequence count must be positive".into()));
        }
        let mut spec = KvSpec {
            n_layer: info.n_layer,
            n_kv_head: info.n_kv_head,
            head_dim: info.head_dim,
            block_size: opts.block_size,
            n_blocks: opts.n_seq * opts.n_ctx.div_ceil(opts.block_size),
            ty: opts.kv_type,
        };
        if let Some(budget) = opts.kv_mem {
            spec.n_blocks = kv_blocks_for_budget(&spec, budget, opts.n_ctx)?;
        }
        let n_blocks = spec.n_blocks;
        let mut kv = backend.alloc_kv(&spec)?;
        let n_state_slots = if info.is_recurrent() {
            let n_slots = opts.n_seq + 1 + opts.n_state_checkpoints;
            backend.alloc_state(&mut kv, &StateSpec { n_slots, layers: info.recurrent.clone() })?;
            n_slots
        } else {
            0
        };
        let pool = BlockPool::new(n_blocks, opts.block_size);
        let mut e = Engine { backend, gguf, model, tokenizer, path: None, kv, pool, opts, n_state_slots, speculator: None };
        e.calibrate_kv()?;
        Ok(e)
    }

    /// Recurrent-state slots for `n` sequences of one batch (empty when the model has no
    /// recurrent layers); an error when the cache has fewer.
    pub(crate) fn state_slots(&self, n: usize) -> Result<Vec<u32>, EngineError> {
        if self.n_state_slots == 0 {
            return Ok(vec![]);
        }
        if n > self.n_state_slots {
            return Err(EngineError::InvalidRequest(format!(
                "{n} sequences in one batch, but the recurrent state has {} slots (raise n_seq)",
                self.n_state_slots
            )));
        }
        Ok((0..n as u32).collect())
    }

    /// Decode with `s` from now on (None: without speculation). Models with recurrent layers
    /// are refused: their state cannot step back over rejected drafts.
    pub fn set_speculator(&mut self, s: Option<Speculator>) -> Result<(), EngineError> {
        if s.is_some() && self.n_state_slots > 0 {
            return Err(EngineError::InvalidRequest(format!(
                "speculative decoding needs a model without recurrent layers ({} has some: its state cannot be rolled back over rejected drafts)",
                self.model.info().arch
            )));
        }
        if let Some(old) = self.speculator.as_mut() {
            old.drafter.finish();
        }
        self.speculator = s;
        Ok(())
    }

    /// Detach the speculator (its drafter's sequences released), to decode without it or to
    /// attach it again later.
    pub fn take_speculator(&mut self) -> Option<Speculator> {
        let mut s = self.speculator.take();
        if let Some(s) = s.as_mut() {
            s.drafter.finish();
        }
        s
    }

    /// The attached speculator, if any.
    pub fn speculator(&self) -> Option<&Speculator> {
        self.speculator.as_ref()
    }

    pub fn n_ctx(&self) -> usize {
        self.opts.n_ctx
    }

    pub fn n_vocab(&self) -> usize {
        self.model.info().n_vocab
    }

    /// Tokenize with the model's BOS/EOS rules; special tokens in `text` are parsed.
    pub fn tokenize(&self, text: &str, add_special: bool) -> Vec<u32> {
        self.tokenizer.encode(text, add_special, true)
    }

    /// What a client may want to know about the model (name, shape, quantization, size).
    pub fn summary(&self) -> crate::service::ModelSummary {
        use crate::service::{ModelSummary, Pooling};
        let info = self.model.info();
        let g = &self.gguf;
        let name = g
            .get_str("general.name")
            .ok()
            .flatten()
            .map(str::to_string)
            .or_else(|| self.path.as_ref().and_then(|p| p.file_stem()).map(|s| s.to_string_lossy().into_owned()));
        let arch = info.arch.clone();
        let n_head = g.get_u64(&format!("{arch}.attention.head_count")).ok().flatten().unwrap_or(0) as usize;
        let pooling = match g.get_u64(&format!("{arch}.pooling_type")).ok().flatten() {
            Some(2) => Pooling::Cls,
            Some(3) => Pooling::Last,
            Some(4) => Pooling::Rank,
            _ => Pooling::Mean,
        };
        let file_type = g
            .get_u64("general.file_type")
            .ok()
            .flatten()
            .and_then(|id| quarrel_models::Ftype::ALL.iter().find(|f| f.llama_ftype() as u64 == id))
            .map(|f| f.name().to_uppercase())
            .unwrap_or_else(|| "unknown".into());
        ModelSummary {
            name: name.unwrap_or_else(|| arch.clone()),
            path: self.path.clone(),
            arch: arch.clone(),
            n_ctx: self.opts.n_ctx,
            n_ctx_train: info.n_ctx_train,
            n_vocab: info.n_vocab,
            n_embd: info.n_embd,
            n_layer: info.n_layer,
            n_head,
            n_kv_head: info.n_kv_head,
            n_params: info.n_params,
            file_type,
            size_bytes: self.path.as_ref().and_then(|p| std::fs::metadata(p).ok()).map_or(0, |m| m.len()),
            chat_template: self.tokenizer.chat_template().map(str::to_string),
            pooling,
            n_classes: self.model.n_classes(),
            kv_type: format!("{:?}", self.opts.kv_type).to_lowercase(),
            backend: self.backend.name(),
        }
    }

    /// The forward batch of one sequence's `chunk` at positions `pos0..` through `table` (already
    /// reserved), logits wanted at the chunk's `rows`.
    pub(crate) fn seq_batch(&self, table: &[u32], chunk: &[u32], pos0: usize, rows: Vec<usize>) -> Result<ForwardBatch, EngineError> {
        Ok(ForwardBatch {
            tokens: chunk.to_vec(),
            positions: (0..chunk.len()).map(|i| (pos0 + i) as u32).collect(),
            seqs: vec![SeqBatch { start: 0, len: chunk.len(), block_table: table.to_vec() }],
            logits_rows: rows,
            state_slots: self.state_slots(1)?,
        })
    }

    /// Run `tokens` of one sequence from `start_pos` and pick a token at each of its last
    /// `picks.len()` positions (a speculative step checks its drafts this way); the positions
    /// before run in chunks of `n_batch` first.
    pub(crate) fn run_sequence_picks(
        &mut self,
        table: &mut Vec<u32>,
        tokens: &[u32],
        start_pos: usize,
        picks: &[RowPick],
        mask: Vec<MaskJob<'_>>,
    ) -> Result<Vec<Picked>, EngineError> {
        if tokens.is_empty() || picks.is_empty() || picks.len() > tokens.len() {
            return Err(EngineError::InvalidRequest(format!("{} picks over {} tokens", picks.len(), tokens.len())));
        }
        let first_row = tokens.len() - picks.len();
        let last = ((tokens.len() - 1) / self.opts.n_batch * self.opts.n_batch).min(first_row);
        if last > 0 {
            self.eval_sequence(table, &tokens[..last], start_pos, &[])?;
        }
        let chunk = &tokens[last..];
        self.pool.reserve(table, start_pos + tokens.len())?;
        let rows = (first_row - last..chunk.len()).collect();
        let batch = self.seq_batch(table, chunk, start_pos + last, rows)?;
        Ok(forward_picks(&*self.model, &self.backend, &batch, &mut self.kv, picks, mask)?)
    }

    /// Run several sequences in ONE forward pass (each from position 0), returning the logits
    /// of every token of every sequence. Used to check that batching changes nothing.
    pub fn forward_batch(&mut self, seqs: &[Vec<u32>]) -> Result<Vec<Vec<Vec<f32>>>, EngineError> {
        let n = self.n_vocab();
        self.run_batch(seqs, n, |m, be, b, kv| m.forward(be, b, kv))
    }

    /// [`Engine::forward_batch`] with the final hidden states (what embeddings are pooled
    /// from) instead of logits: `(n_embd)` per token.
    pub fn hidden_batch(&mut self, seqs: &[Vec<u32>]) -> Result<Vec<Vec<Vec<f32>>>, EngineError> {
        let n = self.model.info().n_embd;
        self.run_batch(seqs, n, |m, be, b, kv| m.hidden(be, b, kv))
    }

    /// Several sequences in one forward: `out` of every token, rows of `width`.
    fn run_batch(
        &mut self,
        seqs: &[Vec<u32>],
        width: usize,
        out: impl Fn(&dyn Model<B>, &B, &ForwardBatch, &mut B::Kv) -> quarrel_core::Result<Vec<f32>>,
    ) -> Result<Vec<Vec<Vec<f32>>>, EngineError> {
        let n_vocab = width;
        let mut tables: Vec<Vec<u32>> = vec![vec![]; seqs.len()];
        let mut batch = ForwardBatch::default();
        let result = (|| {
            for (s, toks) in seqs.iter().enumerate() {
                if toks.len() > self.opts.n_ctx {
                    return Err(EngineError::PromptTooLong { prompt: toks.len(), ctx: self.opts.n_ctx });
                }
                self.pool.reserve(&mut tables[s], toks.len())?;
                let start = batch.tokens.len();
                batch.tokens.extend_from_slice(toks);
                batch.positions.extend((0..toks.len()).map(|p| p as u32));
                batch.seqs.push(SeqBatch { start, len: toks.len(), block_table: tables[s].clone() });
            }
            batch.logits_rows = (0..batch.tokens.len()).collect();
            batch.state_slots = self.state_slots(seqs.len())?;
            Ok(out(&*self.model, &self.backend, &batch, &mut self.kv)?)
        })();
        for t in &mut tables {
            self.pool.release(t);
        }
        let logits = result?;
        let mut rows = logits.chunks(n_vocab);
        Ok(seqs.iter().map(|s| (0..s.len()).map(|_| rows.next().unwrap_or(&[]).to_vec()).collect()).collect())
    }

    /// Logits at every position of one sequence, processed in chunks of `n_batch`.
    pub fn eval_all(&mut self, tokens: &[u32]) -> Result<Vec<Vec<f32>>, EngineError> {
        if tokens.len() > self.opts.n_ctx {
            return Err(EngineError::PromptTooLong { prompt: tokens.len(), ctx: self.opts.n_ctx });
        }
        let mut table = vec![];
        let want: Vec<usize> = (0..tokens.len()).collect();
        let r = self.eval_sequence(&mut table, tokens, 0, &want);
        self.pool.release(&mut table);
        r
    }
}

/// Tokenize a rendered chat template: BOS is added per metadata unless the template already
/// wrote the BOS text itself (no double BOS).
/// Blocks of `spec` that fit in `budget` bytes; an error when not even one full context fits.
pub fn kv_blocks_for_budget(spec: &KvSpec, budget: usize, n_ctx: usize) -> Result<usize, EngineError> {
    let block_bytes = spec.bytes_per_token() * spec.block_size;
    let need = n_ctx.div_ceil(spec.block_size);
    let n = budget.checked_div(block_bytes).unwrap_or(0);
    if n < need {
        return Err(EngineError::InvalidRequest(format!(
            "KV memory budget of {:.1} MiB holds {n} blocks of {} tokens; one context of {n_ctx} tokens needs {need} ({:.1} MiB)",
            budget as f64 / (1 << 20) as f64,
            spec.block_size,
            (need * block_bytes) as f64 / (1 << 20) as f64
        )));
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(ty: KvType) -> KvSpec {
        KvSpec { n_layer: 2, n_kv_head: 2, head_dim: 64, block_size: 16, n_blocks: 0, ty }
    }

    #[test]
    fn kv_budget_gives_whole_blocks_and_refuses_less_than_one_context() {
        // f16: 2 (K,V) * 2 layers * 2 heads * 64 * 2 bytes = 1024 bytes a token, 16 KiB a block
        let s = spec(KvType::F16);
        assert_eq!(s.bytes_per_token(), 1024);
        assert_eq!(kv_blocks_for_budget(&s, 1 << 20, 256).unwrap(), 64);
        assert_eq!(kv_blocks_for_budget(&s, (1 << 20) + 16383, 256).unwrap(), 64);
        assert!(kv_blocks_for_budget(&s, 16 * 1024 * 15, 256).is_err());
        // q8_0 stores 34 bytes per 32 values: more blocks in the same budget
        let q = spec(KvType::Q8_0);
        assert_eq!(q.bytes_per_token(), 2 * 2 * 2 * 68);
        assert_eq!(kv_blocks_for_budget(&q, 1 << 20, 256).unwrap(), (1 << 20) / (544 * 16));
    }
}
