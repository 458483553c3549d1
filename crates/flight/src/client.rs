//! `LongbowClient`: one gRPC channel to Longbow's data port (DoPut, DoGet) and one to its
//! meta port (GetFlightInfo, ListFlights, DoAction). Tickets and search requests are
//! Longbow's JSON; results come back as RecordBatches.

use crate::batch::Vectors;
use crate::error::{FlightClientError, Result};
use arrow_array::{Array, Float32Array, Float64Array, RecordBatch, StringArray};
use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::{Action, FlightClient, FlightDescriptor, FlightInfo, Ticket};
use bytes::Bytes;
use futures::TryStreamExt;
use std::time::Duration;
use tonic::transport::{Channel, Endpoint};

/// `host:port`, `http://host:port` or `grpc://host:port` -> the URI tonic dials.
pub fn endpoint_uri(s: &str) -> Result<String> {
    let bad = |reason: &str| FlightClientError::Endpoint { endpoint: s.to_string(), reason: reason.into() };
    let rest = s.strip_prefix("grpc+tcp://").or_else(|| s.strip_prefix("grpc://")).or_else(|| s.strip_prefix("http://")).unwrap_or(s);
    if rest.contains("://") {
        return Err(bad("only plaintext gRPC (grpc://, http:// or host:port) is supported"));
    }
    let (host, port) = rest.trim_end_matches('/').rsplit_once(':').ok_or_else(|| bad("expected HOST:PORT"))?;
    if host.is_empty() {
        return Err(bad("empty host"));
    }
    port.parse::<u16>().map_err(|_| bad("the port is not a number in 1..65535"))?;
    Ok(format!("http://{host}:{port}"))
}

/// Longbow's meta port next to a data endpoint: the data port + 1 (3000 -> 3001).
pub fn default_meta_endpoint(data: &str) -> Result<String> {
    let uri = endpoint_uri(data)?;
    let (host, port) = uri.rsplit_once(':').expect("endpoint_uri gives host:port");
    let p: u16 = port.parse().expect("checked");
    let meta = p
        .checked_add(1)
        .ok_or_else(|| FlightClientError::Endpoint { endpoint: data.into(), reason: "no port after it for the meta endpoint".into() })?;
    Ok(format!("{host}:{meta}"))
}

pub struct LongbowClient {
    data_uri: String,
    meta_uri: String,
    data: FlightServiceClient<Channel>,
    meta: FlightServiceClient<Channel>,
}

async fn dial(uri: &str) -> Result<FlightServiceClient<Channel>> {
    let ep = Endpoint::from_shared(uri.to_string())
        .map_err(|e| FlightClientError::Endpoint { endpoint: uri.into(), reason: e.to_string() })?
        .connect_timeout(Duration::from_secs(10))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(20));
    let ch = ep
        .connect()
        .await
        .map_err(|e| FlightClientError::Connect { endpoint: uri.into(), reason: format!("{e}: {:?}", std::error::Error::source(&e)) })?;
    Ok(FlightServiceClient::new(ch).max_decoding_message_size(256 << 20).max_encoding_message_size(256 << 20))
}

fn path(dataset: &str) -> FlightDescriptor {
    FlightDescriptor::new_path(vec![dataset.to_string()])
}

impl LongbowClient {
    /// Connect to both endpoints (`host:port` each).
    pub async fn connect(data: &str, meta: &str) -> Result<LongbowClient> {
        let (data_uri, meta_uri) = (endpoint_uri(data)?, endpoint_uri(meta)?);
        let d = dial(&data_uri).await?;
        let m = dial(&meta_uri).await?;
        Ok(LongbowClient { data_uri, meta_uri, data: d, meta: m })
    }

    /// New connections to both endpoints (after a transport failure).
    pub async fn reconnect(&mut self) -> Result<()> {
        self.data = dial(&self.data_uri).await?;
        self.meta = dial(&self.meta_uri).await?;
        Ok(())
    }

    pub fn data_uri(&self) -> &str {
        &self.data_uri
    }

    pub(crate) fn data_client(&self) -> FlightClient {
        FlightClient::new_from_inner(self.data.clone())
    }

    fn meta_client(&self) -> FlightClient {
        FlightClient::new_from_inner(self.meta.clone())
    }

    /// GetFlightInfo on the meta port.
    pub async fn flight_info(&self, dataset: &str) -> Result<FlightInfo> {
        self.meta_client().get_flight_info(path(dataset)).await.map_err(|e| FlightClientError::rpc("GetFlightInfo", e))
    }

