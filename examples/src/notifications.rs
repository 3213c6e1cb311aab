//! The notifications service: tells each customer once that they were invoiced, by calling a
//! notification provider over HTTP. The call cannot join a database transaction, so the handler
//! runs in two-phase mode and passes a key derived from the message as the provider's
//! `Idempotency-Key`: a repeat after a crash or a takeover sends the same key, and the provider
//! deduplicates it.
//!
//! # Its queue
//!
//! The queue belongs to the service that reads it: notifications declares
//! `notifications.invoices`, bound to billing's events exchange, when it starts; billing
//! declares only the exchange it publishes to, and knows nothing of who subscribes. A queue
//! outlives its reader, though: while notifications is away (stopped, deploying, or never
//! started again after a demo), billing's events wait there. So the queue is bounded, as every
//! queue on a shared broker should be: at most [`MAX_LENGTH`] events wait
//! (`x-max-length`). Past that the broker refuses billing's publishes (the quorum queue's
//! `x-overflow = reject-publish`, which idem sets), and billing's outbox relay holds the events
//! in billing's own database and tries them again later: none is lost, the backlog waits where
//! billing's operator sees it (`idem_outbox_publish_failures_total{reason="refused"}`), and a
//! subscriber that went away cannot fill the broker's memory and disk, which would block every
//! publisher on it.
//!
//! Not a message TTL: a notification a customer is owed does not go stale in an hour, and
//! expired events would be dropped or pile up in the dead-letter queue instead. Not a queue
//! expiry (`x-expires`): deleting the subscription of a service that is only down would drop
//! the events billing publishes meanwhile. A deployment sets the bound from its own figures
//! (the publish rate times the longest outage the queue must ride out), often as an operator
//! policy (`rabbitmqctl set_policy ... '{"max-length": N}' --apply-to queues`), which can be
//! changed without declaring the queue again; the lower of the two bounds applies.
//!
//! The arguments of a queue are fixed when it is declared: a `notifications.invoices` declared
//! by an earlier version of this example, without the bound, is refused at start with
//! `PRECONDITION_FAILED`. Delete it (`rabbitmqctl delete_queue notifications.invoices`, which
//! drops the events it holds), and the next start declares it bounded.

use std::time::Duration;

