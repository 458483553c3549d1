//! `quarrel serve`: wiring for the server crate — model catalog and loader (CPU engines behind
//! `EngineHandle`s), keys, limits, logging, the listener.

use crate::args::{EngineArgs, ModelArg, ModelArgs, TemplateArg};
use crate::resolve::{cache_dir, resolve_model};
use crate::speculate::SpecArgs;
use anyhow::{bail, Context, Result};
use quarrel_engine::{EngineHandle, ServiceOptions};
use quarrel_server::{AppState, KeyStore, ModelEntry, ModelLoader, RateLimit, Registry, ServerConfig};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Serve models over HTTP: OpenAI-, ollama- and Quarrel-compatible APIs, WebSocket, metrics.
///
/// Endpoints: /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/models (OpenAI);
/// /api/generate, /api/chat, /api/embed, /api/tags, /api/show, /api/ps (ollama);
/// /api/models, /api/stream, /ws (Quarrel); /metrics, /healthz, /readyz, /openapi.json.
/// Without -m the default model is served. API keys (see `quarrel keys`) are required when
/// the keys file exists, and always when binding to a non-loopback address.
#[derive(clap::Args)]
pub struct Args {
    /// TOML file of settings: keys are these long flag names (`port = 8080`, `model = ["a",
    /// "b"]`, `no-auth = true`); flags and QUARREL_ variables override it.
    #[arg(long = "config", env = "QUARREL_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Model(s) to load at start (repeatable): path or name as for `quarrel run -m`.
    #[arg(short = 'm', long = "model", env = "QUARREL_MODEL")]
    pub models: Vec<String>,
    /// A directory whose .gguf files may be loaded by name (on demand or via the API).
    #[arg(long = "models-dir", env = "QUARREL_MODELS_DIR")]
    pub models_dir: Option<PathBuf>,
    /// Address to listen on (0.0.0.0 or :: for every interface; API keys are then required).
    #[arg(long, default_value = "127.0.0.1", env = "QUARREL_HOST")]
    pub host: IpAddr,
    /// TCP port to listen on (0: any free port).
    #[arg(long, default_value_t = 8080, env = "QUARREL_PORT")]
    pub port: u16,
    #[command(flatten)]
    pub template: TemplateArg,
    #[command(flatten)]
    pub engine: EngineArgs,
    #[command(flatten)]
    pub spec: SpecArgs,
    /// Most sequences decoding at once per model.
    #[arg(long, default_value_t = 64, env = "QUARREL_PARALLEL")]
    pub parallel: usize,
    /// Most requests waiting per model; beyond it: 503 with Retry-After.
    #[arg(long, default_value_t = 256, env = "QUARREL_QUEUE")]
    pub queue: usize,
    /// KV cache size per model, in full-context sequences (shared by all requests); --kv-mem
    /// overrides it.
    #[arg(long = "kv-seqs", default_value_t = 8, env = "QUARREL_KV_SEQS")]
    pub kv_seqs: usize,
    /// Do not reuse the KV blocks of earlier prompts that share a prefix.
    #[arg(long = "no-prefix-cache", env = "QUARREL_NO_PREFIX_CACHE", value_parser = clap::builder::BoolishValueParser::new())]
    pub no_prefix_cache: bool,
    /// Memory budget for loaded models in MiB (0 = 80% of RAM); least recently used models
    /// are unloaded to fit.
    #[arg(long = "memory-budget-mib", default_value_t = 0, env = "QUARREL_MEMORY_BUDGET_MIB")]
    pub memory_budget_mib: u64,
    /// Do not load models on demand when a request names an unloaded one.
    #[arg(long = "no-load-on-demand", env = "QUARREL_NO_LOAD_ON_DEMAND", value_parser = clap::builder::BoolishValueParser::new())]
    pub no_on_demand: bool,
    /// API keys file (default: $QUARREL_HOME/keys.json).
    #[arg(long = "keys", env = "QUARREL_KEYS")]
    pub keys: Option<PathBuf>,
    /// Serve without API keys even on a non-loopback address.
    #[arg(long = "no-auth", env = "QUARREL_NO_AUTH", value_parser = clap::builder::BoolishValueParser::new())]
    pub no_auth: bool,
    /// Allowed CORS origin (repeatable or comma-separated; `*` for any).
    #[arg(long = "cors-origin", env = "QUARREL_CORS_ORIGIN", value_delimiter = ',')]
    pub cors: Vec<String>,
    /// Requests per minute per API key (0 = unlimited).
    #[arg(long = "rate-limit", default_value_t = 0, env = "QUARREL_RATE_LIMIT")]
    pub rate_key: u32,
    /// Requests per minute per client IP (0 = unlimited).
    #[arg(long = "rate-limit-ip", default_value_t = 0, env = "QUARREL_RATE_LIMIT_IP")]
    pub rate_ip: u32,
    /// Burst allowance of the rate limits (default: the per-minute rate).
    #[arg(long = "rate-burst", env = "QUARREL_RATE_BURST")]
    pub rate_burst: Option<u32>,
    /// Largest request body in bytes.
    #[arg(long = "max-body-bytes", default_value_t = 4 << 20, env = "QUARREL_MAX_BODY_BYTES")]
    pub max_body: usize,
    /// Largest prompt in bytes (all messages together).
    #[arg(long = "max-prompt-bytes", default_value_t = 1 << 20, env = "QUARREL_MAX_PROMPT_BYTES")]
    pub max_prompt: usize,
    /// Per-request time limit in seconds.
    #[arg(long = "timeout", default_value_t = 300, env = "QUARREL_TIMEOUT")]
    pub timeout: u64,
    /// Seconds a client has to send a request's headers, from the connection's start or the
    /// end of its previous response (so it also closes idle keep-alive connections).
    #[arg(long = "header-timeout", env = "QUARREL_HEADER_TIMEOUT", default_value_t = 30)]
    pub header_timeout: u64,
    /// Seconds a client has to send a whole request body; later: 408 and the connection closes.
    #[arg(long = "body-timeout", env = "QUARREL_BODY_TIMEOUT", default_value_t = 60)]
    pub body_timeout: u64,
    /// Most open connections (0 = three quarters of the open-files limit); beyond it new
    /// connections are closed at once.
    #[arg(long = "max-connections", env = "QUARREL_MAX_CONNECTIONS", default_value_t = 0)]
    pub max_connections: usize,
    /// Seconds in-flight requests may run after SIGTERM / Ctrl-C before they are ended.
    #[arg(long = "shutdown-timeout", env = "QUARREL_SHUTDOWN_TIMEOUT", default_value_t = 30)]
    pub shutdown_timeout: u64,
    /// Host names accepted in the Host header besides loopback ones, when bound to a loopback
    /// address (comma-separated or repeated; `*` turns the check off).
    #[arg(long = "allowed-hosts", env = "QUARREL_ALLOWED_HOSTS", value_delimiter = ',')]
    pub allowed_hosts: Vec<String>,
    /// Log prompts (they are redacted otherwise).
    #[arg(long = "log-prompts", env = "QUARREL_LOG_PROMPTS", value_parser = clap::builder::BoolishValueParser::new())]
    pub log_prompts: bool,
    /// Log format: json (default) or text.
    #[arg(long = "log-format", default_value = "json", env = "QUARREL_LOG_FORMAT")]
    pub log_format: String,
}

