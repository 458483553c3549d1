//! Streaming DoPut with flow control and exactly-once resumption.
//!
//! ```text
//!  source (mpsc of RecordBatch) ─► pending (sent, unacknowledged; at most `window`) ─► DoPut stream
//!                                      ▲                                                 │
//!        PutResult per stored batch ───┴── ack: pop front, rows_acked += n ◄──────────────┘
//!        {"status":"slow_down"} ─► pause sending for backoff(n) (doubling while it repeats)
//!  transport error ─► reconnect ─► GetFlightInfo: rows stored by this upload
//!                      ─► drop that many rows from the front of `pending` (stored, ack lost)
//!                      ─► resend the rest on a new DoPut
//! ```
//!
//! Batches are stored whole and in order by a single DoPut, so after a failure the rows the
//! server holds for this upload are `acked + a prefix of pending`; the dataset's row count
//! (GetFlightInfo's `total_records`, minus what it held before the upload) says how long
//! that prefix is. Nothing acknowledged is resent and nothing in doubt is lost. This needs
//! the upload to be the dataset's only writer while it runs; a count outside
//! `acked ..= acked + in flight` is reported as `Reconcile` instead of guessed at.

use crate::client::LongbowClient;
use crate::error::{FlightClientError, Result};
use arrow_array::RecordBatch;
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::FlightDescriptor;
use arrow_schema::SchemaRef;
use futures::StreamExt;
use std::collections::VecDeque;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Exponential backoff: `initial * factor^(n-1)`, at most `max`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Backoff {
    pub initial: Duration,
    pub max: Duration,
    pub factor: f64,
}

impl Backoff {
    /// Delay before the `n`-th consecutive retry (n >= 1).
    pub fn delay(&self, n: u32) -> Duration {
        let f = self.factor.max(1.0).powi(n.saturating_sub(1).min(64) as i32);
        self.initial.mul_f64(f).min(self.max)
    }
}

#[derive(Clone, Debug)]
pub struct PutOptions {
    /// Most batches sent and not yet acknowledged (0: no limit, for servers that do not
    /// acknowledge batch by batch).
    pub window: usize,
    /// Pause after a `slow_down` PutResult.
    pub slow_down: Backoff,
    /// Pause before a reconnect.
    pub retry: Backoff,
    /// Consecutive failed attempts before giving up (progress resets the count).
    pub max_retries: u32,
    /// Larger batches are sent as zero-copy slices of about this size (gRPC servers refuse
    /// messages over 4 MiB by default).
    pub max_batch_bytes: usize,
}

impl Default for PutOptions {
    fn default() -> Self {
        PutOptions {
            window: 8,
            slow_down: Backoff { initial: Duration::from_millis(100), max: Duration::from_secs(5), factor: 2.0 },
            retry: Backoff { initial: Duration::from_millis(200), max: Duration::from_secs(10), factor: 2.0 },
            max_retries: 8,
            max_batch_bytes: 2 << 20,
        }
    }
}

/// Where an upload stands (passed to the progress callback after every change).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PutReport {
    pub rows_sent: u64,
    pub rows_acked: u64,
    pub batches_acked: u64,
    /// Rows found stored after a failure although their acknowledgement was lost.
    pub rows_reconciled: u64,
    /// Rows sent again after a failure (sent before, not stored).
    pub rows_resent: u64,
    pub slow_downs: u64,
    pub backoff: Duration,
    pub reconnects: u32,
}

enum Ack {
    Ok,
    SlowDown(String),
}

/// App metadata of a PutResult: Longbow's `{"status": "slow_down", "reason": ...}` or anything
/// else (an acknowledgement).
fn parse_ack(meta: &[u8]) -> Ack {
    match serde_json::from_slice::<serde_json::Value>(meta) {
        Ok(v) if v.get("status").and_then(|s| s.as_str()) == Some("slow_down") => {
            Ack::SlowDown(v.get("reason").and_then(|r| r.as_str()).unwrap_or("unspecified").to_string())
        }
        _ => Ack::Ok,
    }
}

struct Upload<'a> {
    dataset: &'a str,
    schema: SchemaRef,
    opts: &'a PutOptions,
    pending: VecDeque<RecordBatch>,
    source: mpsc::Receiver<RecordBatch>,
    source_done: bool,
    report: PutReport,
    /// Consecutive slow_down acknowledgements.
    slow_streak: u32,
    /// Rows the dataset held before this upload.
    baseline: i64,
}

