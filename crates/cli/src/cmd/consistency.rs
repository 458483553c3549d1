//! `quarrel consistency`: does a position's logits depend on how its tokens were batched?
//! (quarrel-bench: `Consistency::consistency`).

use crate::args::ModelArgs;
use crate::common::with_engine;
use anyhow::{bail, Result};
use quarrel_bench::{Consistency, ConsistencyCheck, ConsistencyOptions};

/// Check that the logits do not depend on how the tokens are batched.
///
/// Three comparisons over seeded random token ids (BOS first when the model adds one):
///
///   prefill vs prefill+decode   N tokens in one prefill (chunks of -b) against the first P
///                               prefilled and the rest decoded one token at a time
///
///   prefill vs decode           the same prefill against every token decoded one at a time
///
///   batched vs alone            S sequences of different lengths and tokens in one forward
///                               pass against each sequence alone
///
/// For each: the worst and mean NMSE of the logits over the compared positions (squared
/// differences over the reference's squares), positions bit for bit identical, and positions
/// whose greedy pick (argmax) differs. The CPU backend and `--numerics exact` or `--numerics
/// invariant` on CUDA compute batch-invariantly (0 everywhere); CUDA's default fast kernels sum
/// prompts and decode steps in different float orders.
///
/// With --bound, exits with status 1 when a comparison's worst NMSE exceeds it.
///
/// Example: quarrel consistency -m model.gguf --device cuda -n 100 --bound 1e-5
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Tokens of the test sequence.
    #[arg(short = 'n', long = "tokens", default_value_t = 64)]
    pub n_tokens: usize,
    /// Tokens prefilled before decoding the rest one at a time [default: half of -n].
    #[arg(long = "prefill")]
    pub n_prefill: Option<usize>,
    /// Sequences in the batch check (0: skip it).
    #[arg(short = 's', long = "seqs", default_value_t = 8)]
    pub n_seqs: usize,
    /// Seed of the token ids.
    #[arg(long = "seed", default_value_t = 1)]
    pub seed: u64,
    /// Fail (exit status 1) when a comparison's worst NMSE exceeds this.
    #[arg(long = "bound")]
    pub bound: Option<f64>,
}

pub fn main(mut a: Args) -> Result<()> {
    let o = ConsistencyOptions { n_tokens: a.n_tokens, n_prefill: a.n_prefill.unwrap_or(a.n_tokens / 2), n_seqs: a.n_seqs, seed: a.seed };
    if o.n_prefill > o.n_tokens {
        bail!("--prefill {} is more than the {} tokens (-n)", o.n_prefill, o.n_tokens);
    }
    if a.model.engine.ctx.n_ctx == 0 {
        a.model.engine.ctx.n_ctx = o.n_tokens.max(16);
    }
    let n_seqs = o.n_seqs.max(1);
    let checks = with_engine!(a.model.engine_with(|e| e.n_seq = e.n_seq.max(n_seqs))?, engine => {
        eprintln!("{} tokens ({} prefilled before decoding), {} sequences, seed {}, prefill chunks of {}", o.n_tokens, o.n_prefill, o.n_seqs, o.seed, engine.opts.n_batch);
        engine.consistency(&o)?
    });
    print!("{}", table(&checks, a.bound));
    if let Some(b) = a.bound {
        let over: Vec<&str> = checks.iter().filter(|c| c.worst() > b).map(|c| c.name).collect();
        if !over.is_empty() {
            eprintln!("worst NMSE above {b:.0e}: {}", over.join(", "));
            std::process::exit(1);
        }
    }
    Ok(())
}

fn table(checks: &[ConsistencyCheck], bound: Option<f64>) -> String {
    let mut s = String::from("| check | positions | worst NMSE | mean NMSE | identical | greedy differs |");
    s += if bound.is_some() { " within bound |\n" } else { "\n" };
    s += "|---|---:|---:|---:|---:|---:|";
    s += if bound.is_some() { "---|\n" } else { "\n" };
    for c in checks {
        s += &format!("| {} | {} | {:.2e} | {:.2e} | {} | {} |", c.name, c.nmse.len(), c.worst(), c.mean(), c.identical(), c.argmax_differ);
        if let Some(b) = bound {
            s += if c.worst() <= b { " yes |" } else { " NO |" };
        }
        s += "\n";
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_marks_checks_over_the_bound() {
        let c = |name, nmse: Vec<f64>| ConsistencyCheck { name, nmse, argmax_differ: 0 };
        let t = table(&[c("a", vec![0.0, 0.0]), c("b", vec![2e-5, 0.0])], Some(1e-5));
        assert!(t.contains("| a | 2 | 0.00e0 | 0.00e0 | 2 | 0 | yes |"), "{t}");
        assert!(t.contains("| b | 2 | 2.00e-5 | 1.00e-5 | 1 | 0 | NO |"), "{t}");
        assert!(!table(&[c("a", vec![0.0])], None).contains("bound"));
    }
}
