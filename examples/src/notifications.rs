//! The notifications service: tells each customer once that they were invoiced, by calling a
//! notification provider over HTTP. The call cannot join a database transaction, so the handler
//! runs in two-phase mode and passes a key derived from the message as the provider's
//! `Idempotency-Key`: a repeat after a crash or a takeover sends the same key, and the provider
//! deduplicates it.

use idem_rabbitmq::QueueTopology;
use idem_rabbitmq::lapin::ExchangeKind;
use idem_runtime::{Outbound, idempotent};
use serde::{Deserialize, Serialize};

use crate::billing::{EVENTS_EXCHANGE, INVOICE_ISSUED};

/// The queue notifications consumes.
pub const QUEUE: &str = "notifications.invoices";

/// The consumer name of the notifications handler.
pub const CONSUMER: &str = "notifications.invoice";

/// The `Idempotency-Key` the notification of `order_id`'s invoice carries, on every attempt.
pub fn idempotency_key(order_id: &str) -> Option<String> {
    let origin = idem_runtime::InboxKey {
        consumer: idem_runtime::ConsumerName::new(CONSUMER).ok()?,
        message_key: idem_runtime::MessageKey::new(order_id).ok()?,
    };
    Some(idem_runtime::derived_id(&origin, 0))
}

/// An invoice was issued: billing publishes it through its outbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InvoiceIssued {
    /// The order invoiced.
    pub order_id: String,
    /// Who pays.
    pub customer: String,
    /// How much, in cents.
    pub amount_cents: i64,
}

/// Why a notification failed.
#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    /// The provider could not be reached: worth retrying.
    #[error("provider unreachable: {0}")]
    Unreachable(#[from] std::io::Error),
    /// The provider refused the call.
    #[error("provider answered {0}")]
    Refused(u16),
}

/// The notifications service: where its provider is.
#[derive(Debug, Clone)]
pub struct Notifications {
    /// The provider's `POST` endpoint.
    pub provider_url: String,
}

impl Notifications {
    /// Notifies the customer of an invoice, once per invoice however often it is delivered.
    #[idempotent(key = event.order_id, consumer = "notifications.invoice", mode = two_phase, lease = "30s")]
    pub async fn notify(
        &self,
        outbound: &Outbound<'_>,
        event: InvoiceIssued,
    ) -> Result<(), NotifyError> {
        let key = outbound.downstream_key();
        let body = serde_json::to_vec(&event).expect("an event serializes");
        match crate::stub::post(&self.provider_url, &key, &body).await? {
            200..=299 => Ok(()),
            status => Err(NotifyError::Refused(status)),
        }
    }
}

/// The queue, its dead-letter queue and its binding to billing's events exchange.
pub fn topology_on(queue: &str, events_exchange: &str) -> QueueTopology {
    QueueTopology::quorum(queue).delivery_limit(20).bind(
        events_exchange,
        ExchangeKind::Topic,
        INVOICE_ISSUED,
    )
}

/// Starts the notifications service in this process: it consumes `queue`, bound to
/// `events_exchange`, through `inbox`, and calls the provider at `provider_url`.
///
/// # Errors
///
/// The broker cannot be reached or the topology declared.
pub async fn start(
    amqp_url: &str,
    inbox: idem_runtime::Inbox,
    queue: &str,
    events_exchange: &str,
    provider_url: String,
    connection_name: &str,
) -> Result<idem_rabbitmq::Consumer, idem_rabbitmq::Error> {
    let service = std::sync::Arc::new(Notifications { provider_url });
    idem_rabbitmq::Consumer::builder(amqp_url, inbox)
        .connection_name(connection_name)
        // The billing consumer beside it runs the inbox's cleaner.
        .without_cleaner()
        .bind(
            topology_on(queue, events_exchange),
            service.notify_handler(),
        )
        .start()
        .await
}

/// [`topology_on`] with the default names.
pub fn topology() -> QueueTopology {
    topology_on(QUEUE, EVENTS_EXCHANGE)
}
