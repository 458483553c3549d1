//! What one load-test run measured: the per-request [`Sample`]s and their aggregate, the
//! [`Report`] (percentiles by nearest rank, counts, rates), with its table for people and its
//! `Serialize` form for `--json`.

use crate::{LoadConfig, Protocol};
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Duration;

/// One request's outcome.
#[derive(Clone, Debug, Default)]
pub(crate) struct Sample {
    /// The stream ended properly (see the crate doc).
    pub complete: bool,
    pub error: Option<String>,
    /// From the first attempt's start to the first token event.
    pub ttft: Option<Duration>,
    /// From the first attempt's start to the end of the stream (or the error).
    pub e2e: Duration,
    pub tokens: usize,
    /// Milliseconds between successive token events of the stream.
    pub gaps_ms: Vec<f64>,
    /// 1 when the request was sent again on a new connection after the connection it went out
    /// on closed before its response began.
    pub retries: usize,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Percentiles {
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub mean_ms: f64,
    pub max_ms: f64,
}

/// Nearest-rank percentiles (the smallest value with at least q of the values at or below it),
/// so every figure is a measured value; all zero for no values.
pub(crate) fn percentiles(mut v: Vec<f64>) -> Percentiles {
    if v.is_empty() {
        return Percentiles::default();
    }
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
    Percentiles {
        p50_ms: at(0.50),
        p95_ms: at(0.95),
        p99_ms: at(0.99),
        mean_ms: v.iter().sum::<f64>() / v.len() as f64,
        max_ms: v[v.len() - 1],
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub url: String,
    pub protocol: Protocol,
    pub clients: usize,
    pub wall_s: f64,
    pub requests: usize,
    pub complete: usize,
    pub errors: usize,
    pub incomplete: usize,
    /// Requests sent a second time, on a new connection, because the kept-alive connection they
    /// went out on closed before their response began; such a request counts once in
    /// `requests`, and as an error only when the second attempt failed too.
    pub retries: usize,
    pub errors_by_kind: BTreeMap<String, usize>,
    pub requests_per_s: f64,
    pub generated_tokens: usize,
    pub generated_tokens_per_s: f64,
    /// Time to first token, over every request that streamed one.
    pub ttft: Percentiles,
    /// Inter-token latency: the gaps between successive token events, over all requests.
    pub itl: Percentiles,
    /// End to end, over the complete requests.
    pub e2e: Percentiles,
}

impl Report {
    pub(crate) fn from_samples(cfg: &LoadConfig, samples: &[Sample], wall_s: f64) -> Report {
        let mut errors_by_kind = BTreeMap::new();
        for e in samples.iter().filter_map(|s| s.error.as_ref()) {
            *errors_by_kind.entry(e.clone()).or_insert(0) += 1;
        }
        let errors = samples.iter().filter(|s| s.error.is_some()).count();
        let complete = samples.iter().filter(|s| s.complete).count();
        let generated: usize = samples.iter().map(|s| s.tokens).sum();
        // no requests in no time is 0/s, not NaN
        let per_s = |n: usize| if wall_s > 0.0 { n as f64 / wall_s } else { 0.0 };
        Report {
            url: cfg.url.clone(),
            protocol: cfg.protocol,
            clients: cfg.clients,
            wall_s,
            requests: samples.len(),
            complete,
            errors,
            incomplete: samples.len() - complete - errors,
            retries: samples.iter().map(|s| s.retries).sum(),
            errors_by_kind,
            requests_per_s: per_s(complete),
            generated_tokens: generated,
            generated_tokens_per_s: per_s(generated),
            ttft: percentiles(samples.iter().filter_map(|s| s.ttft).map(ms).collect()),
            itl: percentiles(samples.iter().flat_map(|s| s.gaps_ms.iter().copied()).collect()),
            e2e: percentiles(samples.iter().filter(|s| s.complete).map(|s| ms(s.e2e)).collect()),
        }
    }

    pub fn table(&self) -> String {
        let mut s = format!("load test of {} ({:?}), {} clients\n\n", self.url, self.protocol, self.clients);
        s += "| wall s | requests | complete | errors | incomplete | retries | requests/s | generated tokens | tokens/s |\n";
        s += "|---|---|---|---|---|---|---|---|---|\n";
        s += &format!(
            "| {:.1} | {} | {} | {} | {} | {} | {:.2} | {} | {:.1} |\n",
            self.wall_s,
            self.requests,
            self.complete,
            self.errors,
            self.incomplete,
            self.retries,
            self.requests_per_s,
            self.generated_tokens,
            self.generated_tokens_per_s
        );
        s += "\n| latency (ms) | p50 | p95 | p99 | mean | max |\n|---|---|---|---|---|---|\n";
        for (name, p) in [("time to first token", &self.ttft), ("inter-token", &self.itl), ("end to end", &self.e2e)] {
            s += &format!("| {name} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |\n", p.p50_ms, p.p95_ms, p.p99_ms, p.mean_ms, p.max_ms);
        }
        for (k, n) in &self.errors_by_kind {
            s += &format!("\nerror {k}: {n}");
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> LoadConfig {
        LoadConfig { clients: 4, ..Default::default() }
    }

    #[test]
    fn nearest_rank_percentiles() {
        let p = percentiles((1..=100).map(f64::from).collect());
        assert_eq!((p.p50_ms, p.p95_ms, p.p99_ms, p.max_ms), (50.0, 95.0, 99.0, 100.0));
        assert_eq!(p.mean_ms, 50.5);
        assert_eq!(percentiles(vec![7.0]).p99_ms, 7.0);
        assert_eq!(percentiles(vec![]), Percentiles::default());
    }

    #[test]
    fn percentiles_do_not_depend_on_order() {
        let p = percentiles(vec![5.0, 1.0, 4.0, 2.0, 3.0]);
        assert_eq!((p.p50_ms, p.p95_ms, p.p99_ms, p.max_ms, p.mean_ms), (3.0, 5.0, 5.0, 5.0, 3.0));
        // ten values: p95 and p99 are both the largest (ranks 9.5 and 9.9 round up to 10)
        let p = percentiles((1..=10).rev().map(f64::from).collect());
        assert_eq!((p.p50_ms, p.p95_ms, p.p99_ms), (5.0, 10.0, 10.0));
    }

    #[test]
    fn aggregation_counts_and_pools_the_samples() {
        let ok = |ttft: u64, e2e: u64, gaps: &[f64], retries| Sample {
            complete: true,
            ttft: Some(Duration::from_millis(ttft)),
            e2e: Duration::from_millis(e2e),
            tokens: gaps.len() + 1,
            gaps_ms: gaps.to_vec(),
            retries,
            ..Default::default()
        };
        let samples = vec![
            ok(10, 100, &[1.0, 2.0], 0),
            ok(20, 200, &[3.0], 1),
            // failed after streaming: its TTFT and gaps are measurements, its end-to-end time is not
            Sample {
                error: Some("stream: reset".into()),
                ttft: Some(Duration::from_millis(30)),
                e2e: Duration::from_millis(5000),
                tokens: 2,
                gaps_ms: vec![4.0],
                ..Default::default()
            },
            Sample { error: Some("HTTP 500".into()), retries: 1, ..Default::default() },
            Sample { error: Some("HTTP 500".into()), ..Default::default() },
            // ended without its final event
            Sample { tokens: 1, ttft: Some(Duration::from_millis(40)), ..Default::default() },
        ];
        let r = Report::from_samples(&cfg(), &samples, 2.0);
        assert_eq!((r.requests, r.complete, r.errors, r.incomplete, r.retries), (6, 2, 3, 1, 2));
        assert_eq!(r.errors_by_kind, BTreeMap::from([("HTTP 500".to_string(), 2), ("stream: reset".to_string(), 1)]));
        assert_eq!((r.generated_tokens, r.generated_tokens_per_s, r.requests_per_s), (3 + 2 + 2 + 1, 4.0, 1.0));
        assert_eq!((r.ttft.p50_ms, r.ttft.max_ms), (20.0, 40.0));
        assert_eq!((r.itl.p50_ms, r.itl.max_ms, r.itl.mean_ms), (2.0, 4.0, 2.5));
        assert_eq!((r.e2e.p50_ms, r.e2e.max_ms), (100.0, 200.0));
        let t = r.table();
        assert!(t.contains("| 2.0 | 6 | 2 | 3 | 1 | 2 |"), "{t}");
        assert!(t.contains("| inter-token | 2.0 |"), "{t}");
    }

    #[test]
    fn no_requests_give_zero_rates_not_nan() {
        let r = Report::from_samples(&cfg(), &[], 0.0);
        assert_eq!((r.requests_per_s, r.generated_tokens_per_s), (0.0, 0.0));
    }
}
