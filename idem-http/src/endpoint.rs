//! The transactional variant: an endpoint whose database writes, stored response and outbox
//! stagings commit in one transaction with the claim of the request's key.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{Request, Response};
use http_body::Body;
use http_body_util::Full;
use idem_runtime::{Context, Mode};
use tower_service::Service;

use crate::run::{BoxError, Call, detached, guarded};
use crate::settings::Idempotency;

/// An HTTP endpoint run at most once per `Idempotency-Key`, in the transaction of its key's
/// claim: write through [`Context::transaction`], stage events with [`Context::stage`] (their
/// ids derive from the key, so a replay stages nothing new and a re-run the same ids).
///
/// The response it returns, whatever its status, commits with its writes and is replayed to
/// every retry. [`EndpointError::Rejected`] sends a response without keeping anything (a
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

impl From<idem_runtime::StagingError> for EndpointError {
    fn from(error: idem_runtime::StagingError) -> Self {
        Self::Failed(Box::new(error))
    }
}

/// The service [`Idempotency::transactional`] makes: usable as an axum route's service
/// (`Router::route_service`, or `post_service`).
pub struct Transactional<E> {
    settings: Arc<Idempotency>,
    endpoint: Arc<E>,
}

impl<E> Clone for Transactional<E> {
    fn clone(&self) -> Self {
        Self {
            settings: Arc::clone(&self.settings),
            endpoint: Arc::clone(&self.endpoint),
        }
    }
}

impl<E> std::fmt::Debug for Transactional<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transactional")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl<E: Endpoint> Transactional<E> {
    pub(crate) fn new(settings: Idempotency, endpoint: E) -> Self {
        Self {
            settings: Arc::new(settings),
            endpoint: Arc::new(endpoint),
        }
    }
}

impl<E: Endpoint> Call for Arc<E> {
    async fn call(
        &self,
        cx: &Context<'_>,
        request: Request<Bytes>,
    ) -> Result<Response<Bytes>, EndpointError> {
        self.handle(cx, request).await
    }
}

impl<E, ReqB> Service<Request<ReqB>> for Transactional<E>
where
    E: Endpoint,
    ReqB: Body + Send + 'static,
    ReqB::Data: Send,
    ReqB::Error: Into<BoxError>,
{
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response<Full<Bytes>>, Infallible>>;

    fn poll_ready(&mut self, _: &mut TaskContext<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<ReqB>) -> Self::Future {
        let (settings, endpoint) = (Arc::clone(&self.settings), Arc::clone(&self.endpoint));
        let work = async move { guarded(&settings, Mode::Transactional, request, endpoint).await };
        Box::pin(async move { Ok(detached(work).await.map(Full::new)) })
    }
}
