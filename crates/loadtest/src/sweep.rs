//! A sweep: the same load test at several client counts in turn, to find where a server's
//! throughput stops growing and its latency starts to; one [`Report`] per point, a table row
//! per point, JSON and (in [`crate::plot`]) an SVG plot.

use crate::{run, LoadConfig, LoadError, Protocol, Report};
use serde::Serialize;
use std::time::Duration;

#[derive(Clone, Debug, Serialize)]
pub struct Sweep {
    pub url: String,
    pub protocol: Protocol,
    /// One report per client count, in the order they ran.
    pub points: Vec<Report>,
}

/// Run `cfg` at each of `clients` in turn (its own `clients` is not used), pausing `pause`
/// between points so that the requests of one point are gone from the server before the next
/// starts; `on_point` sees each report as it is made.
pub async fn sweep(cfg: LoadConfig, clients: &[usize], pause: Duration, mut on_point: impl FnMut(&Report)) -> Result<Sweep, LoadError> {
    if clients.is_empty() || clients.contains(&0) {
        return Err(LoadError::Config("the sweep's client counts must be positive, at least one".into()));
    }
    let mut points = vec![];
    for (i, &c) in clients.iter().enumerate() {
        if i > 0 && !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
        let r = run(LoadConfig { clients: c, ..cfg.clone() }).await?;
        on_point(&r);
        points.push(r);
    }
    Ok(Sweep { url: cfg.url, protocol: cfg.protocol, points })
}

impl Sweep {
    /// The table's title and column heads, printed before the first point has run.
    pub fn header(url: &str, protocol: Protocol) -> String {
        let mut s = format!("load test sweep of {url} ({protocol:?})\n\n");
        s += "| clients | requests | tokens/s | TTFT p50 | TTFT p95 | TTFT p99 | ITL p50 | ITL p95 | ITL p99 | e2e p50 | e2e p99 | errors | retries |\n";
        s += "|---|---|---|---|---|---|---|---|---|---|---|---|---|";
        s
    }

    /// One point's row (latencies in milliseconds).
    pub fn row(r: &Report) -> String {
        format!(
            "| {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2} | {:.2} | {:.2} | {:.0} | {:.0} | {} | {} |",
            r.clients,
            r.requests,
            r.generated_tokens_per_s,
            r.ttft.p50_ms,
            r.ttft.p95_ms,
            r.ttft.p99_ms,
            r.itl.p50_ms,
            r.itl.p95_ms,
            r.itl.p99_ms,
            r.e2e.p50_ms,
            r.e2e.p99_ms,
            r.errors,
            r.retries
        )
    }

    pub fn table(&self) -> String {
        let mut s = Sweep::header(&self.url, self.protocol);
        for r in &self.points {
            s += "\n";
            s += &Sweep::row(r);
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn refuses_empty_and_zero_points() {
        let cfg = LoadConfig { requests: Some(1), ..Default::default() };
        for points in [&[][..], &[4, 0][..]] {
            assert!(matches!(sweep(cfg.clone(), points, Duration::ZERO, |_| {}).await, Err(LoadError::Config(_))));
        }
    }

    #[test]
    fn table_has_a_row_per_point() {
        use crate::report::Sample;
        let sample = |gap: f64| Sample {
            complete: true,
            ttft: Some(Duration::from_millis(12)),
            e2e: Duration::from_millis(300),
            tokens: 3,
            gaps_ms: vec![gap, gap],
            ..Default::default()
        };
        let points = [(16, 1.5), (64, 4.25)]
            .map(|(c, gap)| Report::from_samples(&LoadConfig { clients: c, ..Default::default() }, &[sample(gap)], 1.0));
        let s = Sweep { url: "http://h".into(), protocol: Protocol::Sse, points: points.to_vec() };
        let t = s.table();
        let lines: Vec<&str> = t.lines().filter(|l| l.starts_with('|')).collect();
        assert_eq!(lines.len(), 4, "{t}");
        assert_eq!(lines[2], "| 16 | 1 | 3.0 | 12.0 | 12.0 | 12.0 | 1.50 | 1.50 | 1.50 | 300 | 300 | 0 | 0 |");
        assert!(lines[3].starts_with("| 64 | 1 | 3.0 | 12.0 | 12.0 | 12.0 | 4.25 |"), "{t}");
        assert_eq!(lines[0].matches('|').count(), lines[2].matches('|').count());
    }
}
