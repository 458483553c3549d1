//! Benchmark primitives with llama-bench's protocol, and an op-kind profiler.
//!
//! | test | what is timed (llama-bench's `test_prompt` / `test_gen`) |
//! |------|-----------------------------------------------------------|
//! | pp*n* | one prompt of *n* random token ids (BOS first when the model adds one) from an empty sequence, in forward passes of `n_batch` tokens, logits of the last token |
//! | tg*n* | *n* single-token forward passes from an empty sequence (positions `0..n`), BOS first, then random ids, logits every step |
//! | pp*n*+tg*m* | both, the decode continuing after the prompt |
//!
//! Every run starts from an empty sequence and releases its KV blocks afterwards, so runs are
//! independent repetitions. Token ids are drawn before the clock starts, from a fixed seed.

use quarrel_core::Backend;
use quarrel_engine::{Engine, EngineError};
use rand::{Rng, SeedableRng};
use std::time::{Duration, Instant};

/// Seed of the random token ids of the benchmark runs.
const BENCH_SEED: u64 = 0x5EED_BE4C;

/// llama-bench's tests on an [`Engine`] (`use quarrel_bench::Bench` brings them into scope).
pub trait Bench {
    /// Time prompt processing of `n_prompt` random tokens (see the module docs).
    fn bench_pp(&mut self, n_prompt: usize) -> Result<Duration, EngineError> {
        self.bench_pg(n_prompt, 0)
    }

    /// Time `n_gen` single-token decode steps from an empty sequence (see the module docs).
    fn bench_tg(&mut self, n_gen: usize) -> Result<Duration, EngineError> {
        self.bench_pg(0, n_gen)
    }

    /// Time a prompt of `n_prompt` random tokens followed by `n_gen` decode steps
    /// (llama-bench's `-pg`); either may be 0, not both.
    fn bench_pg(&mut self, n_prompt: usize, n_gen: usize) -> Result<Duration, EngineError>;
}

impl<B: Backend> Bench for Engine<B> {
    fn bench_pg(&mut self, n_prompt: usize, n_gen: usize) -> Result<Duration, EngineError> {
        if n_prompt + n_gen == 0 {
            return Err(EngineError::InvalidRequest("a benchmark run needs at least one token".into()));
        }
        if n_prompt + n_gen > self.opts.n_ctx {
            return Err(EngineError::PromptTooLong { prompt: n_prompt + n_gen, ctx: self.opts.n_ctx });
        }
        let tokens = bench_tokens(self, n_prompt + n_gen, n_prompt as u64 ^ ((n_gen as u64) << 32));
        let (prompt, gen) = tokens.split_at(n_prompt);
        // logits of the prompt's last token only, as llama-bench (one llama_decode of up to
        // n_batch = 2048 tokens without explicit outputs)
        let want = [n_prompt.saturating_sub(1)];
        let mut table = vec![];
        let t0 = Instant::now();
        let r = (|| {
            if !prompt.is_empty() {
                self.eval_sequence(&mut table, prompt, 0, &want)?;
            }
            for (i, &tok) in gen.iter().enumerate() {
                self.eval_sequence(&mut table, &[tok], n_prompt + i, &[0])?;
            }
            Ok(())
        })();
        let dt = t0.elapsed();
        self.release_blocks(&mut table);
        r.map(|()| dt)
    }
}

/// `n` token ids: BOS first when the model adds one, then uniform random ids.
fn bench_tokens<B: Backend>(e: &Engine<B>, n: usize, salt: u64) -> Vec<u32> {
    random_tokens(e, n, &mut rand_chacha::ChaCha8Rng::seed_from_u64(BENCH_SEED ^ salt))
}

/// `n` ids from `rng`: BOS first when the model adds one, then uniform random ids (the
/// benchmarks' and `consistency`'s test sequences).
pub(crate) fn random_tokens<B: Backend>(e: &Engine<B>, n: usize, rng: &mut rand_chacha::ChaCha8Rng) -> Vec<u32> {
    let n_vocab = e.n_vocab().max(1) as u32;
    let bos = if e.tokenizer.add_bos() { e.tokenizer.bos_id() } else { None };
    (0..n).map(|i| if i == 0 { bos } else { None }.unwrap_or_else(|| rng.gen_range(0..n_vocab))).collect()
}

/// Mean, and the sample standard deviation (n − 1; 0 for fewer than 2 values), as llama-bench.
pub fn mean_stddev(v: &[f64]) -> (f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0);
    }
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    if v.len() < 2 {
        return (mean, 0.0);
    }
    let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1.0);
    (mean, var.sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::tiny;
    use quarrel_cpu::CpuBackend;
    use quarrel_engine::EngineOptions;

    #[test]
    fn bench_runs_release_their_blocks_and_check_lengths() {
        let dir = tempfile::tempdir().unwrap();
        let opts = EngineOptions { n_ctx: 64, n_batch: 8, ..Default::default() };
        let mut e = Engine::load(CpuBackend::new(1).unwrap(), &tiny(dir.path()), opts).unwrap();
        let all = e.block_pool().n_blocks();
        assert!(e.bench_pp(20).unwrap() > Duration::ZERO); // 3 passes of n_batch 8
        assert_eq!(e.block_pool().n_free(), all);
        assert!(e.bench_tg(5).unwrap() > Duration::ZERO);
        assert_eq!(e.block_pool().n_free(), all);
        assert!(e.bench_pg(30, 34).unwrap() > Duration::ZERO);
        assert_eq!(e.block_pool().n_free(), all);
        assert!(matches!(e.bench_pg(40, 25), Err(EngineError::PromptTooLong { prompt: 65, ctx: 64 })));
        assert!(matches!(e.bench_tg(0), Err(EngineError::InvalidRequest(_))));
        assert_eq!(e.block_pool().n_free(), all);
        let t = bench_tokens(&e, 50, 1);
        assert_eq!(t, bench_tokens(&e, 50, 1), "seeded");
        assert!(t.iter().all(|&x| (x as usize) < e.n_vocab()));
    }

    #[test]
    fn mean_and_sample_stddev() {
        assert_eq!(mean_stddev(&[]), (0.0, 0.0));
        assert_eq!(mean_stddev(&[3.0]), (3.0, 0.0));
        let (m, s) = mean_stddev(&[1.0, 2.0, 3.0, 4.0]);
        assert_eq!(m, 2.5);
        assert!((s - 1.2909944487358056).abs() < 1e-12);
    }
}
