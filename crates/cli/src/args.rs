//! Flag groups shared by the commands, each declared once and flattened
//! (`#[command(flatten)]`) into every command that takes them:
//!
//! | group         | flags | commands |
//! |---------------|-------|----------|
//! | `ModelArgs`   | `ModelArg`, `TemplateArg` and `EngineArgs` | run, chat, perplexity, consistency, batched-bench |
//! | `EngineArgs`  | all of `ContextArgs`, `CacheArgs`, `DeviceArgs` | `ModelArgs`, serve |
//! | `ModelArg`    | `-m` (one model) | the above, embed |
//! | `TemplateArg` | `--chat-template` | `ModelArgs`, serve |
//! | `ContextArgs` | `-t`, `-c` | the above, serve, embed |
//! | `CacheArgs`   | `--kv-type`, `-b`, `--kv-mem` | `ModelArgs`, serve |
//! | `KvTypeArg`   | `--kv-type` | `CacheArgs`, bench |
//! | `DeviceArgs`  | `--device`, `--expert-budget`, `--numerics` | `ModelArgs`, serve, bench, embed |
//! | `SampleArgs`  | `--temp`, `--top-k`, ... `--stop`, `--ignore-eos` | run, chat |
//! | `GenerationArgs` | all of `ModelArgs`, `SampleArgs` and `SpecArgs` (`speculate`) | run, chat |

use quarrel_core::Numerics;

/// Everything a command that loads one model takes.
#[derive(clap::Args, Clone, Debug)]
pub struct ModelArgs {
    #[command(flatten)]
    pub model: ModelArg,
    #[command(flatten)]
    pub template: TemplateArg,
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// How an engine runs, whatever the model: threads and context, KV cache, device.
#[derive(clap::Args, Clone, Debug)]
pub struct EngineArgs {
    #[command(flatten)]
    pub ctx: ContextArgs,
    #[command(flatten)]
    pub cache: CacheArgs,
    #[command(flatten)]
    pub device: DeviceArgs,
}

/// A model to generate with and the sampling chain to pick its tokens.
#[derive(clap::Args)]
pub struct GenerationArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sample: SampleArgs,
    #[command(flatten)]
    pub spec: crate::speculate::SpecArgs,
}

impl GenerationArgs {
    /// The model loaded, with the drafter the speculative-decoding flags ask for.
    pub fn engine(&self) -> anyhow::Result<crate::common::AnyEngine> {
        self.spec.load(&self.model)
    }
}

/// `-m`: the model.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct ModelArg {
    /// Model: a .gguf path, or a name from Quarrel's cache, a Hugging Face cache
    /// (org/repo[:file]) or an ollama store (name[:tag]). Default: SmolLM2-135M-Instruct Q4_1,
    /// fetched on first use.
    #[arg(short = 'm', long = "model", value_name = "MODEL")]
    pub name: Option<String>,
}

/// `--chat-template`: a chat template in place of the model's.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct TemplateArg {
    /// Chat template to use instead of the model's: a Jinja file (Hugging Face's template
    /// syntax), or `chatml`.
    #[arg(long = "chat-template", value_name = "FILE|chatml", env = "QUARREL_CHAT_TEMPLATE")]
    pub chat_template: Option<String>,
}

/// ChatML, for `--chat-template chatml`.
const CHATML: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}\
{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

impl TemplateArg {
    /// The template's source (None: the model's own).
    pub fn source(&self) -> anyhow::Result<Option<String>> {
        use anyhow::Context;
        match self.chat_template.as_deref() {
            None => Ok(None),
            Some("chatml") => Ok(Some(CHATML.to_string())),
            Some(path) => std::fs::read_to_string(path)
                .map(Some)
                .with_context(|| format!("--chat-template {path}: cannot read it (a file, or chatml)")),
        }
    }
}

/// `-t`, `-c`: CPU threads and context length.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct ContextArgs {
    /// Worker threads (default: all available cores).
    #[arg(short = 't', long = "threads", default_value_t = 0, env = "QUARREL_THREADS")]
    pub threads: usize,
    /// Context length in tokens (default: the model's, at most 4096).
    #[arg(short = 'c', long = "ctx", value_name = "CTX", default_value_t = 0, env = "QUARREL_CTX")]
    pub n_ctx: usize,
}

/// `--kv-type`, `-b`, `--kv-mem`: the KV cache and prompt batching.
#[derive(clap::Args, Clone, Debug)]
pub struct CacheArgs {
    #[command(flatten)]
    pub kv: KvTypeArg,
    /// Tokens per forward pass while processing the prompt.
    #[arg(short = 'b', long = "batch", default_value_t = 512, env = "QUARREL_BATCH")]
    pub batch: usize,
    /// KV cache memory budget (e.g. 512M, 2G, 1.5GiB, or bytes): the block pool holds as many
    /// blocks as fit, shared by all sequences (default: one full context).
    #[arg(long = "kv-mem", value_parser = parse_bytes, env = "QUARREL_KV_MEM")]
    pub kv_mem: Option<usize>,
}

