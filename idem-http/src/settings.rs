//! How a group of routes is guarded: the inbox and consumer its keys are kept under, whose keys
//! they are, which responses are kept and replayed, and for how long.

use std::sync::Arc;
use std::time::Duration;

use http::header::{CONTENT_ENCODING, CONTENT_LANGUAGE, CONTENT_TYPE, LOCATION};
use http::{HeaderName, StatusCode};
use idem_runtime::admin::ConsumerName;
use idem_runtime::transport::Processing;
use idem_runtime::{ConfigError, Error, Inbox};

use crate::inflight::InFlight;
use crate::principal::Principal;
use crate::request::BodyComparison;

/// `Idempotency-Key` for a group of routes: where keys are kept, and how.
///
/// Built once per route group with [`Idempotency::builder`]; then [`Idempotency::layer`]
/// guards any tower service (its response is stored after it returns), and
/// [`Idempotency::transactional`] runs an [`Endpoint`](crate::Endpoint) whose database writes,
/// stored response and outbox stagings commit together. Cloning is cheap; clones share the
/// keys this process is running requests for.
#[derive(Debug, Clone)]
pub struct Idempotency {
    /// The inbox, its claims failing at once on a key another request holds.
    pub(crate) inbox: Inbox,
    pub(crate) consumer: ConsumerName,
    pub(crate) principal: Principal,
    pub(crate) replayed: Vec<HeaderName>,
    pub(crate) unstored: Vec<StatusCode>,
    pub(crate) bodies: BodyComparison,
    pub(crate) retention: Duration,
    pub(crate) lease: Duration,
    pub(crate) body_limit: usize,
    pub(crate) response_limit: usize,
    pub(crate) in_flight: Arc<InFlight>,
}

/// Configures an [`Idempotency`]; [`IdempotencyBuilder::build`] checks it.
#[derive(Debug, Clone)]
#[must_use]
pub struct IdempotencyBuilder {
    inbox: Inbox,
    consumer: String,
    principal: Principal,
    replayed: Vec<HeaderName>,
    unstored: Vec<StatusCode>,
    bodies: BodyComparison,
    retention: Duration,
    lease: Duration,
    body_limit: usize,
    response_limit: usize,
}

impl Idempotency {
    /// How long a completed request's key and response are kept by default: a day, as most
    /// payment APIs keep theirs.
    pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 60 * 60);

    /// The largest body buffered by default (1 MiB): the body is read whole, to fingerprint it.
    pub const DEFAULT_BODY_LIMIT: usize = 1024 * 1024;

    /// The largest response kept by default (1 MiB), to replay.
    pub const DEFAULT_RESPONSE_LIMIT: usize = 1024 * 1024;

    /// The statuses not stored by default: 401 and 403 (authentication and authorization), 415
    /// (the content type) and 429 (a rate limit) answer checks made before the work.
    pub const DEFAULT_UNSTORED_STATUSES: [StatusCode; 4] = [
        StatusCode::UNAUTHORIZED,
        StatusCode::FORBIDDEN,
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        StatusCode::TOO_MANY_REQUESTS,
    ];

    /// Starts configuring keys kept in `inbox` under the consumer name `consumer` (the first
    /// half of each inbox key, as a message consumer's; keep it stable: renaming it forgets
    /// every key), scoped per `principal`.
    pub fn builder(
        inbox: Inbox,
        consumer: impl Into<String>,
        principal: Principal,
    ) -> IdempotencyBuilder {
        IdempotencyBuilder {
            inbox,
            consumer: consumer.into(),
            principal,
            // What a client needs to read a replay as it read the first response.
            replayed: vec![CONTENT_TYPE, CONTENT_ENCODING, CONTENT_LANGUAGE, LOCATION],
            unstored: Self::DEFAULT_UNSTORED_STATUSES.to_vec(),
            // The draft compares requests as sent.
            bodies: BodyComparison::Bytes,
            retention: Self::DEFAULT_RETENTION,
            // A claim's lease, renewed while the service runs: the time a crashed process
            // holds a key.
            lease: idem_runtime::Mode::DEFAULT_LEASE,
            body_limit: Self::DEFAULT_BODY_LIMIT,
            response_limit: Self::DEFAULT_RESPONSE_LIMIT,
        }
    }

    /// The retention the inbox applies to this consumer's records.
    pub(crate) fn applied_retention(&self) -> Duration {
        (self.inbox.retention()).retention_for(self.consumer.as_str(), Some(self.retention))
    }
}

