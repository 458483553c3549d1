//! llama-batched-bench's protocol: `pl` sequences of `pp` random prompt tokens processed
//! together (in forward passes of `n_batch` tokens, logits of each sequence's last token),
//! then `tg` decode steps of one token per sequence (logits for all), timed separately.

use quarrel_core::{Backend, ForwardBatch, SeqBatch};
use quarrel_engine::{Engine, EngineError};
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::time::Instant;

/// One (pp, tg, pl) measurement, with llama-batched-bench's field names.
#[derive(Clone, Debug, Serialize)]
pub struct BatchedRun {
    pub pp: usize,
    pub tg: usize,
    pub pl: usize,
    /// KV positions the run needed: `pl * (pp + tg)`.
    pub n_kv: usize,
    pub t_pp: f64,
    pub speed_pp: f64,
    pub t_tg: f64,
    pub speed_tg: f64,
    pub t: f64,
    pub speed: f64,
}

impl BatchedRun {
    fn new(pp: usize, tg: usize, pl: usize, t_pp: f64, t_tg: f64) -> BatchedRun {
        let t = t_pp + t_tg;
        let per = |n: usize, s: f64| if s > 0.0 { n as f64 / s } else { 0.0 };
        BatchedRun {
            pp,
            tg,
            pl,
            n_kv: pl * (pp + tg),
            t_pp,
            speed_pp: per(pl * pp, t_pp),
            t_tg,
            speed_tg: per(pl * tg, t_tg),
            t,
            speed: per(pl * (pp + tg), t),
        }
    }
}

/// llama-batched-bench on an [`Engine`] (`use quarrel_bench::BatchedBench` brings it into scope).
pub trait BatchedBench<B: Backend> {
    /// Run one llama-batched-bench measurement (see the module docs). Needs `pl` sequences of
    /// `pp + tg` positions in the KV cache.
    fn bench_batched(&mut self, pp: usize, tg: usize, pl: usize) -> Result<BatchedRun, EngineError> {
        self.bench_batched_with(pp, tg, pl, &mut |_| {})
    }

    /// [`BatchedBench::bench_batched`], calling `before_tg(backend)` between the prompt and the
    /// generation phase (profilers reset their counters there).
    fn bench_batched_with(&mut self, pp: usize, tg: usize, pl: usize, before_tg: &mut dyn FnMut(&B)) -> Result<BatchedRun, EngineError>;
}

impl<B: Backend> BatchedBench<B> for Engine<B> {
    fn bench_batched_with(&mut self, pp: usize, tg: usize, pl: usize, before_tg: &mut dyn FnMut(&B)) -> Result<BatchedRun, EngineError> {
        if pl == 0 || pp + tg == 0 {
            return Err(EngineError::InvalidRequest("batched bench needs pl >= 1 and pp + tg >= 1".into()));
        }
        if pp + tg > self.opts.n_ctx {
            return Err(EngineError::PromptTooLong { prompt: pp + tg, ctx: self.opts.n_ctx });
        }
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0xBA7C ^ ((pp as u64) << 40) ^ ((tg as u64) << 20) ^ pl as u64);
        let n_vocab = self.n_vocab() as u32;
        let slots = self.recurrent_slots(pl)?;
        let mut tables: Vec<Vec<u32>> = vec![vec![]; pl];
        let r = (|| {
            for t in tables.iter_mut() {
                self.reserve_blocks(t, pp + tg)?;
            }
            // prompt: all sequences' tokens flattened, cut into n_batch pieces
            let flat: Vec<(usize, usize, u32)> =
                (0..pl).flat_map(|s| (0..pp).map(move |p| (s, p))).map(|(s, p)| (s, p, rng.gen_range(0..n_vocab))).collect();
            let gen: Vec<u32> = (0..pl * tg).map(|_| rng.gen_range(0..n_vocab)).collect();
            let t0 = Instant::now();
            for piece in flat.chunks(self.opts.n_batch.max(1)) {
                let mut b = ForwardBatch::default();
                let mut i = 0;
                while i < piece.len() {
                    let s = piece[i].0;
                    let start = b.tokens.len();
                    while i < piece.len() && piece[i].0 == s {
                        b.tokens.push(piece[i].2);
                        b.positions.push(piece[i].1 as u32);
                        if piece[i].1 == pp - 1 {
                            b.logits_rows.push(b.tokens.len() - 1);
                        }
                        i += 1;
                    }
                    b.seqs.push(SeqBatch { start, len: b.tokens.len() - start, block_table: tables[s].clone() });
                    if let Some(&slot) = slots.get(s) {
                        b.state_slots.push(slot);
                    }
                }
                self.forward_raw(&b)?;
            }
            let t_pp = t0.elapsed().as_secs_f64();
            before_tg(&self.backend);
            let t1 = Instant::now();
            for step in 0..tg {
                let b = ForwardBatch {
                    tokens: gen[step * pl..(step + 1) * pl].to_vec(),
                    positions: vec![(pp + step) as u32; pl],
                    seqs: (0..pl).map(|s| SeqBatch { start: s, len: 1, block_table: tables[s].clone() }).collect(),
                    logits_rows: (0..pl).collect(),
                    state_slots: slots.clone(),
                };
                self.forward_raw(&b)?;
            }
            let t_tg = t1.elapsed().as_secs_f64();
            Ok(BatchedRun::new(pp, tg, pl, t_pp, t_tg))
        })();
        for t in &mut tables {
            self.release_blocks(t);
        }
        r
    }
}
