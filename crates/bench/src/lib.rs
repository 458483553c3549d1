//! # quarrel-bench: measurement tools over the engine's public API
//!
//! Benchmarks with llama.cpp's protocols and a numerics self-check, kept out of the library
//! crates users embed; `quarrel bench`, `quarrel batched-bench` and `quarrel consistency` are
//! their command-line wiring.
//!
//! ```text
//!  Engine<B> (or Engine<ProfiledBackend<B>>) ─► Bench::bench_pg / BatchedBench::bench_batched
//!       │          random token ids, caller-held block tables (Engine::eval_sequence, forward_raw)
//!       │                                   └─► Duration / BatchedRun ─► llama_bench::Row ─► markdown / JSON (mean ± stddev)
//!       └─► Consistency::consistency: prefill vs decode, batched vs alone ─► NMSE, argmax per position
//! ```
//!
//! | module        | responsibility |
//! |---------------|----------------|
//! | `bench`       | llama-bench's pp / tg / pp+tg runs (`Bench`), mean and sample standard deviation |
//! | `llama_bench` | llama-bench's test lists, result rows and outputs (markdown, `-o json` fields) |
//! | `batched`     | llama-batched-bench's protocol over N parallel sequences (`BatchedBench`) |
//! | `consistency` | self-consistency of a backend: prefill vs decode, batched vs alone (NMSE, argmax) |
//! | `profile`     | `ProfiledBackend`: any backend with its calls timed by op kind |
//!
//! The measurements are extension traits on `quarrel_engine::Engine`, so they read like engine
//! methods once imported (`use quarrel_bench::Bench; engine.bench_pp(512)`).

mod batched;
mod bench;
mod consistency;
pub mod llama_bench;
mod profile;

pub use batched::{BatchedBench, BatchedRun};
pub use bench::{mean_stddev, Bench};
pub use consistency::{nmse, Consistency, ConsistencyCheck, ConsistencyOptions};
pub use profile::{OpKind, OpStat, ProfiledBackend, QuantTypeKey};

/// Test helpers shared by the modules' unit tests.
#[cfg(test)]
mod test_util {
    use quarrel_synth::{write_synth, Ftype, Preset, SynthSpec};
    use std::path::{Path, PathBuf};

    /// The `tiny` synthetic llama, Q4_0, seed 3, written into `dir`.
    pub fn tiny(dir: &Path) -> PathBuf {
        let path = dir.join("tiny-q4_0.gguf");
        let spec = SynthSpec::new(*Preset::by_name("tiny").unwrap(), Ftype::from_name("q4_0").unwrap()).seed(3);
        write_synth(&spec, &path, &mut |_, _| {}).unwrap();
        path
    }
}
