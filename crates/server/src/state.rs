//! Server configuration and the state every handler shares.

use crate::auth::KeyStore;
use crate::metrics::Metrics;
use crate::registry::Registry;
use governor::{clock::DefaultClock, state::keyed::DefaultKeyedStateStore, Quota, RateLimiter};
use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Requests per minute with a burst allowance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateLimit {
    pub per_minute: u32,
    pub burst: u32,
}

#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Log prompts (otherwise they are never logged).
    pub log_prompts: bool,
    /// Largest request body.
    pub max_body_bytes: usize,
    /// Largest prompt text (bytes, all messages together).
    pub max_prompt_bytes: usize,
    pub request_timeout: Duration,
    /// Allowed CORS origins (`*` for any); empty = no CORS headers.
    pub cors_origins: Vec<String>,
    /// Per API key; on a server without keys, per client IP.
    pub rate_per_key: Option<RateLimit>,
    pub rate_per_ip: Option<RateLimit>,
    /// WebSocket ping interval; a peer silent for three intervals is dropped.
    pub ws_ping: Duration,
    /// Time a client has to send a request's headers, counted from the connection's start or
    /// the end of its previous response (so it also closes idle keep-alive connections).
    pub header_timeout: Duration,
    /// Time a client has to send a whole request body (408 and the connection closes after it).
    pub body_timeout: Duration,
    /// Most open connections; beyond it new connections are closed as soon as accepted.
    pub max_connections: usize,
    /// After the shutdown signal: how long in-flight requests may still run.
    pub shutdown_timeout: Duration,
    /// Refuse (403) requests whose `Host` is not a loopback name or address, nor in
    /// `allowed_hosts`: on a loopback server this stops DNS rebinding from web pages.
    pub check_host: bool,
    /// Extra `Host` names accepted when `check_host` is on (without port).
    pub allowed_hosts: Vec<String>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            log_prompts: false,
            max_body_bytes: 4 << 20,
            max_prompt_bytes: 1 << 20,
            request_timeout: Duration::from_secs(300),
            cors_origins: vec![],
            rate_per_key: None,
            rate_per_ip: None,
            ws_ping: Duration::from_secs(20),
            header_timeout: Duration::from_secs(30),
            body_timeout: Duration::from_secs(60),
            max_connections: 1024,
            shutdown_timeout: Duration::from_secs(30),
            check_host: false,
            allowed_hosts: vec![],
        }
    }
}

pub type Limiter = RateLimiter<String, DefaultKeyedStateStore<String>, DefaultClock>;

fn limiter(r: Option<RateLimit>) -> Option<Limiter> {
    let r = r?;
    let per_minute = NonZeroU32::new(r.per_minute)?;
    let burst = NonZeroU32::new(r.burst.max(1))?;
    Some(RateLimiter::keyed(Quota::per_minute(per_minute).allow_burst(burst)))
}

pub struct Inner {
    pub config: ServerConfig,
    pub registry: Registry,
    pub metrics: Metrics,
    /// `Some` when API keys are required.
    pub keys: Option<KeyStore>,
    pub key_limiter: Option<Limiter>,
    pub ip_limiter: Option<Limiter>,
    pub started: Instant,
    /// Per model: the engine's step counter when last seen changing, and when.
    progress: Mutex<HashMap<String, (u64, Instant)>>,
}

/// Shared by every handler (cheap to clone).
#[derive(Clone)]
pub struct AppState(pub Arc<Inner>);

impl std::ops::Deref for AppState {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.0
    }
}

impl AppState {
    pub fn new(config: ServerConfig, registry: Registry, keys: Option<KeyStore>) -> Result<AppState, prometheus::Error> {
        Ok(AppState(Arc::new(Inner {
            key_limiter: limiter(config.rate_per_key),
            ip_limiter: limiter(config.rate_per_ip),
            config,
            registry,
            metrics: Metrics::new()?,
            keys,
            started: Instant::now(),
            progress: Mutex::new(HashMap::new()),
        })))
    }

    /// `Err(seconds to wait)` when `key` is over its limit.
    pub fn check_rate(limiter: &Option<Limiter>, key: &str) -> Result<(), u64> {
        let Some(l) = limiter else { return Ok(()) };
        l.check_key(&key.to_string()).map_err(|not_until| {
            use governor::clock::Clock;
            let wait = not_until.wait_time_from(DefaultClock::default().now());
            wait.as_secs() + u64::from(wait.subsec_nanos() > 0)
        })
    }

    /// Is this model's engine making progress? Idle counts as yes; with work waiting or
    /// running, its step counter must have moved within the last 30 s.
    pub fn stepping(&self, m: &crate::registry::Loaded) -> bool {
        let e = m.handle.metrics();
        let Ok(mut p) = self.progress.lock() else { return false };
        let now = Instant::now();
        let slot = p.entry(m.entry.name.clone()).or_insert((e.steps_total, now));
        if e.steps_total != slot.0 || (e.running == 0 && e.queue_depth == 0 && e.embeddings == 0) {
            *slot = (e.steps_total, now);
            return true;
        }
        now.duration_since(slot.1) < Duration::from_secs(30)
    }
}