struct CliLoader {
    explicit: Vec<ModelEntry>,
    models_dir: Option<PathBuf>,
    args: ModelArgs,
    spec: SpecArgs,
    opts: ServiceOptions,
    kv_seqs: usize,
}

fn entry_for(path: &Path, given: Option<&str>) -> ModelEntry {
    let file = path.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
    let stem = file.strip_suffix(".gguf").unwrap_or(&file).to_string();
    let known = crate::cmd::pull::ENTRIES.iter().find(|e| e.file_name == file);
    let mut aliases = vec![stem.clone()];
    let name = match (given, known) {
        (Some(g), _) if !Path::new(g).exists() => g.to_string(),
        (_, Some(k)) => k.name.to_string(),
        _ => stem.to_ascii_lowercase(),
    };
    if let Some(k) = known {
        aliases.push(k.name.to_string());
        aliases.extend(k.aliases.iter().map(|a| a.to_string()));
    }
    if let Some(g) = given {
        aliases.push(g.to_string());
    }
    // a path given with -m is not a name: listing it would show the server's file system
    aliases.retain(|a| *a != name && !a.contains(['/', '\\']));
    aliases.dedup();
    let size_bytes = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    ModelEntry { name, aliases, path: path.to_path_buf(), size_bytes }
}

fn gguf_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|r| r.flatten().map(|e| e.path()).filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "gguf")).collect())
        .unwrap_or_default();
    v.sort();
    v
}

