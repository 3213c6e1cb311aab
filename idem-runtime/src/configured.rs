//! A handler's consumer name, lease and retention set at run time, over what its code says.

use std::future::Future;
use std::time::Duration;

use crate::context::Context;
use crate::fingerprint::{Fingerprint, FingerprintError};
use crate::handler::{Handler, Mode};
use crate::key::{KeyError, MessageKey};
use crate::metadata::Metadata;

/// A handler whose consumer name, two-phase lease or retention come from the application's
/// configuration (a file, the environment, a binding's settings) rather than from its code.
///
/// What `#[idempotent(consumer = ..., lease = ..., retention = ...)]` (or a hand-written
/// [`Handler`]) says is the default; a value set here replaces it. The inbox's own per-consumer
/// settings, [`InboxBuilder::lease`](crate::InboxBuilder::lease) and
/// [`RetentionPolicy::with_consumer`](crate::RetentionPolicy::with_consumer), still come
/// first. In order, the first that is set wins:
///
/// | setting | 1st | 2nd | 3rd | otherwise |
/// |---|---|---|---|---|
/// | consumer name | [`Configured::with_consumer`] | the handler's (`consumer = ...`) | | a free function's module path and name (a method has none: it must name its consumer, and a generic service bound for two type arguments gives each its own with [`Configured::with_consumer`]) |
/// | lease | `InboxBuilder::lease` | [`Configured::with_lease`] | the handler's (`lease = ...`) | [`Mode::DEFAULT_LEASE`] |
/// | retention | `RetentionPolicy::with_consumer` | [`Configured::with_retention`] | the handler's (`retention = ...`) | the policy's default (7 days) |
///
/// ```
/// use std::time::Duration;
/// use idem_runtime::{Handler, HandlerExt, Mode};
/// # use idem_runtime::{Context, KeyError, MessageKey, Metadata};
/// # use idem_runtime::fingerprint::{Fingerprint, FingerprintError};
/// # struct Mailer;
/// # impl Handler for Mailer {
/// #     type Message = String; type Output = (); type Error = std::io::Error;
/// #     fn consumer(&self) -> &str { "mailer" }
/// #     fn key(&self, m: &String, _: &Metadata) -> Result<MessageKey, KeyError> { MessageKey::new(m.as_str()) }
/// #     fn fingerprint(&self, _: &String, _: &Metadata) -> Result<Option<Fingerprint>, FingerprintError> { Ok(None) }
/// #     fn mode(&self) -> Mode { Mode::two_phase() }
/// #     async fn handle(&self, _: &Context<'_>, _: String) -> Result<(), std::io::Error> { Ok(()) }
/// # }
/// // From the environment, say: MAILER_LEASE_SECS=120.
/// let lease = std::env::var("MAILER_LEASE_SECS").ok().and_then(|s| s.parse().ok());
/// let mut mailer = Mailer.configured().with_consumer("eu.mailer");
/// if let Some(secs) = lease {
///     mailer = mailer.with_lease(Duration::from_secs(secs));
/// }
/// assert_eq!(mailer.consumer(), "eu.mailer");
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct Configured<H> {
    handler: H,
    consumer: Option<String>,
    lease: Option<Duration>,
    retention: Option<Duration>,
}

/// What every [`Handler`] can do besides handling: be configured at run time. Import it to call
/// `.configured()` on a handler (as tower's `ServiceExt` adds to every service).
pub trait HandlerExt: Handler + Sized {
    /// This handler with its consumer name, lease or retention set at run time, from the
    /// application's configuration; see [`Configured`] for which setting wins.
    fn configured(self) -> Configured<Self> {
        Configured::new(self)
    }
}

impl<H: Handler> HandlerExt for H {}

impl<H: Handler> Configured<H> {
    /// The handler as its code configures it.
    pub fn new(handler: H) -> Self {
        Self {
            handler,
            consumer: None,
            lease: None,
            retention: None,
        }
    }