use idem_rabbitmq::lapin::options::{
    ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use idem_rabbitmq::lapin::types::{AMQPValue, FieldTable, ShortString};
use idem_rabbitmq::lapin::{Channel, ExchangeKind};
use idem_rabbitmq::{AmqpUrl, QueueKind, QueueTopology};
use idem_runtime::idempotent;
use idem_runtime::outbox::Outbound;
use serde::{Deserialize, Serialize};

use crate::amqp_error;
use crate::billing::INVOICE_ISSUED;

/// The queue notifications consumes.
pub const QUEUE: &str = "notifications.invoices";

/// The consumer name of the notifications handler.
pub const CONSUMER: &str = "notifications.invoice";

/// How many events the queue holds at most: about a megabyte of `InvoiceIssued`, a few seconds
/// of work for the service when it comes back. Past it, billing's outbox keeps them.
pub const MAX_LENGTH: u32 = 10_000;

/// The broker's delivery limit on the queue.
pub const DELIVERY_LIMIT: u32 = 20;

/// The `Idempotency-Key` the notification of `order_id`'s invoice carries, on every attempt.
pub fn idempotency_key(order_id: &str) -> Option<String> {
    let origin = idem_runtime::admin::InboxKey {
        consumer: idem_runtime::admin::ConsumerName::new(CONSUMER).ok()?,
        message_key: idem_runtime::MessageKey::new(order_id).ok()?,
    };
    Some(idem_runtime::outbox::derived_id(&origin, 0))
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

/// The queue as the consumer sees it: declared by [`declare`] (with the bound, which
/// [`QueueTopology`] does not declare), so the consumer only checks it: a quorum queue, its
/// dead letters to the fanout exchange `<queue>.dlx` and the queue `<queue>.dlq`.
pub fn topology_on(queue: &str) -> QueueTopology {
    QueueTopology::existing(queue, format!("{queue}.dlx"))
        .queue_kind(QueueKind::Quorum)
        .delivery_limit(DELIVERY_LIMIT)
}

/// [`topology_on`] with the default name.
pub fn topology() -> QueueTopology {
    topology_on(QUEUE)
}

/// Declares the notifications queue `queue`, bounded to [`MAX_LENGTH`] events, with its
/// dead-letter exchange and queue, and binds it to billing's `events_exchange` (declared too,
/// durable, if missing). Declaring again is a no-op.
///
/// # Errors
///
/// The broker cannot be reached, or refuses a declaration: `PRECONDITION_FAILED` when the
/// queue exists with other arguments (see the [module docs](self)).
pub async fn declare(
    amqp_url: &AmqpUrl,
    queue: &str,
    events_exchange: &str,
) -> Result<(), idem_rabbitmq::Error> {
    let connection = idem_rabbitmq::amqp::connect(amqp_url, "notifications topology").await?;
    let declared = match connection.create_channel().await {
        Ok(channel) => declare_on(&channel, queue, events_exchange).await,
        Err(error) => Err(amqp_error("channel.open")(error)),
    };
    let _ =
        idem_rabbitmq::amqp::close_within(&connection, "declared", Duration::from_secs(5)).await;
    declared
}

async fn declare_on(
    channel: &Channel,
    queue: &str,
    events_exchange: &str,
) -> Result<(), idem_rabbitmq::Error> {
    let durable_exchange = ExchangeDeclareOptions {
        durable: true,
        ..ExchangeDeclareOptions::default()
    };
    let durable_queue = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    let (dlx, dlq) = (format!("{queue}.dlx"), format!("{queue}.dlq"));
    channel
        .exchange_declare(
            dlx.as_str().into(),
            ExchangeKind::Fanout,
            durable_exchange,
            FieldTable::default(),
        )
        .await
        .map_err(amqp_error(format!("declaring exchange {dlx:?}")))?;
    // Replicated as the queue is: a classic queue lives on one node of a cluster.
    let mut quorum = FieldTable::default();
    quorum.insert(
        ShortString::from("x-queue-type"),
        AMQPValue::LongString("quorum".into()),
    );
    channel
        .queue_declare(dlq.as_str().into(), durable_queue, quorum)
        .await
        .map_err(amqp_error(format!("declaring queue {dlq:?}")))?;
    channel
        .queue_bind(
            dlq.as_str().into(),
            dlx.as_str().into(),
            "".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(amqp_error(format!("binding {dlq:?}")))?;
    channel
        .queue_declare(queue.into(), durable_queue, queue_arguments(&dlx))
        .await
        .map_err(amqp_error(format!(
            "declaring queue {queue:?} with at most {MAX_LENGTH} messages (PRECONDITION_FAILED: \
             it exists with other arguments, such as a queue an earlier version declared without \
             a bound; `rabbitmqctl delete_queue {queue}` drops it and the events it holds)"
        )))?;
    channel
        .exchange_declare(
            events_exchange.into(),
            ExchangeKind::Topic,
            durable_exchange,
            FieldTable::default(),
        )
        .await
        .map_err(amqp_error(format!(
            "declaring exchange {events_exchange:?}"
        )))?;
    channel
        .queue_bind(
            queue.into(),
            events_exchange.into(),
            INVOICE_ISSUED.into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(amqp_error(format!(
            "binding {queue:?} to {events_exchange:?}"
        )))
}

/// The arguments idem gives a quorum queue it declares (type, dead-lettering that keeps a
/// message until the dead-letter queue has it, which needs `reject-publish`, and the delivery
/// limit), and the bound.
fn queue_arguments(dead_letter_exchange: &str) -> FieldTable {
    let mut arguments = FieldTable::default();
    let mut text = |name: &str, value: &str| {
        arguments.insert(ShortString::from(name), AMQPValue::LongString(value.into()));
    };
    text("x-queue-type", "quorum");
    text("x-dead-letter-exchange", dead_letter_exchange);
    text("x-dead-letter-strategy", "at-least-once");
    text("x-overflow", "reject-publish");
    let mut number = |name: &str, value: u32| {
        arguments.insert(
            ShortString::from(name),
            AMQPValue::LongLongInt(i64::from(value)),
        );
    };
    number("x-delivery-limit", DELIVERY_LIMIT);
    number("x-max-length", MAX_LENGTH);
    arguments
}

/// Starts the notifications service in this process: it declares its queue `queue`, bound to
/// `events_exchange`, and consumes it through `inbox`, calling the provider at `provider_url`.
///
/// # Errors
///
/// The broker cannot be reached or the queue declared.
pub async fn start(
    amqp_url: &AmqpUrl,
    inbox: idem_runtime::Inbox,
    queue: &str,
    events_exchange: &str,
    provider_url: String,
    connection_name: &str,
) -> Result<idem_rabbitmq::Consumer, idem_rabbitmq::Error> {
    declare(amqp_url, queue, events_exchange).await?;
    let service = std::sync::Arc::new(Notifications { provider_url });
    idem_rabbitmq::Consumer::builder(amqp_url.clone(), inbox)
        .connection_name(connection_name)
        // The billing consumer beside it runs the inbox's cleaner.
        .without_cleaner()
        .bind(topology_on(queue), service.notify_handler())
        .start()
        .await
}
