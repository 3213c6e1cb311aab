//! The errors the guard answers itself, as problem details (RFC 9457, `application/problem+json`).

use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, Response, StatusCode};

/// Where each problem type is described: the crate's README, by anchor.
const TYPES: &str = "https://github.com/idem-rs/idem/blob/main/idem-http/README.md";

/// A response the guard makes itself: the request is refused, or could not be completed.
#[derive(Debug, Clone)]
pub(crate) struct Problem {
    status: StatusCode,
    /// The README anchor of its type.
    kind: &'static str,
    title: &'static str,
    detail: String,
    retry_after_s: Option<u32>,
}

impl Problem {
    fn new(status: StatusCode, kind: &'static str, title: &'static str, detail: String) -> Self {
        Self {
            status,
            kind,
            title,
            detail,
            retry_after_s: None,
        }
    }

    /// 400: the route requires the header and the request has none.
    pub(crate) fn key_missing() -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "idempotency-key-missing",
            "Idempotency-Key is missing",
            "This operation is idempotent and it requires correct usage of Idempotency Key."
                .to_owned(),
        )
    }

    /// 400: the header is not a structured-field string of an accepted length.
    pub(crate) fn key_malformed(why: impl std::fmt::Display) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "idempotency-key-malformed",
            "Idempotency-Key is malformed",
            format!(
                "{why}. The key is a quoted string, such as \"8e03978e-40d5-43e8-bc93-6894a57f9324\"."
            ),
        )
    }

    /// 409: a request with this key is still being processed, for about `remaining` more.
    pub(crate) fn in_progress(remaining: std::time::Duration) -> Self {
        let mut problem = Self::new(
            StatusCode::CONFLICT,
            "idempotency-key-in-progress",
            "A request is outstanding for this Idempotency-Key",
            "A request with this key is still being processed; retry once it has completed."
                .to_owned(),
        );
        // Whole seconds, at least one, at most a minute: a claim is renewed while its request
        // runs, so its lease's end is an upper bound only.
        let seconds = remaining.as_secs_f64().ceil().clamp(1.0, 60.0) as u32;
        problem.retry_after_s = Some(seconds);
        problem
    }

    /// 422: the key was used for another request (method, path or body).
    pub(crate) fn key_reused() -> Self {
        Self::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "idempotency-key-reused",
            "Idempotency-Key is already used",
            "This operation is idempotent and it requires correct usage of Idempotency Key. \
             Idempotency Key MUST not be reused across different payloads of this operation."
                .to_owned(),
        )
    }

    /// 413: the body is larger than the guard buffers.
    pub(crate) fn body_too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body-too-large",
            "The request body is too large",
            format!(
                "An idempotent request's body is kept to compare retries with: at most {limit} bytes."
            ),
        )
    }

    /// 400: the request body could not be read (the client went away, or sent a broken body).
    pub(crate) fn body_unreadable() -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "body-unreadable",
            "The request body could not be read",
            "The body ended before its announced length or could not be decoded.".to_owned(),
        )
    }

    /// 500: the response is larger than the guard keeps. `ran`: the status a layered service
    /// answered with, this answer kept in its place (the service is not run again); `None`: a
    /// transactional endpoint's, rolled back, nothing stored.
    pub(crate) fn response_too_large(limit: usize, ran: Option<StatusCode>) -> Self {
        let outcome = match ran {
            Some(status) => format!(
                "The request ran and answered {}: this answer is kept in its place, and it is not \
                 run again with this key.",
                status.as_u16()
            ),
            None => "Nothing was stored.".to_owned(),
        };
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "response-too-large",
            "The response is too large to keep",
            format!("An idempotent response is kept for retries: at most {limit} bytes. {outcome}"),
        )
    }

    /// 500, kept: a layered service was called but failed or panicked before it answered. What
    /// it did is not known, so the request is not run again with this key.
    pub(crate) fn incomplete() -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "incomplete",
            "The request began but did not complete",
            "The service failed after it began, and what it did is not known: this answer is kept, \
             and the request is not run again with this key. Check its effects before sending it \
             again with a new key."
                .to_owned(),
        )
    }

    /// 503: the database is unreachable or busy, or the request's transaction was lost;
    /// nothing was stored, the same request may be retried.
    pub(crate) fn unavailable(detail: String) -> Self {
        let mut problem = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "The request could not be completed now",
            detail,
        );
        problem.retry_after_s = Some(1);
        problem
    }

    /// 500: the request failed; nothing was stored, unless the detail says otherwise.
    pub(crate) fn failed(detail: String) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "failed",
            "The request failed",
            detail,
        )
    }

    /// The response.
    pub(crate) fn response(&self) -> Response<Bytes> {
        let body = serde_json::json!({
            "type": format!("{TYPES}#{}", self.kind),
            "title": self.title,
            "status": self.status.as_u16(),
            "detail": self.detail,
        });
        let mut response = Response::new(Bytes::from(body.to_string()));
        *response.status_mut() = self.status;
        let headers = response.headers_mut();
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Some(seconds) = self.retry_after_s {
            headers.insert(RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}
