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
use crate::detached::{LeftRunning, Place};
use crate::run::{Call, guarded};
use crate::settings::Idempotency;

/// The service [`Idempotency::transactional`] makes: usable as an axum route's service
/// (`Router::route_service`, or `post_service`).
///
/// A request runs to its end in a task of its own even if its caller goes (a client that hangs
/// up), and keeps its caller's place: the next caller waits for it before the service is
/// ready, so that a concurrency limit in front of it bounds the requests running.
pub struct Transactional<E> {
    settings: Arc<Idempotency>,
    endpoint: Arc<E>,
    place: Place,
}

impl<E> Clone for Transactional<E> {
    fn clone(&self) -> Self {
        Self {
            settings: Arc::clone(&self.settings),
            endpoint: Arc::clone(&self.endpoint),
            place: self.place.clone(),
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
    /// nothing. A retry while it runs gets 409 at once: from this process's own record of the
    /// keys it runs, or, on another replica, from a claim that does not wait for the first
    /// request's lock (SQLite, which writes one transaction at a time, makes another process's
    /// retry wait for the first's commit, up to the pool's busy timeout).
    pub fn transactional<E: Endpoint>(self, endpoint: E) -> Transactional<E> {
        Transactional::new(self, endpoint)
    }
}

impl<E: Endpoint> Transactional<E> {
    pub(crate) fn new(settings: Idempotency, endpoint: E) -> Self {
        Self {
            settings: Arc::new(settings),
            endpoint: Arc::new(endpoint),
            place: Place::new(Arc::new(LeftRunning::default())),
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

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), Infallible>> {
        self.place.poll_ready(cx).map(Ok)
    }

    fn call(&mut self, request: Request<ReqB>) -> Self::Future {
        self.place.called();
        let (settings, endpoint) = (Arc::clone(&self.settings), Arc::clone(&self.endpoint));
        let work = async move { guarded(&settings, Mode::Transactional, request, endpoint).await };
        let answer = self.place.detach(work);
        Box::pin(async move { Ok(answer.await.map(Full::new)) })
    }
}
