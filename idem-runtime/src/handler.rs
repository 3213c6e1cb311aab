//! The handler abstraction: what the macro generates and the transports drive.

use std::future::Future;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::context::Context;
use crate::fingerprint::{Fingerprint, FingerprintError};
use crate::key::{KeyError, MessageKey};
use crate::metadata::Metadata;

/// How a handler's effects are committed, and where the mark of a processed message is kept:
/// an inbox record (transactional, two-phase), the business entity (entity), or nowhere
/// (natural).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Mode {
    /// The Inbox pattern: claim, handler writes and outcome in one database transaction, which the
    /// handler receives through [`Context::transaction`]. A crash anywhere before the commit
    /// leaves nothing behind; after it, a redelivery finds the record.
    Transactional,
    /// For side effects that cannot join the transaction (HTTP calls, e-mail, another store): the
    /// message is claimed as in progress with a lease, the handler runs outside any transaction,
    /// and the record is completed only while the claim is still this worker's.
    ///
    /// Fencing stops a double *completion*, not a double external call: pass
    /// [`Context::message_key`] downstream as that service's idempotency key, and on a takeover
    /// ([`Context::attempt`] > 1) look the key up there before calling again.
    ///
    /// The lease is measured by the database's clock, the one clock every replica shares: a host
    /// whose clock is off does not shorten or lengthen anyone's lease.
    ///
    /// While the handler runs, the runtime renews its lease every third of the lease, fenced on
    /// the claim token: a live worker keeps its claim however long the handler runs. Only a
    /// worker that cannot reach the database (or whose process stopped) loses it, once a lease
    /// has passed since its last successful renewal; another worker may then take the message
    /// over. The handler learns of the loss through [`Context::claim_lost`] and
    /// [`Context::lost`], and its completion stays fenced: a worker whose claim was taken over
    /// never completes the record, and a takeover never reopens a record completed meanwhile.
    TwoPhase {
        /// How long a claim is held after it was taken or last renewed before another worker
        /// may take it over, by the database's clock.
        lease: Duration,
    },
    /// The key lives on the business entity, with no inbox record: the handler runs in a
    /// transaction and creates its entity with [`Context::create`], whose primary key comes from
    /// the message. Created, the message is new and the transaction commits; already there, it
    /// is a duplicate (or, with other content, a mismatch) and the transaction rolls back. See
    /// [`entity`](crate::entity) for when to choose it over the inbox.
    Entity,
    /// A naturally idempotent handler (an upsert keyed on a business id, an absolute state set
    /// with a version check that ignores older states): no bookkeeping at all. It runs in a
    /// transaction every time a copy comes, and every run is [`Outcome::Processed`]; the delivery
    /// policy, dead-letter reasons, metrics and tracing are the same as in the other modes.
    Natural,
}

impl Mode {
    /// The lease two-phase handlers get when none is given.
    pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

    /// Two-phase mode with the default lease.
    pub const fn two_phase() -> Self {
        Mode::TwoPhase {
            lease: Self::DEFAULT_LEASE,
        }
    }
}

/// What processing a message gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome<T> {
    /// The message was new (or, for a naturally idempotent handler, whatever it was); the
    /// handler ran and its effects committed, with its output in the inbox record (transactional
    /// and two-phase modes).
    Processed(T),
    /// The message had been processed before; this is the output recorded then. The handler did
    /// not run.
    Duplicate(T),
}

impl<T> Outcome<T> {
    /// The handler's output, fresh or recorded.
    pub fn into_inner(self) -> T {
        match self {
            Outcome::Processed(value) | Outcome::Duplicate(value) => value,
        }
    }

    /// Whether this was a duplicate.
    pub fn is_duplicate(&self) -> bool {
        matches!(self, Outcome::Duplicate(_))
    }
}