impl Default for CacheArgs {
    fn default() -> Self {
        CacheArgs { kv: KvTypeArg::default(), batch: 512, kv_mem: None }
    }
}

/// `--kv-type`.
#[derive(clap::Args, Clone, Debug)]
pub struct KvTypeArg {
    /// KV cache element type: f16 (default, as llama.cpp), f32, or quantized q8_0 / q4_0
    /// (less memory, slightly higher perplexity).
    #[arg(long = "kv-type", default_value = "f16", env = "QUARREL_KV_TYPE")]
    pub kv_type: String,
}

impl Default for KvTypeArg {
    fn default() -> Self {
        KvTypeArg { kv_type: "f16".into() }
    }
}

/// `--device`, `--expert-budget`, `--numerics`: where and how a model computes.
#[derive(clap::Args, Clone, Debug)]
pub struct DeviceArgs {
    /// Compute device: auto (the first CUDA GPU when a driver and a GPU are present, else the
    /// CPU), cpu, or cuda[:N].
    #[arg(long = "device", default_value = "auto", env = "QUARREL_DEVICE")]
    pub device: String,
    /// GPU memory for a mixture-of-experts model's expert weights (e.g. 8G): experts beyond it
    /// stay in host memory and the most recently routed are cached on the GPU (default: all on
    /// the GPU while they fit).
    #[arg(long = "expert-budget", value_parser = parse_bytes, env = "QUARREL_EXPERT_BUDGET")]
    pub expert_budget: Option<usize>,
    /// GPU arithmetic: auto (default: invariant for models with routed experts or Mamba2
    /// layers, fast otherwise); fast; invariant (a prompt, its tokens one by one and any batch
    /// give the same logits bit for bit: matmuls in the prompt kernels' float order at every
    /// token count, attention on the tensor cores over fixed position spans); or exact (batch-invariant too, and llama.cpp's CPU
    /// arithmetic where the GPU can reproduce it: every matmul through the decode kernels,
    /// slower prompts). The CPU always computes exactly.
    #[arg(long = "numerics", value_enum, default_value_t = NumericsArg::Auto, env = "QUARREL_NUMERICS")]
    pub numerics: NumericsArg,
}

impl Default for DeviceArgs {
    fn default() -> Self {
        DeviceArgs { device: "auto".into(), expert_budget: None, numerics: NumericsArg::Auto }
    }
}

/// `--numerics`: a choice, or the model's default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum NumericsArg {
    /// Invariant for models whose routing or recurrent state would carry a rounding difference
    /// between a prompt and its tokens one by one into different expert choices or states
    /// (`{arch}.expert_count` > 0 or `{arch}.ssm.*` in the file), fast otherwise
    /// (`quarrel_models::ModelDescription::default_numerics` decides).
    #[default]
    Auto,
    /// The fastest kernels: a prompt's matmuls (tensor-core MMQ) and decode's (dp4a GEMV) sum
    /// in different float orders, so a prompt and its tokens one by one can differ by roundings.
    Fast,
    /// The CUDA backend's exact numerics: batch-invariant, the CPU
    /// backend's bits for Q4_0 / Q4_1 / Q8_0 matmuls.
    Exact,
    /// The CUDA backend's invariant numerics: batch-invariant at
    /// prompt speed (MMQ's float order at every token count).
    Invariant,
}

impl NumericsArg {
    /// The user's choice; None: the model's default.
    pub fn choice(self) -> Option<Numerics> {
        match self {
            NumericsArg::Auto => None,
            NumericsArg::Fast => Some(Numerics::Fast),
            NumericsArg::Exact => Some(Numerics::Exact),
            NumericsArg::Invariant => Some(Numerics::Invariant),
        }
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
            logit_bias: vec![],
        }
    }
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
    use super::*;

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

    /// `--numerics auto` leaves the choice to the model; the others are kept as given.
    #[test]
    fn numerics_flag_maps_to_a_choice() {
        assert_eq!(NumericsArg::Auto.choice(), None);
        assert_eq!(NumericsArg::Fast.choice(), Some(Numerics::Fast));
        assert_eq!(NumericsArg::Invariant.choice(), Some(Numerics::Invariant));
        assert_eq!(NumericsArg::Exact.choice(), Some(Numerics::Exact));
        assert_eq!(NumericsArg::default(), NumericsArg::Auto);
    }
}
