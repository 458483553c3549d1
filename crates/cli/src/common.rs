//! Options shared by the commands that load a model, and engine set-up.

use crate::resolve::resolve_model;
use anyhow::{bail, Context, Result};
use quarrel_core::KvType;
use quarrel_core::Backend;
use quarrel_cpu::CpuBackend;
use quarrel_cuda::CudaBackend;
use quarrel_engine::{Engine, EngineOptions};
use std::path::Path;
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args, Clone, Debug)]
pub struct ModelArgs {
    /// Model: a .gguf path, or a name from Quarrel's cache, a Hugging Face cache
    /// (org/repo[:file]) or an ollama store (name[:tag]). Default: SmolLM2-135M-Instruct Q4_1,
    /// fetched on first use.
    #[arg(short = 'm', long = "model")]
    pub model: Option<String>,
    /// Worker threads (default: all available cores).
    #[arg(short = 't', long = "threads", default_value_t = 0)]
    pub threads: usize,
    /// Context length in tokens (default: the model's, at most 4096).
    #[arg(short = 'c', long = "ctx", default_value_t = 0)]
    pub ctx: usize,
    /// KV cache element type: f16 (default, as llama.cpp), f32, or quantized q8_0 / q4_0
    /// (less memory, slightly higher perplexity).
    #[arg(long = "kv-type", default_value = "f16")]
    pub kv_type: String,
    /// Tokens per forward pass while processing the prompt.
    #[arg(short = 'b', long = "batch", default_value_t = 512)]
    pub batch: usize,
    /// KV cache memory budget (e.g. 512M, 2G, 1.5GiB, or bytes): the block pool holds as many
    /// blocks as fit, shared by all sequences (default: one full context).
    #[arg(long = "kv-mem", value_parser = parse_bytes)]
    pub kv_mem: Option<usize>,
    /// Compute device: auto (the first CUDA GPU when a driver and a GPU are present, else the
    /// CPU), cpu, or cuda[:N].
    #[arg(long = "device", default_value = "auto")]
    pub device: String,
    /// GPU memory for a mixture-of-experts model's expert weights (e.g. 8G): experts beyond it
    /// stay in host memory and the most recently routed are cached on the GPU (default: all on
    /// the GPU while they fit).
    #[arg(long = "expert-budget", value_parser = parse_bytes)]
    pub expert_budget: Option<usize>,
    /// GPU arithmetic: auto (default: invariant for models with routed experts or Mamba2
    /// layers, fast otherwise); fast; invariant (a prompt, its tokens one by one and any batch
    /// give the same logits bit for bit: matmuls in the prompt kernels' float order at every
    /// token count, attention on the tensor cores over fixed position spans); or exact (batch-invariant too, and llama.cpp's CPU
    /// arithmetic where the GPU can reproduce it: every matmul through the decode kernels,
    /// slower prompts). The CPU always computes exactly.
    #[arg(long = "numerics", value_enum, default_value_t = Numerics::Auto)]
    pub numerics: Numerics,
}

/// GPU arithmetic (`--numerics`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Numerics {
    /// Invariant for models whose routing or recurrent state would carry a rounding difference
    /// between a prompt and its tokens one by one into different expert choices or states
    /// (`{arch}.expert_count` > 0 or `{arch}.ssm.*` in the file), fast otherwise.
    #[default]
    Auto,
    /// The fastest kernels: a prompt's matmuls (tensor-core MMQ) and decode's (dp4a GEMV) sum
    /// in different float orders, so a prompt and its tokens one by one can differ by roundings.
    Fast,
    /// The CUDA backend's exact numerics (`QUARREL_CUDA_EXACT=1`): batch-invariant, the CPU
    /// backend's bits for Q4_0 / Q4_1 / Q8_0 matmuls.
    Exact,
    /// The CUDA backend's invariant numerics (`QUARREL_CUDA_INVARIANT=1`): batch-invariant at
    /// prompt speed (MMQ's float order at every token count).
    Invariant,
}

