//! The Flight client against the pyarrow Longbow peer (tests/flight_peer.py) on loopback:
//! round trip, k-NN, slow_down backoff, a dropped connection without lost or duplicated rows.
//! Vectors here are synthetic; the engine end-to-end test lives in the CLI's tests.

use quarrel_flight::peer::TestPeer;
use quarrel_flight::{split, Backoff, EmbeddingRows, LongbowClient, PutOptions, PutReport};
use serde_json::Value;
use std::time::Duration;

fn rows(n: usize, dim: usize, seed: u32) -> EmbeddingRows {
    let vectors = (0..n * dim).map(|i| (((i as u32) ^ seed).wrapping_mul(2654435761) >> 8) as f32 / 16777216.0 - 0.5).collect();
    EmbeddingRows {
        ids: (0..n).map(|i| format!("doc-{seed}-{i}")).collect(),
        dim,
        vectors,
        metadata: Some((0..n).map(|i| Some(format!("{{\"n\":{i}}}"))).collect()),
        text: Some((0..n).map(|i| format!("text {i}")).collect()),
    }
}

async fn stats(c: &LongbowClient, dataset: &str) -> Value {
    let r = c.action("peer.stats", "").await.unwrap();
    let v: Value = serde_json::from_slice(&r[0]).unwrap();
    v["datasets"][dataset].clone()
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

#[test]
fn put_then_get_search_and_info() {
    let peer = TestPeer::start().unwrap();
    rt().block_on(async {
        let mut c = LongbowClient::connect(&peer.data, &peer.meta).await.unwrap();
        let r = rows(300, 24, 1);
        let want = r.clone();
        let batch = r.into_record_batch().unwrap();
        let mut seen = vec![];
        let rep =
            c.put_batches("docs", split(&batch, 64), &PutOptions::default(), &mut |p: &PutReport| seen.push(p.rows_acked)).await.unwrap();
        assert_eq!((rep.rows_sent, rep.rows_acked, rep.batches_acked), (300, 300, 5));
        // a batch over the message size limit goes in acknowledged pieces
        let big = rows(200, 24, 9).into_record_batch().unwrap();
        let small = PutOptions { max_batch_bytes: 4096, ..Default::default() };
        let rep = c.put_batches("pieces", vec![big], &small, &mut |_: &PutReport| {}).await.unwrap();
        assert!(rep.batches_acked >= 5 && rep.rows_acked == 200, "{rep:?}");
        assert_eq!(c.read_vectors("pieces", None).await.unwrap().ids.len(), 200);
        assert!(seen.windows(2).all(|w| w[0] <= w[1]) && seen.last() == Some(&300), "{seen:?}");
        assert_eq!(c.total_records("docs").await.unwrap(), Some(300));
        assert_eq!(c.total_records("nope").await.unwrap(), None);
        let mut ds = c.list_datasets().await.unwrap();
        ds.sort();
        assert_eq!(ds, vec![("docs".to_string(), 300), ("pieces".to_string(), 200)]);
        let got = c.read_vectors("docs", None).await.unwrap();
        assert_eq!(got.ids, want.ids);
        assert_eq!(got.data.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), want.vectors.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
        assert_eq!(c.read_vectors("docs", Some(10)).await.unwrap().ids.len(), 10);
        // the optional columns come back too
        let bs = c.read("docs", Some(3)).await.unwrap();
        let s = bs[0].schema();
        let names: Vec<&str> = s.fields().iter().map(|f| f.name().as_str()).collect();
        assert_eq!(names, ["id", "vector", "metadata", "text"]);
        let text = bs[0].column(3).as_any().downcast_ref::<arrow_array::StringArray>().unwrap();
        let meta = bs[0].column(2).as_any().downcast_ref::<arrow_array::StringArray>().unwrap();
        assert_eq!((text.value(2), meta.value(2)), ("text 2", r#"{"n":2}"#));
        for i in [0usize, 123, 299] {
            let hits = c.search("docs", &want.vectors[i * 24..(i + 1) * 24], 3).await.unwrap();
            assert_eq!(hits.len(), 3);
            assert_eq!(hits[0].0, want.ids[i]);
            assert!((hits[0].1 - 1.0).abs() < 1e-5 && hits[1].1 <= hits[0].1);
        }
        // a second upload appends
        let more = rows(10, 24, 2).into_record_batch().unwrap();
        c.put_batches("docs", vec![more], &PutOptions::default(), &mut |_: &PutReport| {}).await.unwrap();
        assert_eq!(c.total_records("docs").await.unwrap(), Some(310));
        // refusals are errors, not retries: a schema that differs from the dataset's
        let other = rows(5, 8, 3).into_record_batch().unwrap();
        let e = c.put_batches("docs", vec![other], &PutOptions::default(), &mut |_: &PutReport| {}).await.unwrap_err();
        assert!(!e.is_transient(), "{e}");
        assert_eq!(c.total_records("docs").await.unwrap(), Some(310));
    });
}

#[test]
fn slow_down_pauses_sending() {
    let peer = TestPeer::start().unwrap();
    rt().block_on(async {
        let mut c = LongbowClient::connect(&peer.data, &peer.meta).await.unwrap();
        c.action("peer.slow_down", r#"{"batches": 3}"#).await.unwrap();
        let b = rows(80, 16, 4).into_record_batch().unwrap();
        let slow = Backoff { initial: Duration::from_millis(150), max: Duration::from_secs(2), factor: 2.0 };
        let opts = PutOptions { window: 1, slow_down: slow, ..Default::default() };
        let rep = c.put_batches("slow", split(&b, 10), &opts, &mut |_: &PutReport| {}).await.unwrap();
        assert_eq!(rep.rows_acked, 80);
        assert_eq!(rep.slow_downs, 3);
        assert_eq!(rep.backoff, Duration::from_millis(150 + 300 + 600));
        let s = stats(&c, "slow").await;
        assert_eq!(s["rows"], 80);
        let t: Vec<f64> = s["arrivals"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
        // batches 0..3 were answered with slow_down: the next batch waited out the backoff
        for (i, min) in [(0, 0.150), (1, 0.300), (2, 0.600)] {
            assert!(t[i + 1] - t[i] >= min, "gap after batch {i}: {:.3}s < {min}s", t[i + 1] - t[i]);
        }
    });
}

#[test]
fn dropped_connection_loses_and_duplicates_nothing() {
    let peer = TestPeer::start().unwrap();
    rt().block_on(async {
        let mut c = LongbowClient::connect(&peer.data, &peer.meta).await.unwrap();
        // something stored before: the reconciliation must count only this upload's rows
        c.put_batches("drop", vec![rows(7, 16, 5).into_record_batch().unwrap()], &PutOptions::default(), &mut |_: &PutReport| {})
            .await
            .unwrap();
        c.action("peer.drop_after", r#"{"batches": 10}"#).await.unwrap();
        c.action("peer.slow_down", r#"{"batches": 2}"#).await.unwrap();
        let r = rows(500, 16, 6);
        let want = r.clone();
        let b = r.into_record_batch().unwrap();
        let opts = PutOptions {
            window: 4,
            slow_down: Backoff { initial: Duration::from_millis(20), max: Duration::from_millis(100), factor: 2.0 },
            retry: Backoff { initial: Duration::from_millis(50), max: Duration::from_millis(500), factor: 2.0 },
            ..Default::default()
        };
        let rep = c.put_batches("drop", split(&b, 25), &opts, &mut |_: &PutReport| {}).await.unwrap();
        assert_eq!(rep.rows_acked, 500, "{rep:?}");
        assert!(rep.reconnects >= 1, "{rep:?}");
        // the batch stored when the connection was cut was never acknowledged (nor, maybe,
        // some before it whose acknowledgements were still in the broken connection's
        // buffers); at most a window of batches is in doubt
        assert!(rep.rows_reconciled >= 25 && rep.rows_reconciled <= 100 && rep.rows_reconciled % 25 == 0, "{rep:?}");
        // acknowledgements come in order and the window is 4: those of batches 1 and 2 came
        // before batch 10 could be sent
        assert_eq!(rep.slow_downs, 2);
        let s = stats(&c, "drop").await;
        assert_eq!((s["rows"].as_u64(), s["duplicate_ids"].as_u64()), (Some(507), Some(0)), "{s}");
        let v: Value = serde_json::from_slice(&c.action("peer.stats", "").await.unwrap()[0]).unwrap();
        assert_eq!(v["drops"], 1);
        let got = c.read_vectors("drop", None).await.unwrap();
        assert_eq!(&got.ids[7..], &want.ids[..]);
        assert_eq!(&got.data[7 * 16..], &want.vectors[..]);
    });
}

#[test]
fn another_writer_during_a_drop_is_an_error_not_a_guess() {
    let peer = TestPeer::start().unwrap();
    rt().block_on(async {
        let mut c = LongbowClient::connect(&peer.data, &peer.meta).await.unwrap();
        // rows from someone else land while the connection is down: the count no longer says
        // which of this upload's batches were stored
        c.action("peer.drop_after", r#"{"batches": 3, "foreign_rows": 5}"#).await.unwrap();
        let b = rows(200, 8, 7).into_record_batch().unwrap();
        let opts = PutOptions {
            window: 1,
            retry: Backoff { initial: Duration::from_millis(20), max: Duration::from_millis(100), factor: 2.0 },
            ..Default::default()
        };
        let e = c.put_batches("shared", split(&b, 20), &opts, &mut |_: &PutReport| {}).await.unwrap_err();
        assert!(matches!(e, quarrel_flight::FlightClientError::Reconcile { .. }), "{e}");
        assert!(e.to_string().contains("another writer"), "{e}");
    });
}

#[test]
fn unreachable_endpoints_are_errors() {
    rt().block_on(async {
        // a port nothing listens on (bind, read the port, close)
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let e = LongbowClient::connect(&format!("127.0.0.1:{port}"), &format!("127.0.0.1:{port}")).await.err().unwrap();
        assert!(e.is_transient(), "{e}");
        assert!(LongbowClient::connect("no-port", "x:1").await.is_err());
    });
}