    /// The consumer name: the first half of every inbox key. Records kept under the handler's
    /// own name are not found under this one.
    pub fn with_consumer(mut self, name: impl Into<String>) -> Self {
        self.consumer = Some(name.into());
        self
    }

    /// The lease of a two-phase handler's claims; a transactional handler has none, and keeps
    /// none. A zero lease is refused when the handler is bound
    /// ([`Processing::check_handler`](crate::transport::Processing::check_handler)).
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// How long the handler's completed records are kept.
    pub fn with_retention(mut self, retention: Duration) -> Self {
        self.retention = Some(retention);
        self
    }

    /// The handler inside.
    pub fn inner(&self) -> &H {
        &self.handler
    }
}

/// [`HandlerExt::configured`]: wraps any handler for run-time configuration.
#[diagnostic::do_not_recommend]
impl<H: Handler> Handler for Configured<H> {
    type Message = H::Message;
    type Output = H::Output;
    type Error = H::Error;

    fn consumer(&self) -> &str {
        self.consumer
            .as_deref()
            .unwrap_or_else(|| self.handler.consumer())
    }

    fn key(&self, message: &Self::Message, metadata: &Metadata) -> Result<MessageKey, KeyError> {
        self.handler.key(message, metadata)
    }

    fn fingerprint(
        &self,
        message: &Self::Message,
        metadata: &Metadata,
    ) -> Result<Option<Fingerprint>, FingerprintError> {
        self.handler.fingerprint(message, metadata)
    }

    fn mode(&self) -> Mode {
        match (self.handler.mode(), self.lease) {
            (Mode::TwoPhase { .. }, Some(lease)) => Mode::TwoPhase { lease },
            (mode, _) => mode,
        }
    }

    fn retention(&self) -> Option<Duration> {
        self.retention.or_else(|| self.handler.retention())
    }

    fn is_permanent(&self, error: &Self::Error) -> bool {
        self.handler.is_permanent(error)
    }

    fn is_expected(&self, error: &crate::Error) -> bool {
        self.handler.is_expected(error)
    }

    fn handle(
        &self,
        cx: &Context<'_>,
        message: Self::Message,
    ) -> impl Future<Output = Result<Self::Output, Self::Error>> + Send {
        self.handler.handle(cx, message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct TwoPhase;

    impl Handler for TwoPhase {
        type Message = String;
        type Output = ();
        type Error = std::io::Error;
        fn consumer(&self) -> &str {
            "code"
        }
        fn key(&self, m: &String, _: &Metadata) -> Result<MessageKey, KeyError> {
            MessageKey::new(m.as_str())
        }
        fn fingerprint(
            &self,
            _: &String,
            _: &Metadata,
        ) -> Result<Option<Fingerprint>, FingerprintError> {
            Ok(None)
        }
        fn mode(&self) -> Mode {
            Mode::TwoPhase {
                lease: Duration::from_secs(30),
            }
        }
        fn retention(&self) -> Option<Duration> {
            Some(Duration::from_secs(60))
        }
        async fn handle(&self, _: &Context<'_>, _: String) -> Result<(), std::io::Error> {
            Ok(())
        }
    }

    #[test]
    fn set_values_replace_the_code_and_unset_ones_keep_it() {
        let plain = TwoPhase.configured();
        assert_eq!(plain.consumer(), "code");
        assert_eq!(plain.mode(), TwoPhase.mode());
        assert_eq!(plain.retention(), Some(Duration::from_secs(60)));

        let set = TwoPhase
            .configured()
            .with_consumer("config")
            .with_lease(Duration::from_secs(5))
            .with_retention(Duration::from_secs(7));
        assert_eq!(set.consumer(), "config");
        assert_eq!(
            set.mode(),
            Mode::TwoPhase {
                lease: Duration::from_secs(5)
            }
        );
        assert_eq!(set.retention(), Some(Duration::from_secs(7)));
    }
}