impl ModelArgs {
    pub fn model_path(&self) -> Result<PathBuf> {
        resolve_model(self.model.as_deref(), true)
    }

    /// Load the engine and start its service loop (continuous batching) on either backend.
    pub fn spawn_service(&self, opts: quarrel_engine::ServiceOptions) -> Result<quarrel_engine::EngineHandle> {
        let engine = self.engine()?;
        Ok(with_engine!(engine, e => { quarrel_engine::EngineHandle::spawn(e, opts) }))
    }

    pub fn engine(&self) -> Result<AnyEngine> {
        self.engine_with(|_| {})
    }

    /// `engine` with the options adjusted by `f` (sequence count, block size, ...).
    pub fn engine_with(&self, f: impl FnOnce(&mut EngineOptions)) -> Result<AnyEngine> {
        let path = self.model_path()?;
        let device = DeviceSel::parse(&self.device)?;
        let kv_type = KvType::parse(&self.kv_type).with_context(|| format!("unknown --kv-type {:?} (f16, f32, q8_0 or q4_0)", self.kv_type))?;
        let mut opts = EngineOptions { n_ctx: self.ctx, n_batch: self.batch, kv_type, kv_mem: self.kv_mem, ..Default::default() };
        f(&mut opts);
        let t0 = Instant::now();
        let spinner = indicatif::ProgressBar::new_spinner();
        spinner.set_message(format!("loading {} on {device}", path.display()));
        spinner.enable_steady_tick(std::time::Duration::from_millis(100));
        let engine = load_engine(device, self.threads, &path, opts, self.expert_budget, self.numerics);
        spinner.finish_and_clear();
        let engine = engine?;
        with_engine!(ref &engine, e => {
            let info = e.model.info();
            eprintln!(
                "loaded {} ({}, {:.1}M params, {:.0} MiB) on {} in {:.0} ms, ctx {}",
                path.file_name().map(|f| f.to_string_lossy()).unwrap_or_default(),
                info.arch,
                info.n_params as f64 / 1e6,
                e.gguf.file_size() as f64 / (1 << 20) as f64,
                e.backend.name(),
                t0.elapsed().as_secs_f64() * 1e3,
                e.n_ctx()
            );
        });
        Ok(engine)
    }
}

/// Where a model runs (`--device`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceSel {
    Cpu,
    Cuda(usize),
}

impl DeviceSel {
    /// `auto` (CUDA when a driver, a GPU, NVRTC and cuBLAS are present, else CPU), `cpu`,
    /// `cuda`, `cuda:N`.
    pub fn parse(s: &str) -> Result<DeviceSel> {
        Ok(match s {
            "cpu" => DeviceSel::Cpu,
            "auto" => {
                if quarrel_cuda::available() {
                    DeviceSel::Cuda(0)
                } else {
                    DeviceSel::Cpu
                }
            }
            "cuda" => DeviceSel::Cuda(0),
            d if d.starts_with("cuda:") => {
                DeviceSel::Cuda(d[5..].parse().with_context(|| format!("device {d:?}: expected cuda:N with N a GPU index"))?)
            }
            d => bail!("unknown device {d:?} (expected auto, cpu or cuda[:N])"),
        })
    }
}

impl std::fmt::Display for DeviceSel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceSel::Cpu => write!(f, "cpu"),
            DeviceSel::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// An engine on either backend; `with_engine!` runs generic code on the one inside.
#[allow(clippy::large_enum_variant)] // one per process
pub enum AnyEngine {
    Cpu(Engine<CpuBackend>),
    Cuda(Engine<CudaBackend>),
}

/// `with_engine!(any, e => { ... })`: the block, with `e` bound to the concrete `Engine<B>`
/// (the block is compiled once per backend).
macro_rules! with_engine {
    (ref $any:expr, $e:ident => $body:block) => {
        match $any {
            $crate::common::AnyEngine::Cpu($e) => $body,
            $crate::common::AnyEngine::Cuda($e) => $body,
        }
    };
    ($any:expr, $e:ident => $body:block) => {
        match $any {
            #[allow(unused_mut)]
            $crate::common::AnyEngine::Cpu(mut $e) => $body,
            #[allow(unused_mut)]
            $crate::common::AnyEngine::Cuda(mut $e) => $body,
        }
    };
}
pub(crate) use with_engine;

