//! Engine set-up from the shared flags (`args`): device choice, backend, numerics, loading.

use crate::args::ModelArgs;
use crate::resolve::resolve_model;
use anyhow::{bail, Context, Result};
use quarrel_core::{Backend, KvType, Numerics};
use quarrel_cpu::CpuBackend;
use quarrel_cuda::CudaBackend;
use quarrel_engine::{Completion, Engine, EngineOptions, GenerateParams};
use quarrel_models::ModelDescription;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

impl ModelArgs {
    pub fn model_path(&self) -> Result<PathBuf> {
        resolve_model(self.model.name.as_deref(), true)
    }

    /// Load the engine on the chosen backend.
    pub fn engine(&self) -> Result<AnyEngine> {
        self.engine_with(|_| {})
    }

    /// `engine` with the options adjusted by `f` (sequence count, block size, ...).
    pub fn engine_with(&self, f: impl FnOnce(&mut EngineOptions)) -> Result<AnyEngine> {
        self.engine_beside(f, None)
    }

    /// `engine_with`, and on the CPU on `beside`'s worker threads when that is a CPU engine
    /// too (a model that runs in turn with it: a speculative drafter).
    pub fn engine_beside(&self, f: impl FnOnce(&mut EngineOptions), beside: Option<&AnyEngine>) -> Result<AnyEngine> {
        let path = self.model_path()?;
        let (ctx, cache, dev) = (&self.engine.ctx, &self.engine.cache, &self.engine.device);
        let device = DeviceSel::parse(&dev.device)?;
        let kv_type = parse_kv_type(&cache.kv.kv_type)?;
        let mut opts = EngineOptions {
            n_ctx: ctx.n_ctx,
            n_batch: cache.batch,
            kv_type,
            kv_mem: cache.kv_mem,
            chat_template: self.template.source()?,
            ..Default::default()
        };
        f(&mut opts);
        let t0 = Instant::now();
        let spinner = indicatif::ProgressBar::new_spinner();
        spinner.set_message(format!("loading {} on {device}", path.display()));
        spinner.enable_steady_tick(std::time::Duration::from_millis(100));
        let cpu = match beside {
            Some(AnyEngine::Cpu(e)) if device == DeviceSel::Cpu => Some(e.backend.sharing_threads()),
            _ => None,
        };
        let engine = load_engine(device, ctx.threads, &path, opts, dev.expert_budget, dev.numerics.choice(), cpu);
        spinner.finish_and_clear();
        let engine = engine?;
        with_engine!(ref &engine, e => {
            for w in e.tokenizer.load_warnings() {
                eprintln!("warning: {w}");
            }
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

/// `--kv-type`'s value.
pub fn parse_kv_type(s: &str) -> Result<KvType> {
    KvType::parse(s).with_context(|| format!("unknown --kv-type {s:?} (f16, f32, q8_0 or q4_0)"))
}

/// Load `path` on `device` (`threads` for the CPU backend; `expert_budget`: GPU bytes for
/// expert weights, the CPU keeps them all in its mapping; `numerics`: the GPU's arithmetic,
/// None for the model's default, `ModelDescription::default_numerics`; `cpu`: the CPU
/// backend to use instead of a new one).
pub fn load_engine(
    device: DeviceSel,
    threads: usize,
    path: &Path,
    opts: EngineOptions,
    expert_budget: Option<usize>,
    numerics: Option<Numerics>,
    cpu: Option<CpuBackend>,
) -> Result<AnyEngine> {
    Ok(match device {
        DeviceSel::Cpu => {
            let be = cpu.map_or_else(|| CpuBackend::new(threads), Ok)?;
            let gguf = Arc::new(quarrel_gguf::Gguf::open(path).with_context(|| format!("loading {}", path.display()))?);
            let model = ModelDescription::from_gguf(&gguf).with_context(|| format!("loading {}", path.display()))?;
            // encoders' vectors are compared by cosine: their F16 weights may use AMX
            be.set_matrix_units(model.encoder);
            let mut e = Engine::from_gguf(be, gguf, opts).with_context(|| format!("loading {}", path.display()))?;
            e.path = Some(path.to_path_buf());
            AnyEngine::Cpu(e)
        }
        DeviceSel::Cuda(n) => {
            let be = CudaBackend::new(n)
                .with_context(|| format!("starting the CUDA backend on GPU {n} (use --device cpu to run on the CPU)"))?;
            be.set_expert_budget(expert_budget);
            // the numerics are set before the weights load; the file is opened once for both
            let gguf = Arc::new(quarrel_gguf::Gguf::open(path).with_context(|| format!("loading {}", path.display()))?);
            let model = ModelDescription::from_gguf(&gguf).with_context(|| format!("loading {}", path.display()))?;
            be.set_numerics(numerics.unwrap_or_else(|| model.default_numerics()));
            let mut e = Engine::from_gguf(be, gguf, opts).with_context(|| format!("loading {}", path.display()))?;
            e.path = Some(path.to_path_buf());
            AnyEngine::Cuda(e)
        }
    })
}

/// Generate from `ids` with the text written to stdout as it comes (flushed per token, so a
/// pipe or terminal shows it live), then a newline.
pub fn stream_to_stdout<B: Backend>(engine: &mut Engine<B>, ids: &[u32], params: &GenerateParams) -> Result<Completion> {
    let mut out = std::io::stdout().lock();
    let c = engine.generate(ids, params, &mut |ev| {
        let _ = out.write_all(ev.text.as_bytes());
        let _ = out.flush();
        true
    })?;
    let _ = writeln!(out);
    Ok(c)
}
