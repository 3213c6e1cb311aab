//! One guarded request: its key checked and scoped, its body read, then processed by the inbox
//! as a message whose output is the response.

use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Response};
use http_body::Body;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use idem_runtime::fingerprint::{Fingerprint, FingerprintError};
use idem_runtime::{Context, Error, Handler, KeyError, MessageKey, Metadata, Mode, Outcome};

use crate::contract::{BoxError, EndpointError};
use crate::kept::{NotStored, REPLAYED_HEADER, RETENTION_HEADER};
use crate::key::{HeaderError, message_key, request_key};
use crate::problem::Problem;
use crate::request::fingerprint;
use crate::settings::Idempotency;
use crate::stored::StoredResponse;

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
    let body = match read_body(body, settings.body_limit).await {
        Ok(body) => body,
        Err(refused) => return refused,
    };
    let principal = settings.principal.of(&parts);
    let key = match message_key(principal.as_deref(), &key) {
        Ok(key) => key,
        Err(error) => return Problem::key_malformed(error).response(),
    };
    // A retry while this process runs the key is answered without the database; the key is
    // given back however the request ends.
    let Some(_running) = settings.in_flight.enter(&key) else {
        return Problem::in_progress(Duration::ZERO).response();
    };
    let fingerprint = fingerprint(&parts, &body, settings.bodies);
    let run = Run {
        settings,
        mode,
        call,
        ran: Mutex::new(None),
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
    let retention = settings.applied_retention();
    run.respond(outcome, retention)
}

/// The body, read whole up to `limit` bytes; a response when it cannot be.
async fn read_body<B>(body: B, limit: usize) -> Result<Bytes, Response<Bytes>>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    // A body announced larger than the limit is refused before it is read.
    if usize::try_from(body.size_hint().lower()).map_or(true, |announced| announced > limit) {
        return Err(Problem::body_too_large(limit).response());
    }
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) if error.is::<LengthLimitError>() => {
            Err(Problem::body_too_large(limit).response())
        }
        Err(error) => {
            tracing::debug!(%error, "the request body could not be read");
            Err(Problem::body_unreadable().response())
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
    /// What the call answered, once it has: in two-phase mode its effect has happened, whatever
    /// becomes of the record after.
    ran: Mutex<Option<Ran>>,
}

/// How far a run went.
enum Ran {
    /// The call began: a lock not granted from now on is the endpoint's own, not the key's.
    Began,
    /// The call answered with this response.
    Answered(Response<Bytes>),
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

    /// A client's mistake or a key in use is the client's to act on, not the server's.
    fn is_expected(&self, error: &Error) -> bool {
        match error {
            Error::FingerprintMismatch { .. } | Error::InProgressElsewhere { .. } => true,
            Error::Handler { source, .. } => matches!(
                source.downcast_ref(),
                Some(EndpointError::Rejected(response)) if response.status().is_client_error()
            ),
            _ => false,
        }
    }

    async fn handle(
        &self,
        cx: &Context<'_>,
        message: Buffered,
    ) -> Result<StoredResponse, EndpointError> {
        self.note(Ran::Began);
        let response = self.call.call(cx, message.request).await?;
        let unstored = self.settings.unstored.contains(&response.status());
        if unstored || response.extensions().get::<NotStored>().is_some() {
            return Err(EndpointError::Rejected(response));
        }
        let limit = self.settings.response_limit;
        if matches!(self.mode, Mode::Transactional) && response.body().len() > limit {
            // Rolled back, nothing kept. (A layered service ran outside any transaction: the
            // layer already put a 500 of its own in place of a response past the limit.)
            let problem = Problem::response_too_large(limit, None).response();
            return Err(EndpointError::Rejected(problem));
        }
        self.note(Ran::Answered(response.clone()));
        Ok(StoredResponse::new(response, &self.settings.replayed))
    }
}

