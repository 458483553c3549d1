//! Errors of the Flight client, split into transient (reconnect and retry) and final ones.

use arrow_flight::error::FlightError;
use tonic::Code;

#[derive(Debug, thiserror::Error)]
pub enum FlightClientError {
    #[error("bad endpoint {endpoint:?}: {reason}")]
    Endpoint { endpoint: String, reason: String },
    #[error("cannot connect to {endpoint}: {reason}")]
    Connect { endpoint: String, reason: String },
    #[error("{op} failed: {status}")]
    Rpc { op: &'static str, status: Box<tonic::Status> },
    #[error("{op}: {reason}")]
    Protocol { op: &'static str, reason: String },
    #[error("invalid embedding rows: {0}")]
    InvalidRows(String),
    #[error("embedding: {0}")]
    Embed(quarrel_engine::service::ServiceError),
    #[error("arrow: {0}")]
    Arrow(#[from] arrow_schema::ArrowError),
    #[error(
        "after a dropped DoPut the server holds {stored} of this upload's rows, but {acked} were acknowledged and \
         {in_doubt} were in flight: another writer changed dataset {dataset:?}; cannot resume without losing or \
         duplicating rows"
    )]
    Reconcile { dataset: String, stored: i64, acked: u64, in_doubt: u64 },
    #[error("gave up after {attempts} attempts: {last}")]
    RetriesExhausted { attempts: u32, last: Box<FlightClientError> },
}

pub type Result<T, E = FlightClientError> = std::result::Result<T, E>;

impl FlightClientError {
    pub(crate) fn rpc(op: &'static str, e: FlightError) -> FlightClientError {
        match e {
            FlightError::Tonic(status) => FlightClientError::Rpc { op, status },
            FlightError::Arrow(a) => FlightClientError::Arrow(a),
            other => FlightClientError::Protocol { op, reason: other.to_string() },
        }
    }

    #[cfg(test)]
    pub(crate) fn status(op: &'static str, s: tonic::Status) -> FlightClientError {
        FlightClientError::Rpc { op, status: Box::new(s) }
    }

    /// Worth a reconnect and a retry: the connection broke, the server is busy or restarting.
    /// Refusals (bad schema, unknown dataset, permission) are final.
    pub fn is_transient(&self) -> bool {
        match self {
            FlightClientError::Connect { .. } => true,
            FlightClientError::Rpc { status, .. } => match status.code() {
                Code::Unavailable | Code::Cancelled | Code::Aborted | Code::DeadlineExceeded | Code::ResourceExhausted => true,
                // h2 / transport failures surface as Unknown or Internal
                Code::Unknown | Code::Internal => {
                    let m = status.message().to_ascii_lowercase();
                    ["transport", "connection", "broken pipe", "reset", "h2 protocol", "stream", "socket", "closed"]
                        .iter()
                        .any(|k| m.contains(k))
                }
                _ => false,
            },
            FlightClientError::Protocol { reason, .. } => reason.contains("ended before"),
            _ => false,
        }
    }

    /// The dataset does not exist (yet).
    pub fn is_not_found(&self) -> bool {
        match self {
            FlightClientError::Rpc { status, .. } => {
                status.code() == Code::NotFound || status.message().to_ascii_lowercase().contains("not found")
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transient_classification() {
        let t = |c: Code, m: &str| FlightClientError::status("x", tonic::Status::new(c, m)).is_transient();
        assert!(t(Code::Unavailable, "Stream removed"));
        assert!(t(Code::Unknown, "transport error"));
        assert!(t(Code::Internal, "h2 protocol error: connection reset"));
        assert!(!t(Code::InvalidArgument, "bad schema"));
        assert!(!t(Code::Unknown, "`vector` must be fixed_size_list"));
        assert!(!FlightClientError::InvalidRows("x".into()).is_transient());
        assert!(FlightClientError::status("x", tonic::Status::unknown("dataset 'a' not found")).is_not_found());
    }
}
