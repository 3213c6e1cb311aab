//! One guarded request: its key checked and scoped, its body read, then processed by the inbox
//! as a message whose output is the response.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Response};
use http_body::Body;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use idem_runtime::transport::Settle;
use idem_runtime::{
    Context, Error, Fingerprint, FingerprintError, Handler, KeyError, MessageKey, Metadata, Mode,
    Outcome,
};

use crate::endpoint::EndpointError;
use crate::key::{HeaderError, request_fingerprint, request_key, scoped};
use crate::problem::Problem;
use crate::settings::Idempotency;
use crate::stored::StoredResponse;
use crate::{REPLAYED_HEADER, RETENTION_HEADER};

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What runs a request once its key is claimed: a layered service or an endpoint.
pub(crate) trait Call: Send + Sync {
    fn call(
        &self,
        cx: &Context<'_>,
        request: Request<Bytes>,
    ) -> impl Future<Output = Result<Response<Bytes>, EndpointError>> + Send;
}

/// Runs `request` through `call` at most once per key, in `mode`; every outcome is a response.
pub(crate) async fn guarded<B, C>(
    settings: &Idempotency,
    mode: Mode,
    request: Request<B>,
    call: C,
) -> Response<Bytes>
where
    B: Body,
    B::Error: Into<BoxError>,
    C: Call,
{
    let (parts, body) = request.into_parts();
    let key = match request_key(&parts.headers) {
        Ok(key) => key,
        Err(HeaderError::Missing) => return Problem::key_missing().response(),
        Err(HeaderError::Malformed(why)) => return Problem::key_malformed(why).response(),
    };
    let body = match Limited::new(body, settings.body_limit).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(error) if error.is::<LengthLimitError>() => {
            return Problem::body_too_large(settings.body_limit).response();
        }
        Err(error) => {
            tracing::debug!(%error, "the request body could not be read");
            return Problem::failed("The request body could not be read.".to_owned()).response();
        }
    };
    let principal = settings
        .principal
        .as_ref()
        .and_then(|principal| principal(&parts));
    let key = match scoped(&parts, principal.as_deref(), &key) {
        Ok(key) => key,
        Err(error) => return Problem::key_malformed(error).response(),
    };
    let fingerprint = request_fingerprint(&parts, &body);
    let run = Run {
        settings,
        mode,
        call,
    };
    let message = Buffered {
        key,
        fingerprint,
        request: Request::from_parts(parts, body),
    };
    let outcome = settings
        .inbox
        .process(&run, message, &Metadata::default())
        .await;
    let mut response = respond(outcome);
    if response.status().is_success() || response.headers().contains_key(REPLAYED_HEADER) {
        let retention = settings.applied_retention().as_secs();
        (response.headers_mut()).insert(RETENTION_HEADER, HeaderValue::from(retention));
    }
    response
}

/// Runs a guarded request in a task of its own, to its end whatever becomes of the caller: a
/// client that hangs up (hyper then drops the request's future) must not cancel the database
/// work in the middle of a statement, which leaves a connection that sqlx cannot always recover.
/// The request completes and its response is stored, for the client's retry to get.
pub(crate) async fn detached(
    work: impl Future<Output = Response<Bytes>> + Send + 'static,
) -> Response<Bytes> {
    match tokio::spawn(work).await {
        Ok(response) => response,
        Err(join) => {
            tracing::warn!(error = %join, "an idempotent request's task failed");
            failed()
        }
    }
}

/// A request as the inbox processes it.
struct Buffered {
    key: MessageKey,
    fingerprint: Fingerprint,
    request: Request<Bytes>,
}

/// The handler the inbox runs a request with.
struct Run<'s, C> {
    settings: &'s Idempotency,
    mode: Mode,
    call: C,
}

impl<C: Call> Handler for Run<'_, C> {
    type Message = Buffered;
    type Output = StoredResponse;
    type Error = EndpointError;

    fn consumer(&self) -> &str {
        self.settings.consumer.as_str()
    }

    fn key(&self, message: &Buffered, _: &Metadata) -> Result<MessageKey, KeyError> {
        Ok(message.key.clone())
    }

    fn fingerprint(
        &self,
        message: &Buffered,
        _: &Metadata,
    ) -> Result<Option<Fingerprint>, FingerprintError> {
        Ok(Some(message.fingerprint))
    }

    fn mode(&self) -> Mode {
        self.mode
    }

    fn retention(&self) -> Option<Duration> {
        Some(self.settings.retention)
    }

    async fn handle(
        &self,
        cx: &Context<'_>,
        message: Buffered,
    ) -> Result<StoredResponse, EndpointError> {
        let response = self.call.call(cx, message.request).await?;
        if response.extensions().get::<crate::NotStored>().is_some() {
            return Err(EndpointError::Rejected(response));
        }
        Ok(StoredResponse::new(response, &self.settings.replayed))
    }
}

/// The response for what processing the request gave.
fn respond(outcome: idem_runtime::Result<Outcome<StoredResponse>>) -> Response<Bytes> {
    let error = match outcome {
        Ok(Outcome::Processed(stored)) => return stored_or_failed(stored),
        Ok(Outcome::Duplicate(stored)) => {
            let mut response = stored_or_failed(stored);
            (response.headers_mut()).insert(REPLAYED_HEADER, HeaderValue::from_static("true"));
            return response;
        }
        Err(error) => error,
    };
    match error {
        Error::Handler { source, .. } => match source.downcast::<EndpointError>() {
            Ok(endpoint) => match *endpoint {
                EndpointError::Rejected(response) => response,
                EndpointError::Failed(error) => {
                    tracing::warn!(%error, "an idempotent request failed; nothing was stored");
                    failed()
                }
            },
            Err(other) => {
                tracing::warn!(error = %other, "an idempotent request failed; nothing was stored");
                failed()
            }
        },
        Error::FingerprintMismatch { .. } => Problem::key_reused().response(),
        Error::InProgressElsewhere { .. } | Error::Contention(_) => {
            Problem::in_progress().response()
        }
        Error::InvalidKey(error) => Problem::key_malformed(error).response(),
        Error::HandlerPanicked(panic) => {
            tracing::warn!(%panic, "an idempotent request's endpoint panicked; nothing was stored");
            failed()
        }
        Error::NeedsIntervention { attempts, .. } => Problem::failed(format!(
            "{attempts} earlier attempts with this key did not complete; it needs an operator."
        ))
        .response(),
        error if error.settle() == Settle::Requeue => {
            tracing::warn!(%error, "an idempotent request could not be completed; nothing was stored");
            Problem::unavailable("Nothing was stored: the same request may be retried.".to_owned())
                .response()
        }
        error => {
            tracing::warn!(%error, "an idempotent request failed");
            failed()
        }
    }
}

/// A stored response, or 500 when its record no longer reads as one.
fn stored_or_failed(stored: StoredResponse) -> Response<Bytes> {
    stored.into_response().unwrap_or_else(|| {
        tracing::warn!("a stored response no longer reads as a response");
        Problem::failed("The response stored for this key cannot be read.".to_owned()).response()
    })
}

fn failed() -> Response<Bytes> {
    Problem::failed("Nothing was stored: the same request may be retried.".to_owned()).response()
}
