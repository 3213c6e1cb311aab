//! The layer for any tower service: the key claimed with a lease, the service run outside any
//! transaction, its response stored once it returns.

use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskContext, Poll, ready};

use bytes::Bytes;
use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use http::{Method, Request, Response};
use http_body::Body;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use idem_runtime::{Context, Mode};
use tower_layer::Layer;
use tower_service::Service;

use crate::contract::{BoxError, EndpointError};
use crate::detached::{LeftRunning, Place};
use crate::problem::Problem;
use crate::run::{Call, guarded};
use crate::settings::Idempotency;

/// Guards the services it wraps with `Idempotency-Key` ([`Idempotency::layer`]). Safe methods
/// (`GET`, `HEAD`, `OPTIONS`, `TRACE`) pass through unguarded.
#[derive(Debug, Clone)]
pub struct IdempotencyLayer {
    settings: Arc<Idempotency>,
    /// The requests of the services it guards left running by their callers: shared by every
    /// service it makes, however often a router applies it (axum does per connection for a
    /// router without state).
    left: Arc<LeftRunning>,
}

impl Idempotency {
    /// A tower layer guarding any service: a request is claimed (a retry meanwhile gets 409),
    /// the service runs outside any transaction, and its response is stored once it returns.
    /// Once called, its error, panic or a response past the limit is kept as a 500 (its effects
    /// may stand), unless the error is [`NotStored`](crate::kept::NotStored). A crash in between
    /// leaves the claim until its lease ends, after which a retry runs the service again: for
    /// effects that cannot join the database's transaction. Use
    /// [`Idempotency::transactional`] when they can.
    pub fn layer(self) -> IdempotencyLayer {
        IdempotencyLayer::new(self)
    }
}

impl IdempotencyLayer {
    pub(crate) fn new(settings: Idempotency) -> Self {
        Self {
            settings: Arc::new(settings),
            left: Arc::default(),
        }
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = Guarded<S>;

    fn layer(&self, inner: S) -> Guarded<S> {
        Guarded {
            inner,
            settings: Arc::clone(&self.settings),
            place: Place::new(Arc::clone(&self.left)),
        }
    }
}

/// A service guarded by [`IdempotencyLayer`].
///
/// A request runs to its end in a task of its own even if its caller goes (a client that hangs
/// up), and keeps its caller's place: the next caller of a service the layer guards waits for
/// it before that service is ready, so that a concurrency limit in front of the guard bounds
/// the requests running.
#[derive(Debug, Clone)]
pub struct Guarded<S> {
    inner: S,
    settings: Arc<Idempotency>,
    place: Place,
}

impl<S, ReqB, ResB> Service<Request<ReqB>> for Guarded<S>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    ReqB: Body + From<Bytes> + Send + 'static,
    ReqB::Data: Send,
    ReqB::Error: Into<BoxError>,
    ResB: Body + From<Bytes> + Send + 'static,
    ResB::Data: Send,
    ResB::Error: Into<BoxError>,
{
    type Response = Response<ResB>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Response<ResB>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), S::Error>> {
        ready!(self.place.poll_ready(cx));
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqB>) -> Self::Future {
        self.place.called();
        // The service polled ready is the one that serves this request.
        let clone = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, clone);
        if is_safe(request.method()) {
            let mut ready = ready;
            return Box::pin(ready.call(request));
        }
        let settings = Arc::clone(&self.settings);
        let work = async move {
            let forward = Forward {
                service: Mutex::new(Some(ready)),
                response_limit: settings.response_limit,
                body: std::marker::PhantomData,
            };
            let mode = Mode::TwoPhase {
                lease: settings.lease,
            };
            guarded(&settings, mode, request, forward).await
        };
        let answer = self.place.detach(work);
        Box::pin(async move { Ok(answer.await.map(ResB::from)) })
    }
}

/// Methods that change nothing by definition.
fn is_safe(method: &Method) -> bool {
    [Method::GET, Method::HEAD, Method::OPTIONS, Method::TRACE].contains(method)
}

/// Runs the request through the wrapped service, once.
struct Forward<S, ReqB> {
    service: Mutex<Option<S>>,
    response_limit: usize,
    body: std::marker::PhantomData<fn(ReqB)>,
}

impl<S, ReqB, ResB> Call for Forward<S, ReqB>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Send,
    S::Future: Send,
    S::Error: Into<BoxError>,
    ReqB: From<Bytes>,
    ResB: Body + Send,
    ResB::Data: Send,
    ResB::Error: Into<BoxError>,
{
    async fn call(
        &self,
        _: &Context<'_>,
        request: Request<Bytes>,
    ) -> Result<Response<Bytes>, EndpointError> {
        let service = match self.service.lock() {
            Ok(mut slot) => slot.take(),
            Err(_) => None,
        };
        let Some(service) = service else {
            return Err(EndpointError::Failed("the service was called twice".into()));
        };
        Ok(self.answer(service, request).await)
    }
}

impl<S, ReqB> Forward<S, ReqB> {
    /// The service's answer to `request`, whatever becomes of it: once the service is called its
    /// effects may stand, so an error, a panic or a response too large to keep is answered (and
    /// kept) as a 500 of its own rather than freeing the key for a retry to run it again.
    async fn answer<ResB>(&self, mut service: S, request: Request<Bytes>) -> Response<Bytes>
    where
        S: Service<Request<ReqB>, Response = Response<ResB>>,
        S::Error: Into<BoxError>,
        ReqB: From<Bytes>,
        ResB: Body,
        ResB::Error: Into<BoxError>,
    {
        let run = async {
            let response = service
                .call(request.map(ReqB::from))
                .await
                .map_err(Into::<BoxError>::into)?;
            let (parts, body) = response.into_parts();
            match Limited::new(body, self.response_limit).collect().await {
                Ok(collected) => Ok(Response::from_parts(parts, collected.to_bytes())),
                Err(error) if error.is::<LengthLimitError>() => {
                    let (limit, status) = (self.response_limit, parts.status);
                    tracing::warn!(
                        limit,
                        %status,
                        "a layered service's response is too large to keep; a 500 is kept in its place"
                    );
                    Ok(Problem::response_too_large(limit, Some(status)).response())
                }
                Err(error) => Err(error),
            }
        };
        match AssertUnwindSafe(run).catch_unwind().await {
            Ok(Ok(response)) => response,
            Ok(Err(error)) if error.is::<crate::kept::NotStored>() => {
                let mut response = Problem::unavailable(NOT_RUN.to_owned()).response();
                response.extensions_mut().insert(crate::kept::NotStored);
                response
            }
            Ok(Err(error)) => {
                tracing::warn!(%error, "a layered service failed after it began; a 500 is kept");
                Problem::incomplete().response()
            }
            Err(_) => {
                tracing::warn!("a layered service panicked after it began; a 500 is kept");
                Problem::incomplete().response()
            }
        }
    }
}

const NOT_RUN: &str = "The service did not run the request; nothing was stored, and the same \
    request may be retried.";
