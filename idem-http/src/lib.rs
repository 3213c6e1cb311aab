//! `Idempotency-Key` for HTTP endpoints, on idem's inbox: a retried `POST` has the effect of
//! one.
//!
//! Implements the IETF HTTP API working group's draft "The Idempotency-Key HTTP Header Field"
//! (draft-ietf-httpapi-idempotency-key-header-07) on the same inbox table as idem's message
//! consumers, in the application's own database:
//!
//! | request | response |
//! |---|---|
//! | without `Idempotency-Key` | 400, `application/problem+json` |
//! | with a malformed key (not one structured-field string, such as `"8e03978e-…"`; parameters, `"k";v=1`, are accepted and ignored) | 400 |
//! | a first request with a key | the endpoint's response, stored with the key |
//! | a retry after it completed | the stored response replayed (status, body, the headers chosen), with `Idempotent-Replayed: true` |
//! | a retry while the first is still running | 409 at once, `Retry-After` (the first's remaining lease when known, at most a minute) |
//! | the same key with another method, path, query or body | 422 |
//! | the body larger than the limit | 413 |
//! | a body that cannot be read | 400 |
//! | a 401, 403, 415 or 429 (checks made before the work; [`IdempotencyBuilder::unstored_statuses`]) | sent, not stored: the key stays free |
//! | a layered service's response larger than its limit | 500, kept: the service ran, and is not run again |
//! | a layered service that fails or panics once called | 500, kept: what it did is not known, it is not run again |
//! | a transactional endpoint's response larger than its limit | 500, rolled back, the key free again |
//! | the database unreachable, or a layered service's [`NotStored`] error | 503, `Retry-After`; nothing stored |
//!
//! Keys are scoped per [`Principal`], which every guard names: the request's `Authorization`
//! credentials (hashed), the user the authentication in front tells, or, deliberately, none. A
//! request never gets the response kept for another principal's, and an anonymous one never
//! gets an authenticated one's. Within a principal a key is one request: the same key sent with
//! another method, to another path (compared whole, as the client sent it, percent-encodings of
//! unreserved characters and dot segments normalised) or with another body is refused with 422.
//! A completed key is kept for its retention (a day by default), published in every stored
//! response's `Idempotency-Key-Retention` header, in seconds; after it the key is free again,
//! and the cleaner deletes the record as it deletes consumers'.
//!
//! As payment APIs do, the endpoint's first response is stored whatever its status, a 5xx
//! included, and replayed (a layered service that failed once called included: its effects may
//! stand); nothing is stored when the request is refused before it runs (the header, the
//! body's size, a status of [`IdempotencyBuilder::unstored_statuses`]), conflicts with one in
//! flight, or the endpoint says so ([`EndpointError::Rejected`], or [`NotStored`] in a
//! response's extensions): the key stays free for a corrected retry.
//!
//! # Two ways to guard a route
//!
//! - [`Idempotency::layer`]: a tower layer around any service (an axum router's routes). The
//!   key is claimed and committed first, so a concurrent retry gets 409 at once; the service
//!   runs outside any transaction; its response is stored when it returns. A process that
//!   crashes in between holds the key until the claim's lease ends, after which a retry runs the
//!   service again.
//! - [`Idempotency::transactional`]: an [`Endpoint`] run inside the key's transaction. Its
//!   database writes, its stored response and the events it stages in the outbox commit
//!   together or not at all: a crash anywhere leaves nothing, and the retry runs it afresh.
//!
//! Either way a request runs to its end in a task of its own, in the request's span, even if
//! its client hangs up, and keeps its client's place: the next request to the service waits
//! for it, so that a concurrency limit in front of the guard bounds the requests running.
//!
//! # Features
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | `axum` | yes | under axum 0.8's `Router::nest`, the path compared is the full one (axum's `OriginalUri`), not the one the nest strips |
//!
//! # Example
//!
//! ```
//! use axum::{Router, routing::post};
//! use idem_http::{Idempotency, Principal};
//! use idem_runtime::Inbox;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let db = idem_runtime::sea_orm::Database::connect("sqlite::memory:").await?;
//! let inbox = Inbox::builder(db).build().await?;
//! let keys = Idempotency::builder(inbox, "http.payments", Principal::authorization()).build()?;
//! let app: Router = Router::new()
//!     .route("/payments", post(|| async { (axum::http::StatusCode::CREATED, "paid") }))
//!     .route_layer(keys.layer());
//! # let _ = app; Ok(()) }
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo()).unwrap();
//! ```

mod contract;
mod detached;
mod endpoint;
mod inflight;
mod kept;
mod key;
mod layer;
mod principal;
mod problem;
mod request;
mod run;
mod settings;
mod sf;
mod stored;

pub use contract::{Endpoint, EndpointError};
pub use endpoint::Transactional;
pub use kept::{NotStored, REPLAYED_HEADER, RETENTION_HEADER};
pub use key::{HeaderError, IDEMPOTENCY_KEY, MAX_KEY_LEN, message_key, request_key};
pub use layer::{Guarded, IdempotencyLayer};
pub use principal::Principal;
pub use request::BodyComparison;
pub use settings::{Idempotency, IdempotencyBuilder};
