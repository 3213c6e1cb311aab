//! The handler downstream of the relay: it consumes what the handler under test staged in the
//! outbox and the relay published, through an inbox of its own, as the next service does.

use std::fmt;

use futures_util::FutureExt;
use futures_util::future::LocalBoxFuture;
use idem_runtime::sea_orm::{DatabaseConnection, DbErr};
use idem_runtime::{Handler, Inbox};
use serde::de::DeserializeOwned;

use crate::delivery::{Fate, deliver, delivery_metadata, is_two_phase, key_label};
use crate::effects::Effects;
use crate::relay::Published;
use crate::schedule::Boundary;

/// A handler that consumes the messages the handler under test stages for `exchange`, with
/// what counts as its effects. The kit's relay publishes the outbox's messages; those for
/// `exchange` reach this handler (their payload read as JSON), the others are dropped.
///
/// ```no_run
/// # use idem_runtime::{Context, Handler, KeyError, MessageKey, Metadata};
/// # use idem_runtime::fingerprint::{Fingerprint, FingerprintError};
/// # #[derive(serde::Serialize, serde::Deserialize)]
/// # struct InvoiceIssued { order_id: String }
/// # struct Notify;
/// # impl Handler for Notify {
/// #     type Message = InvoiceIssued; type Output = (); type Error = std::io::Error;
/// #     fn consumer(&self) -> &str { "notifications" }
/// #     fn key(&self, m: &InvoiceIssued, _: &Metadata) -> Result<MessageKey, KeyError> { MessageKey::new(m.order_id.as_str()) }
/// #     fn fingerprint(&self, m: &InvoiceIssued, meta: &Metadata) -> Result<Option<Fingerprint>, FingerprintError> { meta.content_fingerprint(m).map(Some) }
/// #     async fn handle(&self, _: &Context<'_>, _: InvoiceIssued) -> Result<(), std::io::Error> { Ok(()) }
/// # }
/// use idem_testkit::{Downstream, Effects};
///
/// let notified = Downstream::new(
///     "billing.events",
///     Notify,
///     Effects::rows("notifications", "order_id", |event: &InvoiceIssued| event.order_id.clone()),
/// );
/// ```
pub struct Downstream<H: Handler> {
    exchange: String,
    handler: H,
    effects: Effects<H::Message>,
}

impl<H: Handler> Downstream<H>
where
    H::Message: DeserializeOwned,
{
    /// `handler` consuming what is published to `exchange`, its effects counted by `effects`.
    pub fn new(exchange: impl Into<String>, handler: H, effects: Effects<H::Message>) -> Self {
        Self {
            exchange: exchange.into(),
            handler,
            effects,
        }
    }
}

impl<H: Handler> fmt::Debug for Downstream<H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Downstream")
            .field("exchange", &self.exchange)
            .field("consumer", &self.handler.consumer())
            .field("effects", &self.effects)
            .finish()
    }
}

/// What the kit needs of a downstream handler, whatever its message type.
pub(crate) trait Route {
    /// The exchange its queue is bound to.
    fn exchange(&self) -> &str;
    /// Its consumer name.
    fn consumer(&self) -> &str;
    /// Whether it runs in two-phase mode.
    fn two_phase(&self) -> bool;
    /// Delivers `published` to it, crashing at `crash`.
    fn deliver<'a>(
        &'a self,
        inbox: &'a Inbox,
        published: &'a Published,
        crash: Option<Boundary>,
    ) -> LocalBoxFuture<'a, Fate>;
    /// The effects of `published` and the key the handler gives it.
    fn count<'a>(
        &'a self,
        db: &'a DatabaseConnection,
        published: &'a Published,
    ) -> LocalBoxFuture<'a, Result<(u64, String), DbErr>>;
}

impl<H: Handler> Route for Downstream<H>
where
    H::Message: DeserializeOwned,
{
    fn exchange(&self) -> &str {
        &self.exchange
    }

    fn consumer(&self) -> &str {
        self.handler.consumer()
    }

    fn two_phase(&self) -> bool {
        is_two_phase(&self.handler)
    }

    fn deliver<'a>(
        &'a self,
        inbox: &'a Inbox,
        published: &'a Published,
        crash: Option<Boundary>,
    ) -> LocalBoxFuture<'a, Fate> {
        async move {
            let message = match serde_json::from_slice::<H::Message>(&published.payload) {
                Ok(message) => message,
                // As a transport's codec does with a payload it cannot read.
                Err(error) => return Fate::DeadLettered(format!("undecodable: {error}")),
            };
            let metadata = delivery_metadata(&published.metadata(), published.deliveries);
            deliver(inbox, &self.handler, message, &metadata, crash).await
        }
        .boxed_local()
    }

    fn count<'a>(
        &'a self,
        db: &'a DatabaseConnection,
        published: &'a Published,
    ) -> LocalBoxFuture<'a, Result<(u64, String), DbErr>> {
        async move {
            match serde_json::from_slice::<H::Message>(&published.payload) {
                Ok(message) => {
                    let key = key_label(&self.handler, &message, &published.metadata());
                    Ok((self.effects.count(db, &message).await?, key))
                }
                Err(error) => Ok((0, format!("none: undecodable payload: {error}"))),
            }
        }
        .boxed_local()
    }
}