impl LongbowClient {
    /// Stream the batches from `source` into `dataset` with DoPut (descriptor PATH
    /// [dataset]) until the channel closes; returns once every row is acknowledged.
    pub async fn put_stream(
        &mut self,
        dataset: &str,
        schema: SchemaRef,
        source: mpsc::Receiver<RecordBatch>,
        opts: &PutOptions,
        progress: &mut (dyn FnMut(&PutReport) + Send),
    ) -> Result<PutReport> {
        if dataset.is_empty() {
            return Err(FlightClientError::InvalidRows("empty dataset name".into()));
        }
        let baseline = self.total_records(dataset).await?.unwrap_or(0);
        let mut up = Upload {
            dataset,
            schema,
            opts,
            pending: VecDeque::new(),
            source,
            source_done: false,
            report: PutReport::default(),
            slow_streak: 0,
            baseline,
        };
        let mut failures = 0u32;
        loop {
            let acked_before = up.report.rows_acked;
            let err = match up.attempt(self, progress).await {
                Ok(()) => return Ok(up.report),
                Err(e) => e,
            };
            if up.report.rows_acked > acked_before {
                failures = 0;
            }
            if !err.is_transient() {
                return Err(err);
            }
            // reconnect, then find out what the broken call stored
            let mut last = err;
            loop {
                failures += 1;
                if failures > opts.max_retries {
                    return Err(FlightClientError::RetriesExhausted { attempts: failures, last: Box::new(last) });
                }
                tokio::time::sleep(opts.retry.delay(failures)).await;
                up.report.reconnects += 1;
                match self.reconnect().await {
                    Ok(()) => {}
                    Err(e) if e.is_transient() => {
                        last = e;
                        continue;
                    }
                    Err(e) => return Err(e),
                }
                match up.reconcile(self).await {
                    Ok(()) => break,
                    Err(e) if e.is_transient() => last = e,
                    Err(e) => return Err(e),
                }
            }
            progress(&up.report);
        }
    }

    /// [`put_stream`](Self::put_stream) over batches already in memory.
    pub async fn put_batches(
        &mut self,
        dataset: &str,
        batches: Vec<RecordBatch>,
        opts: &PutOptions,
        progress: &mut (dyn FnMut(&PutReport) + Send),
    ) -> Result<PutReport> {
        let schema = batches.first().map(|b| b.schema()).ok_or_else(|| FlightClientError::InvalidRows("no batches to put".into()))?;
        let (tx, rx) = mpsc::channel(batches.len().max(1));
        for b in batches {
            tx.send(b).await.expect("receiver alive");
        }
        drop(tx);
        self.put_stream(dataset, schema, rx, opts, progress).await
    }
}

