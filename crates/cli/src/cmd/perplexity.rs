//! `quarrel perplexity`: llama.cpp's perplexity protocol over a text file.

use crate::args::ModelArgs;
use crate::common::with_engine;
use anyhow::{Context, Result};
use std::io::Write;

/// Measure perplexity on a text file (llama.cpp's protocol).
///
/// Chunks of -c tokens (default 512), each scored on its second half, as llama-perplexity
/// does. Prints running values on stderr and `PPL = <value>` on stdout.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Text file to score.
    #[arg(short = 'f', long = "file")]
    pub file: std::path::PathBuf,
}

pub fn main(mut a: Args) -> Result<()> {
    let text = std::fs::read_to_string(&a.file).with_context(|| format!("reading {}", a.file.display()))?;
    let n_ctx = if a.model.engine.ctx.n_ctx == 0 { 512 } else { a.model.engine.ctx.n_ctx };
    a.model.engine.ctx.n_ctx = n_ctx;
    a.model.engine.cache.batch = a.model.engine.cache.batch.max(n_ctx);
    with_engine!(a.model.engine()?, engine => {
        let t0 = std::time::Instant::now();
        let r = engine.perplexity(&text, n_ctx, &mut |c| {
            eprint!("[{}]{:.4},", c.index + 1, c.running_ppl);
            let _ = std::io::stderr().flush();
        })?;
        eprintln!();
        eprintln!(
            "{} tokens, {} chunks of {n_ctx}, {} scored, {:.1} s ({:.1} t/s)",
            r.n_tokens,
            r.n_chunks,
            r.n_scored,
            t0.elapsed().as_secs_f64(),
            (r.n_chunks * n_ctx) as f64 / t0.elapsed().as_secs_f64()
        );
        println!("PPL = {:.4}", r.ppl);
        Ok(())
    })
}