/// Load `path` on `device` (`threads` for the CPU backend; `expert_budget`: GPU bytes for
/// expert weights, the CPU keeps them all in its mapping; `numerics`: the GPU's arithmetic).
pub fn load_engine(device: DeviceSel, threads: usize, path: &Path, opts: EngineOptions, expert_budget: Option<usize>, numerics: Numerics) -> Result<AnyEngine> {
    Ok(match device {
        DeviceSel::Cpu => AnyEngine::Cpu(load_on(CpuBackend::new(threads)?, path, opts)?),
        DeviceSel::Cuda(n) => {
            let be = CudaBackend::new(n).with_context(|| format!("starting the CUDA backend on GPU {n} (use --device cpu to run on the CPU)"))?;
            be.set_expert_budget(expert_budget);
            match resolve_numerics(numerics, path) {
                Numerics::Auto | Numerics::Fast => {}
                Numerics::Exact => be.set_numerics(quarrel_core::Numerics::Exact),
                Numerics::Invariant => be.set_numerics(quarrel_core::Numerics::Invariant),
            }
            AnyEngine::Cuda(load_on(be, path, opts)?)
        }
    })
}

/// What `auto` numerics are for the model at `path` (others as given): invariant where the
/// file has routed experts or Mamba2 layers, fast otherwise (and where the file cannot be read:
/// loading it reports why).
pub fn resolve_numerics(n: Numerics, path: &Path) -> Numerics {
    if n != Numerics::Auto {
        return n;
    }
    let Ok(g) = quarrel_gguf::Gguf::open(path) else { return Numerics::Fast };
    let Ok(arch) = g.architecture() else { return Numerics::Fast };
    let experts = g.get_u64(&format!("{arch}.expert_count")).ok().flatten().unwrap_or(0) > 0;
    let recurrent = g.get(&format!("{arch}.ssm.conv_kernel")).is_some();
    if experts || recurrent {
        Numerics::Invariant
    } else {
        Numerics::Fast
    }
}

fn load_on<B: Backend>(be: B, path: &Path, opts: EngineOptions) -> Result<Engine<B>> {
    Engine::load(be, path, opts).with_context(|| format!("loading {}", path.display()))
}

/// A byte count with an optional unit: `4096`, `512K`, `512M`, `2G`, `1.5GiB` (powers of 1024).
pub fn parse_bytes(s: &str) -> std::result::Result<usize, String> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: f64 = num.parse().map_err(|_| format!("{s:?} is not a size (examples: 512M, 2G, 1048576)"))?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" | "kib" => 1024.0,
        "m" | "mb" | "mib" => 1024.0 * 1024.0,
        "g" | "gb" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tb" | "tib" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        u => return Err(format!("unknown size unit {u:?} in {s:?} (use K, M, G or T)")),
    };
    let bytes = v * mult;
    if !bytes.is_finite() || bytes < 1.0 || bytes > usize::MAX as f64 {
        return Err(format!("size {s:?} out of range"));
    }
    Ok(bytes as usize)
}

#[cfg(test)]
mod tests {
    use super::{parse_bytes, resolve_numerics, Numerics};

