//! What an endpoint implements, and what ends its request without a stored response.

use bytes::Bytes;
use http::{Request, Response};
use idem_runtime::Context;

/// Any error, boxed.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// An HTTP endpoint run at most once per `Idempotency-Key`, in the transaction of its key's
/// claim: write through [`Context::transaction`], stage events with [`Context::stage`] (their
/// ids derive from the key, so a replay stages nothing new and a re-run the same ids).
///
/// The response it returns, whatever its status, commits with its writes and is replayed to
/// every retry (one past [`IdempotencyBuilder::response_limit`](crate::IdempotencyBuilder::response_limit)
/// is rolled back with them and answered 500). [`EndpointError::Rejected`] sends a response without keeping anything (a
/// request that fails validation: the client may correct it and retry with the same key);
/// [`EndpointError::Failed`] rolls back and answers 500 (503 when the database is unreachable),
/// also keeping nothing.
pub trait Endpoint: Send + Sync + 'static {
    /// Handles one request, its body read whole.
    fn handle(
        &self,
        cx: &Context<'_>,
        request: Request<Bytes>,
    ) -> impl Future<Output = Result<Response<Bytes>, EndpointError>> + Send;
}

/// Why an endpoint's request ends without a stored response.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    /// Sent as it is, nothing kept: the writes roll back and the key stays free.
    #[error("the request was rejected with {}", .0.status())]
    Rejected(Response<Bytes>),
    /// The endpoint failed: the writes roll back, the key stays free, the client gets 500, or
    /// 503 when the error comes from a database that went away.
    #[error("the endpoint failed: {0}")]
    Failed(#[source] BoxError),
}

impl From<idem_runtime::sea_orm::DbErr> for EndpointError {
    fn from(error: idem_runtime::sea_orm::DbErr) -> Self {
        Self::Failed(Box::new(error))
    }
}

impl From<idem_runtime::outbox::StagingError> for EndpointError {
    fn from(error: idem_runtime::outbox::StagingError) -> Self {
        Self::Failed(Box::new(error))
    }
}
