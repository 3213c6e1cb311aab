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

use crate::contract::{BoxError, Endpoint, EndpointError};
use crate::run::{Call, detached, guarded};
use crate::settings::Idempotency;

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

impl Idempotency {
    /// A service running `endpoint` in one transaction with the claim of the request's key and
    /// its stored response (and its outbox stagings, with an inbox that has an outbox): all or
    /// nothing. A retry while it runs waits at most the inbox's claim wait for it (getting its
    /// response if it completes by then), then gets 409. SQLite writes one transaction at a
    /// time: there the retry waits for the first request's commit, up to the pool's busy
    /// timeout.
    pub fn transactional<E: Endpoint>(self, endpoint: E) -> Transactional<E> {
        Transactional::new(self, endpoint)
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