    /// `auto` numerics: invariant for files with routed experts or Mamba2 layers (tiny
    /// synthetic Mixtral-style MoE, Nemotron-H MoE, Mamba2), fast for dense transformers;
    /// an explicit choice is kept.
    #[test]
    fn auto_numerics_follow_the_architecture() {
        use quarrel_synth::archs::{write_arch_synth, ArchPreset, ArchSynthSpec};
        use quarrel_synth::{write_synth, Ftype, Preset, SynthSpec};
        let dir = tempfile::tempdir().unwrap();
        let dense = dir.path().join("tiny.gguf");
        write_synth(&SynthSpec::new(Preset::by_name("tiny").unwrap().clone(), Ftype::F32).seed(1), &dense, &mut |_, _| {}).unwrap();
        assert_eq!(resolve_numerics(Numerics::Auto, &dense), Numerics::Fast);
        assert_eq!(resolve_numerics(Numerics::Invariant, &dense), Numerics::Invariant);
        for (name, want) in [("tiny-mixtral", Numerics::Invariant), ("tiny-nemotron-h-moe", Numerics::Invariant), ("tiny-mamba2", Numerics::Invariant), ("tiny-granite", Numerics::Fast)] {
            let path = dir.path().join(format!("{name}.gguf"));
            let spec = ArchSynthSpec { preset: ArchPreset::by_name(name).unwrap_or_else(|| panic!("preset {name}")).clone(), ftype: Ftype::F32, seed: 1, vocab_from: None };
            write_arch_synth(&spec, &path, &mut |_, _| {}).unwrap();
            assert_eq!(resolve_numerics(Numerics::Auto, &path), want, "{name}");
            assert_eq!(resolve_numerics(Numerics::Fast, &path), Numerics::Fast, "{name}");
        }
        // an unreadable file: fast (loading it reports the error)
        assert_eq!(resolve_numerics(Numerics::Auto, &dir.path().join("missing.gguf")), Numerics::Fast);
    }

    #[test]
    fn sizes_parse_with_units_and_bad_ones_are_errors() {
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("512K"), Ok(512 << 10));
        assert_eq!(parse_bytes("512M"), Ok(512 << 20));
        assert_eq!(parse_bytes("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_bytes("2g"), Ok(2 << 30));
        assert!(parse_bytes("lots").is_err());
        assert!(parse_bytes("12X").is_err());
        assert!(parse_bytes("0").is_err());
    }
}

/// Sampling options shared by `run` and `chat`.
#[derive(clap::Args, Clone, Debug)]
pub struct SampleArgs {
    /// Temperature; 0 = greedy.
    #[arg(long = "temp", default_value_t = 0.8)]
    pub temp: f32,
    /// Top-k (0 = off).
    #[arg(long = "top-k", default_value_t = 40)]
    pub top_k: usize,
    /// Top-p (1 = off).
    #[arg(long = "top-p", default_value_t = 0.95)]
    pub top_p: f32,
    /// Min-p (0 = off).
    #[arg(long = "min-p", default_value_t = 0.05)]
    pub min_p: f32,
    /// Repetition penalty (1 = off).
    #[arg(long = "repeat-penalty", default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// Tokens the penalties look back over.
    #[arg(long = "repeat-last-n", default_value_t = 64)]
    pub repeat_last_n: usize,
    /// Presence penalty.
    #[arg(long = "presence-penalty", default_value_t = 0.0)]
    pub presence_penalty: f32,
    /// Frequency penalty.
    #[arg(long = "frequency-penalty", default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// Random seed (same seed, same output).
    #[arg(long = "seed", default_value_t = 0xC0FFEE)]
    pub seed: u64,
    /// Stop when this text is generated (repeatable).
    #[arg(long = "stop")]
    pub stop: Vec<String>,
    /// Keep generating past end-of-generation tokens.
    #[arg(long = "ignore-eos")]
    pub ignore_eos: bool,
}

impl SampleArgs {
    pub fn params(&self, max_tokens: usize) -> quarrel_engine::GenerateParams {
        quarrel_engine::GenerateParams {
            sampling: quarrel_engine::SamplingParams {
                temperature: self.temp,
                top_k: self.top_k,
                top_p: self.top_p,
                min_p: self.min_p,
                repeat_penalty: self.repeat_penalty,
                presence_penalty: self.presence_penalty,
                frequency_penalty: self.frequency_penalty,
                penalty_last_n: self.repeat_last_n,
                seed: self.seed,
            },
            max_tokens,
            stop: self.stop.clone(),
            ignore_eos: self.ignore_eos,
        }
    }
}
