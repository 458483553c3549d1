//! Prometheus metrics: HTTP requests by route/model/status, errors by type, live HTTP and
//! WebSocket connections, latency histograms (request, time to first token, inter-token,
//! end-to-end generation, queue time), prompt and generation length histograms, tokens in/out, and the engines' gauges (queue depth, batch size, KV usage) read from each
//! loaded model's `EngineHandle::metrics()` at scrape time; for MoE and hybrid models also the
//! expert selection counts and utilization per layer, routing / SSM conv / scan time, recurrent
//! state bytes and the SSM non-finite counter.

use crate::registry::{kv_bytes, Registry};
use prometheus::{
    Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry as PromRegistry, TextEncoder,
};

pub struct Metrics {
    registry: PromRegistry,
    pub requests: IntCounterVec,
    pub errors: IntCounterVec,
    pub http_active: IntGauge,
    pub http_connections: IntGauge,
    pub ws_active: IntGauge,
    pub request_seconds: HistogramVec,
    pub ttft_seconds: HistogramVec,
    pub itl_seconds: HistogramVec,
    pub e2e_seconds: HistogramVec,
    pub queue_seconds: HistogramVec,
    pub prompt_len: HistogramVec,
    pub gen_len: HistogramVec,
    pub tokens_in: IntCounterVec,
    pub tokens_out: IntCounterVec,
    /// Embedding and rerank requests: arrival to answer, and the texts they carried.
    pub embed_seconds: HistogramVec,
    pub embed_texts: IntCounterVec,
    engine: IntGaugeVec,
    engine_counters: IntGaugeVec,
    models_loaded: IntGauge,
    model_bytes: IntGaugeVec,
    op_seconds: GaugeVec,
    expert_selections: IntGaugeVec,
    expert_utilization: GaugeVec,
}

/// The model label of a response (set by handlers, read by the metrics middleware).
#[derive(Clone, Debug)]
pub struct ModelLabel(pub String);

/// Token-count buckets for prompt and generation lengths: powers of two up to 128K.
fn length_buckets() -> Vec<f64> {
    (0..=17).map(|i| (1u64 << i) as f64).collect()
}

fn buckets() -> Vec<f64> {
    vec![0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0]
}

impl Metrics {
    pub fn new() -> Result<Metrics, prometheus::Error> {
        let r = PromRegistry::new_custom(Some("quarrel".into()), None)?;
        let requests = IntCounterVec::new(
            Opts::new("http_requests_total", "HTTP requests by route, model and status"),
            &["route", "model", "status"],
        )?;
        let errors = IntCounterVec::new(Opts::new("errors_total", "Errors answered, by error code"), &["type"])?;
        let http_active = IntGauge::new("http_requests_active", "HTTP requests in flight (streams included)")?;
        let http_connections = IntGauge::new("http_connections_active", "Open HTTP connections (TCP)")?;
        let ws_active = IntGauge::new("ws_connections_active", "Open WebSocket connections")?;
        let request_seconds = HistogramVec::new(
            HistogramOpts::new("request_duration_seconds", "Request latency (whole response)").buckets(buckets()),
            &["route"],
        )?;
        let ttft_seconds = HistogramVec::new(
            HistogramOpts::new("time_to_first_token_seconds", "Submission to first token").buckets(buckets()),
            &["model"],
        )?;
        let itl_seconds = HistogramVec::new(
            HistogramOpts::new("inter_token_latency_seconds", "Time between consecutive tokens of a stream")
                .buckets(vec![0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5]),
            &["model"],
        )?;
        let e2e_seconds = HistogramVec::new(
            HistogramOpts::new("e2e_request_latency_seconds", "Generation requests: submission to the last token").buckets(buckets()),
            &["model"],
        )?;
        let embed_seconds = HistogramVec::new(
            HistogramOpts::new("embedding_request_seconds", "Embedding and rerank requests: arrival to answer").buckets(buckets()),
            &["model", "route"],
        )?;
        let embed_texts = IntCounterVec::new(
            Opts::new("embedding_texts_total", "Texts (documents, for rerank) embedded or scored"),
            &["model", "route"],
        )?;
        let queue_seconds = HistogramVec::new(
            HistogramOpts::new("request_queue_time_seconds", "Generation requests: submission to the first scheduled step")
                .buckets(vec![0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0]),
            &["model"],
        )?;
        let prompt_len = HistogramVec::new(
            HistogramOpts::new("request_prompt_tokens", "Prompt length of finished generation requests, in tokens")
                .buckets(length_buckets()),
            &["model"],
        )?;
        let gen_len = HistogramVec::new(
            HistogramOpts::new("request_generation_tokens", "Generated length of finished requests, in tokens").buckets(length_buckets()),
            &["model"],
        )?;
        let tokens_in = IntCounterVec::new(Opts::new("prompt_tokens_total", "Prompt tokens of finished requests"), &["model"])?;
        let tokens_out = IntCounterVec::new(Opts::new("generated_tokens_total", "Generated tokens"), &["model"])?;
        let engine = IntGaugeVec::new(Opts::new("engine", "Engine gauges: queue_depth, running, embeddings, batch_tokens, kv_blocks_used, kv_blocks_free, kv_blocks_total, kv_blocks_cached, kv_block_size, recurrent_state_bytes, state_checkpoints"), &["model", "gauge"])?;
        let engine_counters = IntGaugeVec::new(Opts::new("engine_counter", "Engine counters since load: steps, preemptions, prefix_hit_tokens, requests_finished, embed_requests_finished, embedded_tokens, embed_forwards, embed_forward_texts, prompt_tokens, generated_tokens, ssm_nonfinite, spec_drafted, spec_accepted, spec_steps"), &["model", "counter"])?;
        let models_loaded = IntGauge::new("models_loaded", "Models loaded")?;
        let model_bytes =
            IntGaugeVec::new(Opts::new("model_memory_bytes", "Resident bytes per loaded model (weights + KV cache)"), &["model"])?;
        let op_seconds = GaugeVec::new(
            Opts::new("engine_op_seconds", "Host wall time since load (monotonic) in MoE routing and Mamba2 conv / scan"),
            &["model", "op"],
        )?;
        let expert_selections = IntGaugeVec::new(
            Opts::new("expert_selections", "MoE models: tokens routed to each expert since load"),
            &["model", "layer", "expert"],
        )?;
        let expert_utilization = GaugeVec::new(
            Opts::new("expert_utilization", "MoE models: an expert's share of its layer's selections since load (0..1)"),
            &["model", "layer", "expert"],
        )?;
        // the queue-full alert takes increase() of this series: it must exist at 0 before the
        // first refusal, or that refusal is the series' first sample and increase() misses it
        errors.with_label_values(&["overloaded"]).inc_by(0);
        for c in [&requests, &errors, &tokens_in, &tokens_out, &embed_texts] {
            r.register(Box::new(c.clone()))?;
        }
        for h in [&request_seconds, &ttft_seconds, &itl_seconds, &e2e_seconds, &queue_seconds, &prompt_len, &gen_len, &embed_seconds] {
            r.register(Box::new(h.clone()))?;
        }
        for g in [&http_active, &http_connections, &ws_active, &models_loaded] {
            r.register(Box::new(g.clone()))?;
        }
        for g in [&engine, &engine_counters, &model_bytes, &expert_selections] {
            r.register(Box::new(g.clone()))?;
        }
        for g in [&op_seconds, &expert_utilization] {
            r.register(Box::new(g.clone()))?;
        }
        Ok(Metrics {
            registry: r,
            requests,
            errors,
            http_active,
            http_connections,
            ws_active,
            request_seconds,
            ttft_seconds,
            itl_seconds,
            e2e_seconds,
            queue_seconds,
            prompt_len,
            gen_len,
            tokens_in,
            tokens_out,
            embed_seconds,
            embed_texts,
            engine,
            engine_counters,
            models_loaded,
            model_bytes,
            op_seconds,
            expert_selections,
            expert_utilization,
        })
    }