impl ModelLoader for CliLoader {
    fn catalog(&self) -> Vec<ModelEntry> {
        let mut out = self.explicit.clone();
        let mut dirs = vec![cache_dir()];
        dirs.extend(self.models_dir.clone());
        for d in dirs {
            for p in gguf_files(&d) {
                if !out.iter().any(|e| e.path == p) {
                    out.push(entry_for(&p, None));
                }
            }
        }
        out
    }

    fn load(&self, entry: &ModelEntry) -> Result<EngineHandle, String> {
        let mut args = self.args.clone();
        args.model.name = Some(entry.path.to_string_lossy().into_owned());
        let kv_seqs = self.kv_seqs;
        let engine = self.spec.load_with(&args, true, |o| o.n_seq = kv_seqs.max(1)).map_err(|e| {
            // the operator's log gets the path; clients get the file name only (they never
            // see where the server keeps its files)
            let full = format!("{e:#}");
            tracing::warn!(model = %entry.name, error = %full, "model load failed");
            let file = entry.path.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
            full.replace(&*entry.path.to_string_lossy(), &file)
        })?;
        let opts = self.opts.clone();
        Ok(crate::common::with_engine!(engine, e => { EngineHandle::spawn(e, opts) }))
    }
}

fn mem_total() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| t.lines().find(|l| l.starts_with("MemTotal:")).and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok()))
        .map_or(8 << 30, |kb| kb * 1024)
}

/// Three quarters of the open-files limit (raised to its hard maximum first), leaving the
/// rest for model files, logs and the connections accepted only to be closed.
fn default_max_connections() -> usize {
    #[cfg(unix)]
    {
        let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit / setrlimit only read and write the struct passed.
        unsafe {
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 {
                if r.rlim_cur < r.rlim_max {
                    let raised = libc::rlimit { rlim_cur: r.rlim_max.min(1 << 20), rlim_max: r.rlim_max };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                        r = raised;
                    }
                }
                return (r.rlim_cur as usize / 4 * 3).max(16);
            }
        }
    }
    768
}

fn init_logging(format: &str) -> Result<()> {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("QUARREL_LOG").unwrap_or_else(|_| EnvFilter::new("info,tower_http=info"));
    let b = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        "json" => b.json().with_current_span(true).with_span_list(false).init(),
        "text" => b.init(),
        f => bail!("unknown --log-format {f:?} (json or text)"),
    }
    Ok(())
}