/// A message handler that the [`Inbox`](crate::Inbox) runs at most once per key.
///
/// `#[idempotent(...)]` implements this for an annotated function; it can also be written by
/// hand. Transports drive it: decode → [`Handler::key`] → claim → [`Handler::handle`] → record →
/// settle.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a message handler",
    label = "not a `Handler`",
    note = "an `#[idempotent]` function is not a handler itself: pass the handler generated next to it, `<function name>_handler()` (`charge_handler()` for `async fn charge`)"
)]
pub trait Handler: Send + Sync {
    /// The decoded message.
    type Message: Send;
    /// What the handler returns; stored with the record and returned again for duplicates.
    type Output: Serialize + DeserializeOwned + Send;
    /// The handler's own failure.
    type Error: std::error::Error + Send + Sync + 'static;

    /// The consumer name: the first half of the inbox key. Keep it stable: renaming it forgets
    /// what was processed.
    fn consumer(&self) -> &str;

    /// The message's key: a stable identity of the logical message.
    fn key(&self, message: &Self::Message, metadata: &Metadata) -> Result<MessageKey, KeyError>;

    /// What counts as "the same content" for this message; `Ok(None)` turns the check off.
    ///
    /// A handler that checks the whole message returns [`Metadata::content_fingerprint`]: the
    /// payload as received when a transport gave it, so that compatible changes to the message
    /// type do not turn redeliveries into mismatches (see [`Fingerprint`]).
    fn fingerprint(
        &self,
        message: &Self::Message,
        metadata: &Metadata,
    ) -> Result<Option<Fingerprint>, FingerprintError>;

    /// How effects are committed.
    fn mode(&self) -> Mode {
        Mode::Transactional
    }

    /// How long this handler's completed records are kept, when it says so itself. The
    /// [`RetentionPolicy`](crate::RetentionPolicy)'s per-consumer setting takes precedence.
    fn retention(&self) -> Option<Duration> {
        None
    }

    /// Whether `error` is permanent: retrying cannot help, so the message goes to the
    /// dead-letter queue at once. By default every handler error is transient: the message is
    /// requeued, up to the transport's delivery limit.
    fn is_permanent(&self, error: &Self::Error) -> bool {
        let _ = error;
        false
    }

    /// Whether `error`, an end of this handler's message, is expected rather than a failure: a
    /// client's mistake that the transport answers itself (an HTTP guard's 4xx, a key in use).
    /// Such an error is logged at debug level, not as a warning or an error; how it settles
    /// and how it is counted are unchanged. By default none is.
    fn is_expected(&self, error: &crate::Error) -> bool {
        let _ = error;
        false
    }

    /// Processes a message. In transactional mode, write effects through
    /// [`Context::transaction`].
    fn handle(
        &self,
        cx: &Context<'_>,
        message: Self::Message,
    ) -> impl Future<Output = Result<Self::Output, Self::Error>> + Send;
}

/// Forwards [`Handler`] through a pointer type, so `&H` and `Arc<H>` are handlers too.
macro_rules! forward_handler {
    ($($pointer:ty),*) => {$(
        impl<H: Handler + ?Sized> Handler for $pointer {
            type Message = H::Message;
            type Output = H::Output;
            type Error = H::Error;

            fn consumer(&self) -> &str {
                (**self).consumer()
            }
            fn key(&self, message: &Self::Message, metadata: &Metadata) -> Result<MessageKey, KeyError> {
                (**self).key(message, metadata)
            }
            fn fingerprint(
                &self,
                message: &Self::Message,
                metadata: &Metadata,
            ) -> Result<Option<Fingerprint>, FingerprintError> {
                (**self).fingerprint(message, metadata)
            }
            fn mode(&self) -> Mode {
                (**self).mode()
            }
            fn retention(&self) -> Option<Duration> {
                (**self).retention()
            }
            fn is_permanent(&self, error: &Self::Error) -> bool {
                (**self).is_permanent(error)
            }
            fn is_expected(&self, error: &crate::Error) -> bool {
                (**self).is_expected(error)
            }
            fn handle(
                &self,
                cx: &Context<'_>,
                message: Self::Message,
            ) -> impl Future<Output = Result<Self::Output, Self::Error>> + Send {
                (**self).handle(cx, message)
            }
        }
    )*};
}
forward_handler!(&H, std::sync::Arc<H>);