    /// Rows the server holds for `dataset` (`None`: no such dataset).
    pub async fn total_records(&self, dataset: &str) -> Result<Option<i64>> {
        match self.flight_info(dataset).await {
            Ok(i) if i.total_records >= 0 => Ok(Some(i.total_records)),
            Ok(_) => {
                Err(FlightClientError::Protocol { op: "GetFlightInfo", reason: format!("dataset {dataset:?} has an unknown row count") })
            }
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// ListFlights on the meta port: (dataset, rows).
    pub async fn list_datasets(&self) -> Result<Vec<(String, i64)>> {
        let infos: Vec<FlightInfo> = self
            .meta_client()
            .list_flights(Bytes::new())
            .await
            .map_err(|e| FlightClientError::rpc("ListFlights", e))?
            .try_collect()
            .await
            .map_err(|e| FlightClientError::rpc("ListFlights", e))?;
        Ok(infos
            .into_iter()
            .map(|i| (i.flight_descriptor.and_then(|d| d.path.first().cloned()).unwrap_or_default(), i.total_records))
            .collect())
    }

    /// DoGet with a JSON ticket on the data port.
    pub async fn do_get_json(&self, ticket: &serde_json::Value) -> Result<Vec<RecordBatch>> {
        let t = Ticket::new(serde_json::to_vec(ticket).expect("JSON value serializes"));
        let stream = self.data_client().do_get(t).await.map_err(|e| FlightClientError::rpc("DoGet", e))?;
        stream.try_collect().await.map_err(|e| FlightClientError::rpc("DoGet", e))
    }

    /// Bulk read: `{"name": dataset, "limit": n}`.
    pub async fn read(&self, dataset: &str, limit: Option<usize>) -> Result<Vec<RecordBatch>> {
        let mut t = serde_json::json!({ "name": dataset });
        if let Some(l) = limit {
            t["limit"] = l.into();
        }
        self.do_get_json(&t).await
    }

    /// Bulk read of ids and vectors.
    pub async fn read_vectors(&self, dataset: &str, limit: Option<usize>) -> Result<Vectors> {
        let mut v = Vectors::default();
        for b in self.read(dataset, limit).await? {
            v.extend_from(&b)?;
        }
        Ok(v)
    }

    /// k nearest neighbours: `{"search": {"dataset", "vector", "k"}}` -> (id, score), best first.
    pub async fn search(&self, dataset: &str, vector: &[f32], k: usize) -> Result<Vec<(String, f32)>> {
        let t = serde_json::json!({ "search": { "dataset": dataset, "vector": vector, "k": k } });
        let mut out = vec![];
        for b in self.do_get_json(&t).await? {
            let bad = |m: &str| FlightClientError::Protocol { op: "DoGet search", reason: m.into() };
            let ids =
                b.column_by_name("id").and_then(|c| c.as_any().downcast_ref::<StringArray>()).ok_or_else(|| bad("no utf8 `id` column"))?;
            let col = b.column_by_name("score").or_else(|| b.column_by_name("distance"));
            let scores: Vec<f32> = match col {
                Some(c) if c.as_any().is::<Float32Array>() => c.as_any().downcast_ref::<Float32Array>().unwrap().values().to_vec(),
                Some(c) if c.as_any().is::<Float64Array>() => {
                    c.as_any().downcast_ref::<Float64Array>().unwrap().values().iter().map(|&x| x as f32).collect()
                }
                _ => vec![f32::NAN; ids.len()],
            };
            out.extend(ids.iter().map(|s| s.unwrap_or_default().to_string()).zip(scores));
        }
        Ok(out)
    }

    /// DoAction on the meta port; the result bodies.
    pub async fn action(&self, kind: &str, body: impl Into<Bytes>) -> Result<Vec<Bytes>> {
        let a = Action::new(kind, body.into());
        let s = self.meta_client().do_action(a).await.map_err(|e| FlightClientError::rpc("DoAction", e))?;
        s.try_collect().await.map_err(|e| FlightClientError::rpc("DoAction", e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        assert_eq!(endpoint_uri("localhost:3000").unwrap(), "http://localhost:3000");
        assert_eq!(endpoint_uri("grpc://10.0.0.1:3000").unwrap(), "http://10.0.0.1:3000");
        assert!(endpoint_uri("localhost").is_err());
        assert!(endpoint_uri("localhost:99999").is_err());
        assert!(endpoint_uri("grpc+tls://h:1").is_err());
        assert_eq!(default_meta_endpoint("longbow:3000").unwrap(), "http://longbow:3001");
        assert!(default_meta_endpoint("h:65535").is_err());
    }
}