pub fn main(a: Args) -> Result<()> {
    init_logging(&a.log_format)?;
    let rate = |n: u32| (n > 0).then(|| RateLimit { per_minute: n, burst: a.rate_burst.unwrap_or(n) });
    let config = ServerConfig {
        log_prompts: a.log_prompts,
        max_body_bytes: a.max_body,
        max_prompt_bytes: a.max_prompt,
        request_timeout: Duration::from_secs(a.timeout.max(1)),
        cors_origins: a.cors.clone(),
        rate_per_key: rate(a.rate_key),
        rate_per_ip: rate(a.rate_ip),
        header_timeout: Duration::from_secs(a.header_timeout.max(1)),
        body_timeout: Duration::from_secs(a.body_timeout.max(1)),
        max_connections: if a.max_connections > 0 { a.max_connections } else { default_max_connections() },
        shutdown_timeout: Duration::from_secs(a.shutdown_timeout),
        check_host: a.host.is_loopback(),
        allowed_hosts: a.allowed_hosts.clone(),
        ..Default::default()
    };
    // keys: required when the file is configured/exists, and on non-loopback addresses
    let keys_path = a.keys.clone().unwrap_or_else(|| cache_dir().parent().unwrap_or(Path::new(".")).join("keys.json"));
    let keys = if a.no_auth {
        None
    } else if a.keys.is_some() || keys_path.exists() {
        if !keys_path.exists() {
            eprintln!(
                "warning: keys file {} does not exist yet: every request needing a key is refused (401) until one is \
                 created with `quarrel keys create NAME --keys {}`",
                keys_path.display(),
                keys_path.display()
            );
        }
        let ks = KeyStore::open(&keys_path)?;
        Some(ks)
    } else if !a.host.is_loopback() {
        bail!(
            "binding to {} needs API keys: create one with `quarrel keys create NAME` (stored in {}), or pass --no-auth",
            a.host,
            keys_path.display()
        );
    } else {
        None
    };
    let mut explicit = vec![];
    let given: Vec<Option<String>> = if a.models.is_empty() { vec![None] } else { a.models.iter().cloned().map(Some).collect() };
    for g in &given {
        let p = resolve_model(g.as_deref(), true)?;
        let e = entry_for(&p, g.as_deref());
        if explicit.iter().any(|x: &ModelEntry| x.name == e.name) {
            bail!("two models are named {:?}", e.name);
        }
        explicit.push(e);
    }
    let opts = ServiceOptions {
        max_running: a.parallel.max(1),
        max_queue: a.queue,
        default_timeout: Some(config.request_timeout),
        prefix_cache: !a.no_prefix_cache,
        ..Default::default()
    };
    let loader = CliLoader {
        explicit: explicit.clone(),
        models_dir: a.models_dir.clone(),
        args: ModelArgs { model: ModelArg::default(), template: a.template.clone(), engine: a.engine.clone() },
        spec: a.spec.clone(),
        opts,
        kv_seqs: a.kv_seqs,
    };
    let budget = if a.memory_budget_mib > 0 { a.memory_budget_mib << 20 } else { mem_total() / 10 * 8 };
    let registry = Registry::new(Arc::new(loader), budget, !a.no_on_demand);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().worker_threads(2).build().context("starting tokio")?;
    rt.block_on(async move {
        for e in &explicit {
            registry.load(&e.name).await.map_err(|e| anyhow::anyhow!("{}", e.message))?;
        }
        let auth = keys.as_ref().map(|k| k.path().display().to_string());
        let state = AppState::new(config, registry, keys).context("metrics registry")?;
        let addr = std::net::SocketAddr::new(a.host, a.port);
        let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"))?;
        let local = listener.local_addr()?;
        tracing::info!(address = %local, keys = auth.as_deref().unwrap_or("none (loopback only)"), "quarrel serve listening");
        eprintln!("listening on http://{local}");
        let shutdown = async {
            #[cfg(unix)]
            {
                let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
                let t = async {
                    match term.as_mut() {
                        Some(t) => {
                            t.recv().await;
                        }
                        None => std::future::pending::<()>().await,
                    }
                };
                tokio::select! { _ = tokio::signal::ctrl_c() => {}, _ = t => {} }
            }
            #[cfg(not(unix))]
            let _ = tokio::signal::ctrl_c().await;
            tracing::info!("shutting down");
        };
        quarrel_server::serve(listener, state, shutdown).await.context("serving")
    })
}