impl IdempotencyBuilder {
    /// The headers a replay carries besides status and body (`Content-Type`,
    /// `Content-Encoding`, `Content-Language` and `Location` by default): the ones named here
    /// replace them. Their values are replayed byte for byte, UTF-8 or not.
    pub fn replay_headers(mut self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        self.replayed = names.into_iter().collect();
        self
    }

    /// The statuses of responses that are sent but not stored, leaving the key free for the
    /// retry ([`Idempotency::DEFAULT_UNSTORED_STATUSES`] by default: 401, 403, 415, 429): those
    /// that checks made before the work answer. A transactional endpoint's writes roll back with
    /// such a response. Name none to store every response, as the draft's strictest reading
    /// does; a service that answers one of these statuses after doing its work must not be
    /// behind the guard with them, as its retry would run it again.
    pub fn unstored_statuses(mut self, statuses: impl IntoIterator<Item = StatusCode>) -> Self {
        self.unstored = statuses.into_iter().collect();
        self
    }

    /// How request bodies are compared to tell a retry from a key reused for another request
    /// ([`BodyComparison::Bytes`] by default).
    pub fn body_comparison(mut self, bodies: BodyComparison) -> Self {
        self.bodies = bodies;
        self
    }

    /// How long a completed request's key and response are kept
    /// ([`Idempotency::DEFAULT_RETENTION`] unless the inbox's retention policy names this
    /// consumer), published in each response's [`RETENTION_HEADER`](crate::RETENTION_HEADER).
    /// Less than a millisecond is refused by [`IdempotencyBuilder::build`].
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// With [`Idempotency::layer`]: how long a request's claim holds without its worker renewing
    /// it (a crashed process's key is free again after it; the worker renews it while the
    /// service runs). Less than a millisecond is refused by [`IdempotencyBuilder::build`].
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// The largest request body accepted, in bytes; a larger one gets 413.
    pub fn body_limit(mut self, bytes: usize) -> Self {
        self.body_limit = bytes;
        self
    }

    /// The largest response kept, in bytes. A layered service's larger one (a stream that does
    /// not end, an export) is answered with a 500 that is kept in its place, since the service
    /// ran: such routes are not for the layer. A transactional endpoint's is answered with 500
    /// and rolled back, the key free again.
    pub fn response_limit(mut self, bytes: usize) -> Self {
        self.response_limit = bytes;
        self
    }

    /// Checks the configuration.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConsumer`]: the consumer name is empty, longer than 128 bytes or holds a
    /// NUL character. [`Error::Config`] ([`ConfigError::Zero`]): the retention or the lease is
    /// less than a millisecond (records are kept in whole milliseconds: every request would
    /// fail).
    pub fn build(self) -> Result<Idempotency, Error> {
        let consumer = ConsumerName::new(self.consumer).map_err(Error::InvalidConsumer)?;
        for (name, duration) in [("retention", self.retention), ("lease", self.lease)] {
            if duration.as_millis() == 0 {
                return Err(ConfigError::Zero(name).into());
            }
        }
        Ok(Idempotency {
            // A retry of a key another request holds is answered 409 at once, its connection
            // given back, rather than waiting for that request's lock.
            inbox: self.inbox.without_claim_wait(),
            consumer,
            principal: self.principal,
            replayed: self.replayed,
            unstored: self.unstored,
            bodies: self.bodies,
            retention: self.retention,
            lease: self.lease,
            body_limit: self.body_limit,
            response_limit: self.response_limit,
            in_flight: Arc::default(),
        })
    }
}