impl Upload<'_> {
    fn can_send(&self, now: Instant, pause_until: Option<Instant>) -> bool {
        !self.source_done && (self.opts.window == 0 || self.pending.len() < self.opts.window) && pause_until.is_none_or(|t| now >= t)
    }

    /// One DoPut call: resend what is pending, then stream from the source.
    async fn attempt(&mut self, client: &LongbowClient, progress: &mut (dyn FnMut(&PutReport) + Send)) -> Result<()> {
        let (tx, rx) = futures::channel::mpsc::unbounded::<RecordBatch>();
        let data = FlightDataEncoderBuilder::new()
            .with_max_flight_data_size(usize::MAX) // one FlightData per batch: acks map 1:1
            .with_schema(self.schema.clone())
            .with_flight_descriptor(Some(FlightDescriptor::new_path(vec![self.dataset.to_string()])))
            .build(rx.map(Ok));
        for b in &self.pending {
            self.report.rows_resent += b.num_rows() as u64;
            tx.unbounded_send(b.clone()).expect("receiver alive");
        }
        let mut tx = Some(tx);
        let mut fc = client.data_client();
        let mut call = Box::pin(async move { fc.do_put(data).await });
        let mut results: Option<
            futures::stream::BoxStream<'static, std::result::Result<arrow_flight::PutResult, arrow_flight::error::FlightError>>,
        > = None;
        let mut pause_until: Option<Instant> = None;
        loop {
            if self.source_done && tx.is_some() {
                tx = None; // end of the request stream: the server finishes the call
            }
            let now = Instant::now();
            let send_ok = tx.is_some() && self.can_send(now, pause_until);
            let paused = tx.is_some() && !self.source_done && pause_until.is_some_and(|t| now < t);
            let wake = pause_until.unwrap_or(now);
            tokio::select! {
                r = &mut call, if results.is_none() => {
                    results = Some(r.map_err(|e| FlightClientError::rpc("DoPut", e))?);
                }
                r = async { results.as_mut().expect("guarded").next().await }, if results.is_some() => match r {
                    Some(Ok(put)) => {
                        let b = self.pending.pop_front().ok_or_else(|| FlightClientError::Protocol {
                            op: "DoPut",
                            reason: "more PutResults than batches sent".into(),
                        })?;
                        self.report.rows_acked += b.num_rows() as u64;
                        self.report.batches_acked += 1;
                        match parse_ack(&put.app_metadata) {
                            Ack::SlowDown(_reason) => {
                                self.slow_streak += 1;
                                self.report.slow_downs += 1;
                                let d = self.opts.slow_down.delay(self.slow_streak);
                                self.report.backoff += d;
                                pause_until = Some(Instant::now() + d);
                            }
                            Ack::Ok => self.slow_streak = 0,
                        }
                        progress(&self.report);
                    }
                    Some(Err(e)) => return Err(FlightClientError::rpc("DoPut", e)),
                    None if tx.is_none() => {
                        // the call completed: the server accepted every batch of the stream
                        while let Some(b) = self.pending.pop_front() {
                            self.report.rows_acked += b.num_rows() as u64;
                            self.report.batches_acked += 1;
                        }
                        progress(&self.report);
                        return Ok(());
                    }
                    None => {
                        return Err(FlightClientError::Protocol { op: "DoPut", reason: "the server's stream ended before the upload".into() })
                    }
                },
                b = self.source.recv(), if send_ok => match b {
                    Some(b) if b.num_rows() == 0 => {}
                    Some(b) => {
                        if b.schema() != self.schema {
                            return Err(FlightClientError::InvalidRows(format!("batch schema {} differs from the upload's {}", b.schema(), self.schema)));
                        }
                        for piece in pieces(&b, self.opts.max_batch_bytes) {
                            self.report.rows_sent += piece.num_rows() as u64;
                            self.pending.push_back(piece.clone());
                            if let Some(t) = &tx {
                                // a closed receiver means the call failed; its error arrives on `results`
                                let _ = t.unbounded_send(piece);
                            }
                        }
                    }
                    None => self.source_done = true,
                },
                _ = tokio::time::sleep_until(wake.into()), if paused => {
                    pause_until = None;
                }
            }
        }
    }

    /// After a failed call: rows of this upload the server stored although unacknowledged
    /// are taken off the front of `pending`.
    async fn reconcile(&mut self, client: &LongbowClient) -> Result<()> {
        let in_doubt: u64 = self.pending.iter().map(|b| b.num_rows() as u64).sum();
        if in_doubt == 0 {
            return Ok(());
        }
        let stored = client.total_records(self.dataset).await?.unwrap_or(0) - self.baseline;
        let acked = self.report.rows_acked;
        if stored < acked as i64 || stored as u64 > acked + in_doubt {
            return Err(FlightClientError::Reconcile { dataset: self.dataset.into(), stored, acked, in_doubt });
        }
        let mut skip = stored as u64 - acked;
        while skip > 0 {
            let front = self.pending.pop_front().expect("skip <= rows pending");
            let n = front.num_rows() as u64;
            let take = n.min(skip);
            self.report.rows_acked += take;
            self.report.rows_reconciled += take;
            // the sent count is re-added when the remainder is resent
            if take < n {
                self.pending.push_front(front.slice(take as usize, (n - take) as usize));
            } else {
                self.report.batches_acked += 1;
            }
            skip -= take;
        }
        Ok(())
    }
}

/// `b` as zero-copy slices of at most about `max_bytes` each.
fn pieces(b: &RecordBatch, max_bytes: usize) -> Vec<RecordBatch> {
    let rows = b.num_rows().max(1);
    // buffers of a slice may be shared with rows outside it: an over-estimate, so pieces stay small
    let per_row = b.get_array_memory_size().div_ceil(rows).max(1);
    crate::batch::split(b, (max_bytes / per_row).max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn big_batches_go_in_pieces() {
        let rows = crate::EmbeddingRows {
            ids: (0..100).map(|i| i.to_string()).collect(),
            dim: 256,
            vectors: vec![0.5; 25600],
            ..Default::default()
        };
        let b = rows.into_record_batch().unwrap();
        let p = pieces(&b, 16 << 10);
        assert!(p.len() >= 7, "{} pieces", p.len());
        assert_eq!(p.iter().map(|x| x.num_rows()).sum::<usize>(), 100);
        assert!(p.iter().all(|x| x.num_rows() * 256 * 4 <= 16 << 10));
        assert_eq!(pieces(&b, 64 << 20).len(), 1);
    }

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let b = Backoff { initial: Duration::from_millis(100), max: Duration::from_millis(500), factor: 2.0 };
        assert_eq!(b.delay(1), Duration::from_millis(100));
        assert_eq!(b.delay(2), Duration::from_millis(200));
        assert_eq!(b.delay(3), Duration::from_millis(400));
        assert_eq!(b.delay(4), Duration::from_millis(500));
        assert_eq!(b.delay(1000), Duration::from_millis(500));
    }

    #[test]
    fn acks_are_parsed() {
        assert!(matches!(parse_ack(br#"{"status": "slow_down", "reason": "wal_pressure"}"#), Ack::SlowDown(r) if r == "wal_pressure"));
        assert!(matches!(parse_ack(br#"{"status": "ok", "rows": 3}"#), Ack::Ok));
        assert!(matches!(parse_ack(b""), Ack::Ok));
    }
}