impl<C> Run<'_, C> {
    fn note(&self, ran: Ran) {
        if let Ok(mut slot) = self.ran.lock() {
            *slot = Some(ran);
        }
    }

    fn began(&self) -> bool {
        self.ran.lock().is_ok_and(|ran| ran.is_some())
    }

    /// The response the call answered, in two-phase mode, where its effect stands whatever
    /// became of the record.
    fn answered_outside_a_transaction(&self) -> Option<Response<Bytes>> {
        if !matches!(self.mode, Mode::TwoPhase { .. }) {
            return None;
        }
        match self.ran.lock().ok()?.take()? {
            Ran::Answered(response) => Some(response),
            Ran::Began => None,
        }
    }

    /// The response for what processing the request gave.
    fn respond(
        &self,
        outcome: idem_runtime::Result<Outcome<StoredResponse>>,
        retention: Duration,
    ) -> Response<Bytes> {
        let error = match outcome {
            Ok(Outcome::Processed(stored)) => return kept(stored, retention, false),
            Ok(Outcome::Duplicate(stored)) => return kept(stored, retention, true),
            Err(error) => error,
        };
        if !matches!(error, Error::Handler { .. } | Error::HandlerPanicked(_))
            && let Some(response) = self.answered_outside_a_transaction()
        {
            // The service ran and its effect stands: its answer is the truth, though the
            // record could not keep it (a retry may be told otherwise).
            tracing::warn!(%error, "an idempotent request ran but its response was not kept");
            return response;
        }
        match error {
            Error::Handler { source, .. } => match source.downcast::<EndpointError>() {
                Ok(endpoint) => match *endpoint {
                    EndpointError::Rejected(response) => response,
                    EndpointError::Failed(error) => {
                        tracing::warn!(%error, "an idempotent request failed; nothing was stored");
                        Problem::failed(NOTHING_STORED.to_owned()).response()
                    }
                },
                Err(other) => {
                    tracing::warn!(error = %other, "an idempotent request failed; nothing was stored");
                    Problem::failed(NOTHING_STORED.to_owned()).response()
                }
            },
            Error::HandlerPanicked(panic) => {
                tracing::warn!(%panic, "an idempotent request's endpoint panicked; nothing was stored");
                Problem::failed(NOTHING_STORED.to_owned()).response()
            }
            Error::FingerprintMismatch { .. } => Problem::key_reused().response(),
            Error::InProgressElsewhere { remaining, .. } => {
                Problem::in_progress(remaining).response()
            }
            // The key's claim waited for another request's transaction, or SQLite's lock.
            Error::Contention(_) if !self.began() => {
                Problem::in_progress(Duration::from_secs(1)).response()
            }
            Error::InvalidKey(error) => Problem::key_malformed(error).response(),
            Error::NeedsIntervention { attempts, .. } => Problem::failed(format!(
                "{attempts} earlier attempts with this key did not complete; it needs an operator."
            ))
            .response(),
            Error::StoredOutputUnreadable { .. } => {
                Problem::failed(KEPT_WITHOUT_RESPONSE.to_owned()).response()
            }
            error @ (Error::StoreUnavailable(_) | Error::Contention(_)) => {
                tracing::warn!(%error, "an idempotent request could not be completed; nothing was stored");
                Problem::unavailable(NOTHING_STORED.to_owned()).response()
            }
            error => {
                tracing::warn!(%error, "an idempotent request failed");
                Problem::failed("The request could not be completed.".to_owned()).response()
            }
        }
    }
}

const NOTHING_STORED: &str = "Nothing was stored: the same request may be retried.";

const KEPT_WITHOUT_RESPONSE: &str = "A request with this key was completed, but its response \
    could not be kept (too large for the database): it is not run again.";

/// A stored response as sent, publishing the key's retention; 500 when its record no longer
/// reads as a response.
fn kept(stored: StoredResponse, retention: Duration, replayed: bool) -> Response<Bytes> {
    let Some(mut response) = stored.into_response() else {
        tracing::warn!("a stored response no longer reads as a response");
        return Problem::failed("The response stored for this key cannot be read.".to_owned())
            .response();
    };
    let headers = response.headers_mut();
    if replayed {
        headers.insert(REPLAYED_HEADER, HeaderValue::from_static("true"));
    }
    headers.insert(RETENTION_HEADER, HeaderValue::from(retention.as_secs()));
    response
}
