//! How a route is guarded: the inbox and consumer its keys are kept under, who the principal
//! is, which headers are replayed, and how long a key is kept.

use std::sync::Arc;
use std::time::Duration;

use http::HeaderName;
use http::header::{CONTENT_ENCODING, CONTENT_LANGUAGE, CONTENT_TYPE, LOCATION};
use http::request::Parts;
use idem_runtime::{ConsumerName, Inbox, KeyError};

/// Tells a request's principal (the authenticated user or client) from its parts, typically
/// from an extension the authentication layer in front put there.
type Principal = dyn Fn(&Parts) -> Option<String> + Send + Sync;

/// Names the route a request is for, keys being scoped per route.
type Scope = dyn Fn(&Parts) -> String + Send + Sync;

/// `Idempotency-Key` for a group of routes: where keys are kept, and how.
///
/// Build it once per route group, then take [`Idempotency::layer`] for any tower service (the
/// response is stored after it returns), or [`Idempotency::transactional`] for an
/// [`Endpoint`](crate::Endpoint) whose database writes, stored response and outbox stagings commit together.
#[derive(Clone)]
pub struct Idempotency {
    pub(crate) inbox: Inbox,
    pub(crate) consumer: ConsumerName,
    pub(crate) principal: Option<Arc<Principal>>,
    pub(crate) route: Option<Arc<Scope>>,
    pub(crate) replayed: Vec<HeaderName>,
    pub(crate) retention: Duration,
    pub(crate) lease: Duration,
    pub(crate) body_limit: usize,
    pub(crate) response_limit: usize,
}

impl std::fmt::Debug for Idempotency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idempotency")
            .field("consumer", &self.consumer)
            .field("principal", &self.principal.is_some())
            .field("scope", &self.route.is_some())
            .field("replayed", &self.replayed)
            .field("retention", &self.retention)
            .field("lease", &self.lease)
            .field("body_limit", &self.body_limit)
            .field("response_limit", &self.response_limit)
            .finish_non_exhaustive()
    }
}

impl Idempotency {
    /// How long a completed request's key and response are kept by default: a day, as most
    /// payment APIs keep theirs.
    pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 60 * 60);

    /// The largest body buffered by default (1 MiB): the body is read whole, to fingerprint it.
    pub const DEFAULT_BODY_LIMIT: usize = 1024 * 1024;

    /// The largest response kept by default (1 MiB), to replay.
    pub const DEFAULT_RESPONSE_LIMIT: usize = 1024 * 1024;

    /// Keys kept in `inbox` under the consumer name `consumer` (the first half of each inbox
    /// key, as a message consumer's; keep it stable: renaming it forgets every key).
    ///
    /// # Errors
    ///
    /// The consumer name is empty, longer than 128 bytes or holds a NUL character.
    pub fn new(inbox: Inbox, consumer: impl Into<String>) -> Result<Self, KeyError> {
        Ok(Self {
            inbox,
            consumer: ConsumerName::new(consumer)?,
            principal: None,
            route: None,
            replayed: vec![CONTENT_TYPE, CONTENT_ENCODING, CONTENT_LANGUAGE, LOCATION],
            retention: Self::DEFAULT_RETENTION,
            lease: idem_runtime::Mode::DEFAULT_LEASE,
            body_limit: Self::DEFAULT_BODY_LIMIT,
            response_limit: Self::DEFAULT_RESPONSE_LIMIT,
        })
    }

    /// Scopes keys per principal as well as per route: `principal` reads it from the request
    /// (an extension the authentication in front set, a verified header). Requests for which it
    /// gives `None` share the anonymous scope. Without it every client of a route shares its
    /// keys: set it on any API with more than one client.
    pub fn principal(
        mut self,
        principal: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.principal = Some(Arc::new(principal));
        self
    }

    /// Names the route a request is for: keys are scoped per route, which is the request's path
    /// by default. A layer inside `Router::nest` sees the path without the nest's prefix (with
    /// its parameters, such as a tenant's id): scope such routes by the original URI (axum's
    /// `OriginalUri` extension), or apply the layer outside the nest.
    pub fn scope(mut self, route: impl Fn(&Parts) -> String + Send + Sync + 'static) -> Self {
        self.route = Some(Arc::new(route));
        self
    }

    /// The headers a replay carries besides status and body (`Content-Type`,
    /// `Content-Encoding`, `Content-Language` and `Location` by default): the ones named here
    /// replace them.
    pub fn replay_headers(mut self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        self.replayed = names.into_iter().collect();
        self
    }

    /// How long a completed request's key and response are kept ([`Self::DEFAULT_RETENTION`]
    /// unless the inbox's retention policy names this consumer), published in each response's
    /// [`RETENTION_HEADER`](crate::RETENTION_HEADER).
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// With [`Idempotency::layer`]: how long a request's claim holds without its worker renewing
    /// it (a crashed process's key is free again after it; the worker renews it while the
    /// service runs).
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

    /// The route `parts` is for.
    pub(crate) fn route_of(&self, parts: &Parts) -> String {
        match &self.route {
            Some(route) => route(parts),
            None => parts.uri.path().to_owned(),
        }
    }

    /// The retention the inbox applies to this consumer's records.
    pub(crate) fn applied_retention(&self) -> Duration {
        (self.inbox.retention()).retention_for(self.consumer.as_str(), Some(self.retention))
    }
}