    /// The text exposition, with the engine gauges refreshed.
    pub fn render(&self, reg: &Registry) -> String {
        self.engine.reset();
        self.engine_counters.reset();
        self.model_bytes.reset();
        self.op_seconds.reset();
        self.expert_selections.reset();
        self.expert_utilization.reset();
        let loaded = reg.loaded();
        self.models_loaded.set(loaded.len() as i64);
        for m in &loaded {
            let name = m.entry.name.as_str();
            let e = m.handle.metrics();
            for (k, v) in [
                ("queue_depth", e.queue_depth),
                ("running", e.running),
                ("embeddings", e.embeddings),
                ("batch_tokens", e.last_batch_tokens),
                ("kv_blocks_used", e.kv_blocks_used),
                ("kv_blocks_free", e.kv_blocks_free),
                ("kv_blocks_total", e.kv_blocks_total),
                ("kv_blocks_cached", e.kv_blocks_cached),
                ("kv_block_size", e.kv_block_size),
                ("recurrent_state_bytes", e.recurrent_state_bytes as usize),
                ("state_checkpoints", e.state_checkpoints),
            ] {
                self.engine.with_label_values(&[name, k]).set(v as i64);
            }
            for (k, v) in [
                ("steps", e.steps_total),
                ("preemptions", e.preemptions_total),
                ("prefix_hit_tokens", e.prefix_hit_tokens_total),
                ("requests_finished", e.requests_finished_total),
                ("embed_requests_finished", e.embed_requests_finished_total),
                ("embedded_tokens", e.embedded_tokens_total),
                ("embed_forwards", e.embed_forwards_total),
                ("embed_forward_texts", e.embed_forward_texts_total),
                ("prompt_tokens", e.prompt_tokens_total),
                ("generated_tokens", e.generated_tokens_total),
                ("spec_drafted", e.spec_drafted_total),
                ("spec_accepted", e.spec_accepted_total),
                ("spec_steps", e.spec_steps_total),
                ("ssm_nonfinite", e.ssm_nonfinite_total),
            ] {
                self.engine_counters.with_label_values(&[name, k]).set(v as i64);
            }
            for (k, v) in [
                ("moe_routing", e.moe_routing_seconds_total),
                ("ssm_conv", e.ssm_conv_seconds_total),
                ("ssm_scan", e.ssm_scan_seconds_total),
            ] {
                self.op_seconds.with_label_values(&[name, k]).set(v);
            }
            for (layer, row) in e.expert_selections.iter().enumerate() {
                let sum: u64 = row.iter().sum();
                let l = layer.to_string();
                for (x, &n) in row.iter().enumerate() {
                    let x = x.to_string();
                    self.expert_selections.with_label_values(&[name, &l, &x]).set(n as i64);
                    self.expert_utilization.with_label_values(&[name, &l, &x]).set(if sum > 0 { n as f64 / sum as f64 } else { 0.0 });
                }
            }
            self.model_bytes.with_label_values(&[name]).set((m.entry.size_bytes + kv_bytes(m.info(), &m.handle)) as i64);
        }
        let mut buf = vec![];
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut buf) {
            tracing::warn!("encoding metrics: {e}");
        }
        String::from_utf8(buf).unwrap_or_default()
    }
}
