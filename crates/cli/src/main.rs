//! # quarrel: the command-line binary
//!
//! Argument parsing and wiring only: every command resolves a model, builds a backend and
//! an engine, and calls into the library crates.
//!
//! | module          | responsibility |
//! |-----------------|----------------|
//! | `cmd::run`      | `quarrel run`: one streamed completion |
//! | `cmd::chat`     | `quarrel chat`: interactive chat with history |
//! | `cmd::tokenize` | `quarrel tokenize` |
//! | `cmd::embed`    | `quarrel embed`: embeddings as JSON lines or into Longbow (Arrow Flight) |
//! | `cmd::perplexity` | `quarrel perplexity` (llama.cpp protocol) |
//! | `cmd::inspect`  | `quarrel inspect`: metadata and tensor table |
//! | `cmd::consistency` | `quarrel consistency`: prefill vs decode, batched vs alone (quarrel-bench) |
//! | `cmd::quantize` | `quarrel quantize`: a GGUF model converted to another file type (llama-quantize's mixes) |
//! | `cmd::synth`    | `quarrel synth`: random-weights models with real shapes (quarrel-synth) |
//! | `cmd::bench`    | `quarrel bench`: llama-bench's protocol, flags and output (quarrel-bench) |
//! | `cmd::batched_bench` | `quarrel batched-bench`: N parallel sequences (llama-batched-bench; quarrel-bench) |
//! | `cmd::pull`     | `quarrel pull` and the default model |
//! | `cmd::models`   | `quarrel ls`, `quarrel rm` (the cache), `quarrel ps` (a server's loaded models) |
//! | `cmd::gpu`      | `quarrel gpu`: CUDA devices and their copy bandwidth |
//! | `cmd::serve`    | `quarrel serve`: HTTP/WebSocket APIs (quarrel-server) |
//! | `cmd::keys`     | `quarrel keys create|list|revoke` |
//! | `cmd::completions` | `quarrel completions SHELL`, `quarrel man` |
//! | `cmd::loadtest` | `quarrel loadtest`: concurrent streaming clients against a server (quarrel-loadtest) |
//! | `resolve`       | `-m` resolution: path, Quarrel cache, HF cache, ollama store |
//! | `config`        | `--config FILE`: a TOML file's settings under the flags and QUARREL_ variables |
//! | `args`          | flag groups shared by the commands (model, threads and context, KV cache, device, sampling), declared once |
//! | `common`        | engine set-up from those flags: device, backend, numerics, loading |

mod args;
mod cmd;

/// mimalloc gives freed memory back to the system. glibc's malloc keeps it in one arena per
/// thread that once allocated, so a long-running server's resident memory creeps up with
/// every burst of requests (tokenizing, JSON bodies, embeddings) long after the work is done.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod common;
mod config;
mod resolve;
mod speculate;

use clap::{CommandFactory, Parser, Subcommand};

/// `--version`: the crate version and the git commit it was built from (build.rs).
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("QUARREL_GIT_COMMIT"), ")");

/// Quarrel runs GGUF language models on your CPU: chat, complete, score and inspect.
///
/// Models are given with -m as a path to a .gguf file or a name (see `quarrel pull --help`).
/// Without -m the default model, SmolLM2-135M-Instruct (Q4_1), is used and fetched on first use.
#[derive(Parser)]
#[command(name = "quarrel", version = VERSION, about, long_about, propagate_version = true)]
pub(crate) struct Cli {
    #[command(subcommand)]
    cmd: Command,
}

#[derive(Subcommand)]
/// Each command's help is the doc comment of its `Args` (a doc comment here would replace it).
pub(crate) enum Command {
    Run(cmd::run::Args),
    Chat(cmd::chat::Args),
    Tokenize(cmd::tokenize::Args),
    Perplexity(cmd::perplexity::Args),
    Consistency(cmd::consistency::Args),
    Inspect(cmd::inspect::Args),
    Quantize(cmd::quantize::Args),
    Synth(cmd::synth::Args),
    Pull(cmd::pull::Args),
    Ls(cmd::models::LsArgs),
    Rm(cmd::models::RmArgs),
    Ps(cmd::models::PsArgs),
    Bench(cmd::bench::Args),
    BatchedBench(cmd::batched_bench::Args),
    Gpu(cmd::gpu::Args),
    Embed(cmd::embed::Args),
    Serve(cmd::serve::Args),
    Keys(cmd::keys::Args),
    Loadtest(cmd::loadtest::Args),
    Completions(cmd::completions::CompletionArgs),
    Man(cmd::completions::ManArgs),
}

fn main() {
    // Behave like other Unix tools when the reader goes away (`quarrel inspect M | head`), except
    // in commands that talk over the network: there a peer that drops its connection must be an
    // error the command handles (a reconnect), not a signal that kills the process.
    let argv: Vec<String> = std::env::args().collect();
    let network = matches!(argv.get(1).map(String::as_str), Some("serve" | "loadtest" | "ps"))
        || (argv.get(1).map(String::as_str) == Some("embed") && argv.iter().any(|a| a == "--flight"));
    #[cfg(unix)]
    if !network {
        // SAFETY: restoring the default disposition of SIGPIPE before any thread starts.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    // `quarrel --version --verbose`: also the CPU backend's SIMD level and environment table
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() == 2 && args.iter().any(|a| a == "--verbose") && args.iter().any(|a| a == "--version" || a == "-V") {
        println!("quarrel {VERSION}\nsimd: {}", quarrel_cpu::simd::features_string());
        for (name, value, meaning) in quarrel_cpu::tuning::tuning_table() {
            println!("{name}={value}\t{meaning}");
        }
        return;
    }
    let argv = llama_style_args(std::env::args());
    let (argv, config) = match config::apply(&Cli::command(), argv) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::exit(2);
        }
    };
    let cli = Cli::try_parse_from(argv).unwrap_or_else(|e| {
        if let Some(p) = &config {
            eprintln!("(with the settings of {})", p.display());
        }
        e.exit()
    });
    let r = match cli.cmd {
        Command::Run(a) => cmd::run::main(a),
        Command::Chat(a) => cmd::chat::main(a),
        Command::Tokenize(a) => cmd::tokenize::main(a),
        Command::Perplexity(a) => cmd::perplexity::main(a),
        Command::Consistency(a) => cmd::consistency::main(a),
        Command::Inspect(a) => cmd::inspect::main(a),
        Command::Quantize(a) => cmd::quantize::main(a),
        Command::Synth(a) => cmd::synth::main(a),
        Command::Pull(a) => cmd::pull::main(a),
        Command::Ls(a) => cmd::models::ls(a),
        Command::Rm(a) => cmd::models::rm(a),
        Command::Ps(a) => cmd::models::ps(a),
        Command::Bench(a) => cmd::bench::main(a),
        Command::BatchedBench(a) => cmd::batched_bench::main(a),
        Command::Gpu(a) => cmd::gpu::main(a),
        Command::Embed(a) => cmd::embed::main(a),
        Command::Serve(a) => cmd::serve::main(a),
        Command::Keys(a) => cmd::keys::main(a),
        Command::Loadtest(a) => cmd::loadtest::main(a),
        Command::Completions(a) => cmd::completions::completions(a),
        Command::Man(a) => cmd::completions::man(a),
    };
    if let Err(e) = r {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

/// llama.cpp spells some multi-letter flags with one dash (`-npp 128`); accept those too.
fn llama_style_args(args: impl Iterator<Item = String>) -> Vec<String> {
    args.map(|a| match a.as_str() {
        "-npp" | "-ntg" | "-npl" => format!("-{a}"),
        _ => a,
    })
    .collect()
}
