//! Declaring a work queue with its dead-letter exchange and queue, idempotently.

use std::time::Duration;

use lapin::options::{
    BasicCancelOptions, BasicConsumeOptions, BasicQosOptions, ExchangeDeclareOptions,
    QueueBindOptions, QueueDeclareOptions,
};
use lapin::protocol::{AMQPErrorKind, AMQPHardError, AMQPSoftError};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{Channel, Connection, ConnectionProperties, ErrorKind, ExchangeKind};

use crate::connect::close_within;
use crate::error::{Error, Result, SettingError};
use crate::queue_kind::QueueKind;
use crate::url::AmqpUrl;

/// An exchange the work queue is bound to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExchangeBinding {
    /// The exchange's name.
    pub exchange: String,
    /// The exchange's type, declared durable.
    pub kind: ExchangeKind,
    /// The binding's routing key (or pattern, for a topic exchange).
    pub routing_key: String,
}

/// A work queue, its dead-letter exchange and queue, and its bindings.
///
/// [`QueueTopology::declare`] declares them all, durable; declaring again is a no-op, and a
/// queue that exists with other arguments is reported, never changed. The dead-letter exchange is
/// a fanout exchange named `<queue>.dlx` bound to the queue `<queue>.dlq`, unless named
/// otherwise. An application that manages its own topology skips `declare` and names its queue
/// and dead-letter exchange with [`QueueTopology::existing`].
///
/// The queue's type decides how the consumer requeues without counting a delivery (a classic
/// queue takes a `basic.nack`, which a quorum queue before RabbitMQ 4.3 counts toward its
/// delivery limit). For an existing queue the consumer asks the broker at start, or checks the
/// type stated with [`QueueTopology::queue_kind`] and refuses to start if the broker disagrees.
///
/// ```
/// use idem_rabbitmq::QueueTopology;
/// use lapin::ExchangeKind;
///
/// let topology = QueueTopology::quorum("billing.orders")
///     .delivery_limit(10)
///     .bind("orders", ExchangeKind::Topic, "order.placed");
/// assert_eq!(topology.dead_letter_queue(), "billing.orders.dlq");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueTopology {
    queue: String,
    /// `None`: an existing queue whose type the broker tells.
    kind: Option<QueueKind>,
    dead_letter_exchange: String,
    dead_letter_routing_key: Option<String>,
    dead_letter_queue: String,
    dead_letter_kind: QueueKind,
    delivery_limit: Option<u32>,
    bindings: Vec<ExchangeBinding>,
    declare: bool,
}

impl QueueTopology {
    /// A classic durable work queue.
    pub fn classic(queue: impl Into<String>) -> Self {
        Self::new(queue.into(), QueueKind::Classic)
    }

    /// A quorum work queue.
    pub fn quorum(queue: impl Into<String>) -> Self {
        Self::new(queue.into(), QueueKind::Quorum)
    }

    /// A queue and dead-letter exchange that already exist and that idem must not declare. The
    /// consumer learns the queue's type from the broker (or checks the one stated with
    /// [`queue_kind`](QueueTopology::queue_kind)); the broker does not tell its
    /// `x-dead-letter-routing-key`: give it with
    /// [`dead_letter_routing_key`](QueueTopology::dead_letter_routing_key). On a quorum queue,
    /// requeues that do not count (database unreachable, message in progress elsewhere) are
    /// fresh copies that reach the queue by its name: should the broker dead-letter one itself
    /// (its `x-delivery-limit`, a TTL), it routes it by that name. Unless the dead-letter
    /// exchange is a fanout or the key is given, bind the dead-letter queue for the queue's name
    /// too, or state the queue's limit with
    /// [`delivery_limit`](QueueTopology::delivery_limit), so that the consumer dead-letters a
    /// failing message first; the consumer warns at start.
    ///
    /// ```
    /// use idem_rabbitmq::{QueueKind, QueueTopology};
    ///
    /// let topology = QueueTopology::existing("billing.orders", "dead-letters")
    ///     .queue_kind(QueueKind::Quorum)
    ///     .dead_letter_routing_key("billing");
    /// assert_eq!(topology.kind(), Some(QueueKind::Quorum));
    /// ```
    pub fn existing(queue: impl Into<String>, dead_letter_exchange: impl Into<String>) -> Self {
        let mut topology = Self::new(queue.into(), QueueKind::Classic);
        topology.kind = None;
        topology.dead_letter_exchange = dead_letter_exchange.into();
        topology.declare = false;
        topology
    }

    /// States the queue's type. For an [`existing`](QueueTopology::existing) queue, the
    /// consumer checks it against the broker at start and refuses to start if they differ;
    /// without it, the consumer takes the broker's word.
    pub fn queue_kind(mut self, kind: QueueKind) -> Self {
        self.kind = Some(kind);
        self
    }

    fn new(queue: String, kind: QueueKind) -> Self {
        Self {
            dead_letter_exchange: format!("{queue}.dlx"),
            dead_letter_routing_key: None,
            dead_letter_queue: format!("{queue}.dlq"),
            dead_letter_kind: kind,
            queue,
            kind: Some(kind),
            delivery_limit: None,
            bindings: Vec::new(),
            declare: true,
        }
    }

    /// The type of the dead-letter queue idem declares: by default the work queue's, so that a
    /// quorum work queue's dead letters are replicated as it is (a classic queue lives on one
    /// node of a cluster: while that node is down, a consumer can neither declare it nor
    /// dead-letter into it). A classic dead-letter queue declared by an earlier version, which
    /// declared every dead-letter queue classic, is kept with `QueueKind::Classic`.
    pub fn dead_letter_queue_kind(mut self, kind: QueueKind) -> Self {
        self.dead_letter_kind = kind;
        self
    }

    /// Names the dead-letter exchange and queue.
    pub fn dead_letter(mut self, exchange: impl Into<String>, queue: impl Into<String>) -> Self {
        self.dead_letter_exchange = exchange.into();
        self.dead_letter_queue = queue.into();
        self
    }

    /// The routing key of dead-lettered messages (`x-dead-letter-routing-key`), both those the
    /// broker dead-letters and the copies the consumer publishes; without it, each message's own
    /// routing key. For an [`existing`](QueueTopology::existing) queue, give the key of its
    /// `x-dead-letter-routing-key` argument, which the broker does not tell its clients: a
    /// direct dead-letter exchange routes copies by it.
    pub fn dead_letter_routing_key(mut self, routing_key: impl Into<String>) -> Self {
        self.dead_letter_routing_key = Some(routing_key.into());
        self
    }

    /// The broker's delivery limit (`x-delivery-limit`, quorum queues): a message delivered more
    /// often is dead-lettered by the broker. It catches messages whose processing crashes the
    /// consumer; the consumer's own limit
    /// ([`ConsumerBuilder::max_deliveries`](crate::ConsumerBuilder::max_deliveries)) catches
    /// the rest with a reason, and when this limit is lower, the consumer dead-letters a failing
    /// message itself at the delivery after which the broker would. For an
    /// [`existing`](QueueTopology::existing) quorum queue, state the queue's limit here: the
    /// broker does not tell it.
    pub fn delivery_limit(mut self, limit: u32) -> Self {
        self.delivery_limit = Some(limit);
        self
    }

    /// Binds the queue to `exchange` (declared durable, of `kind`) with `routing_key`.
    pub fn bind(
        mut self,
        exchange: impl Into<String>,
        kind: ExchangeKind,
        routing_key: impl Into<String>,
    ) -> Self {
        self.bindings.push(ExchangeBinding {
            exchange: exchange.into(),
            kind,
            routing_key: routing_key.into(),
        });
        self
    }

    /// The work queue's name.
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// The queue type: `None` for an [`existing`](QueueTopology::existing) queue whose type
    /// was not stated, which the consumer learns from the broker.
    pub fn kind(&self) -> Option<QueueKind> {
        self.kind
    }

    /// The dead-letter exchange's name.
    pub fn dead_letter_exchange(&self) -> &str {
        &self.dead_letter_exchange
    }

    /// The routing key of dead-lettered messages, if not their own.
    pub fn dead_letter_key(&self) -> Option<&str> {
        self.dead_letter_routing_key.as_deref()
    }

    /// The dead-letter queue's name.
    pub fn dead_letter_queue(&self) -> &str {
        &self.dead_letter_queue
    }

    /// The broker's delivery limit, if set.
    pub fn broker_delivery_limit(&self) -> Option<u32> {
        self.delivery_limit
    }

    /// Warns, for an [`existing`](QueueTopology::existing) quorum queue without a dead-letter
    /// routing key whose dead-letter exchange is not a durable fanout (checked by declaring it
    /// so on a channel of its own, which the broker closes if it is not), that the fresh copies
    /// of uncounted requeues would be lost if the broker dead-lettered them itself: they reach
    /// the queue by its name, the broker dead-letters them by that name, and an exchange that
    /// routes by key may route it nowhere. (Requeueing the message itself instead would count
    /// every requeue of an outage toward the broker's delivery limit.)
    pub(crate) async fn warn_of_copies_routed_by_queue_name(&self, connection: &Connection) {
        if self.declare || self.dead_letter_routing_key.is_some() {
            return;
        }
        let Ok(channel) = connection.create_channel().await else {
            return;
        };
        let fanout = channel
            .exchange_declare(
                self.dead_letter_exchange.as_str().into(),
                ExchangeKind::Fanout,
                durable_exchange(),
                FieldTable::default(),
            )
            .await
            .is_ok();
        if fanout {
            let closing = channel.close(200, "dead-letter exchange checked".into());
            let _ = tokio::time::timeout(CHECK_CLOSE_TIMEOUT, closing).await;
            return;
        }
        tracing::warn!(
            queue = %self.queue,
            exchange = %self.dead_letter_exchange,
            "requeues that do not count are fresh copies routed by the queue's name: should the \
             broker dead-letter one itself (its delivery limit, a TTL), a dead-letter exchange \
             that routes by key routes it by that name; bind the dead-letter queue for it, give \
             the queue's x-dead-letter-routing-key with dead_letter_routing_key, or state its \
             x-delivery-limit with delivery_limit, so that the consumer dead-letters first"
        );
    }

    /// Declares the dead-letter exchange and queue, the work queue and its bindings; for an
    /// [`existing`](QueueTopology::existing) topology, only checks that the dead-letter exchange
    /// exists.
    pub async fn declare(&self, channel: &Channel) -> Result<()> {
        self.declare_with(channel, false).await
    }

    /// Declares as [`QueueTopology::declare`] does, for a broker of major version
    /// `broker_major` on `connection`: from RabbitMQ 4, which gives every quorum queue a
    /// delivery limit of 20, a quorum dead-letter queue is declared without one
    /// (`x-delivery-limit: -1`), so that an operator's looks at its letters (each given back
    /// counts) never bring one closer to being dropped; RabbitMQ 3 gives none (and would take -1
    /// as a limit of 0). One that exists with a limit is kept as it is, with a warning.
    pub(crate) async fn declare_for(
        &self,
        connection: &Connection,
        channel: &Channel,
        broker_major: Option<u32>,
    ) -> Result<()> {
        let unlimited =
            self.declares_quorum_dead_letters() && broker_major.is_some_and(|major| major >= 4);
        if !unlimited {
            return self.declare_with(channel, false).await;
        }
        // A try on a channel of its own: the broker closes the channel that redeclares a queue
        // with other arguments.
        let trial = connection
            .create_channel()
            .await
            .map_err(Error::amqp("channel.open"))?;
        let tried = trial
            .queue_declare(
                self.dead_letter_queue.as_str().into(),
                durable(),
                self.dead_letter_arguments(true),
            )
            .await;
        match tried {
            Ok(_) => {
                let _ =
                    tokio::time::timeout(CHECK_CLOSE_TIMEOUT, trial.close(200, "ok".into())).await;
                self.declare_with(channel, true).await
            }
            Err(error) if is_precondition_failed(&error) => {
                tracing::warn!(
                    queue = %self.dead_letter_queue,
                    %error,
                    "the dead-letter queue exists with a delivery limit (RabbitMQ 4 gives each \
                     quorum queue 20 unless it says -1): each look of `idem dlq` at its letters \
                     would count toward it, so idem dlq refuses it; lift it with a policy \
                     {{\"delivery-limit\": -1}}"
                );
                self.declare_with(channel, false).await
            }
            Err(source) => Err(Error::Amqp {
                operation: format!("queue.declare {}", self.dead_letter_queue),
                source,
            }),
        }
    }

    /// Whether it declares a quorum dead-letter queue, whose arguments differ between RabbitMQ 3
    /// and 4.
    pub(crate) fn declares_quorum_dead_letters(&self) -> bool {
        self.declare && self.dead_letter_kind == QueueKind::Quorum
    }

    /// Declares the topology, the quorum dead-letter queue without a delivery limit when
    /// `unlimited_dead_letters`.
    async fn declare_with(&self, channel: &Channel, unlimited_dead_letters: bool) -> Result<()> {
        if self.dead_letter_exchange.is_empty() {
            // The default exchange would route a dead-letter copy by its routing key, back to
            // the work queue.
            return Err(SettingError::NoDeadLetterExchange {
                queue: self.queue.clone(),
            }
            .into());
        }
        if !self.declare {
            return self.check_dead_letter_exchange(channel).await;
        }
        self.declare_dead_letter(channel, unlimited_dead_letters)
            .await?;
        channel
            .queue_declare(self.queue.as_str().into(), durable(), self.arguments())
            .await
            .map_err(declare_error("queue", &self.queue))?;
        self.declare_bindings(channel).await
    }

    /// Checks that the dead-letter exchange of an [`existing`](QueueTopology::existing)
    /// topology exists: one that is not there would fail every dead-lettering later, and close
    /// the channel that publishes the copies.
    async fn check_dead_letter_exchange(&self, channel: &Channel) -> Result<()> {
        let passive = ExchangeDeclareOptions {
            passive: true,
            ..ExchangeDeclareOptions::default()
        };
        channel
            .exchange_declare(
                self.dead_letter_exchange.as_str().into(),
                ExchangeKind::Fanout,
                passive,
                FieldTable::default(),
            )
            .await
            .map_err(Error::amqp(format!(
                "checking that the dead-letter exchange {:?} exists",
                self.dead_letter_exchange
            )))
    }

    /// Declares the dead-letter exchange (a durable fanout) and queue, and binds them.
    async fn declare_dead_letter(&self, channel: &Channel, unlimited: bool) -> Result<()> {
        channel
            .exchange_declare(
                self.dead_letter_exchange.as_str().into(),
                ExchangeKind::Fanout,
                durable_exchange(),
                FieldTable::default(),
            )
            .await
            .map_err(declare_error("exchange", &self.dead_letter_exchange))?;
        channel
            .queue_declare(
                self.dead_letter_queue.as_str().into(),
                durable(),
                self.dead_letter_arguments(unlimited),
            )
            .await
            .map_err(declare_error("queue", &self.dead_letter_queue))?;
        channel
            .queue_bind(
                self.dead_letter_queue.as_str().into(),
                self.dead_letter_exchange.as_str().into(),
                "".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(declare_error("binding of", &self.dead_letter_queue))
    }

    /// Declares the exchanges the work queue is bound to (durable), and binds it.
    async fn declare_bindings(&self, channel: &Channel) -> Result<()> {
        for binding in &self.bindings {
            channel
                .exchange_declare(
                    binding.exchange.as_str().into(),
                    binding.kind.clone(),
                    durable_exchange(),
                    FieldTable::default(),
                )
                .await
                .map_err(declare_error("exchange", &binding.exchange))?;
            channel
                .queue_bind(
                    self.queue.as_str().into(),
                    binding.exchange.as_str().into(),
                    binding.routing_key.as_str().into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .map_err(declare_error("binding of", &self.queue))?;
        }
        Ok(())
    }

    /// The dead-letter queue's arguments: its type (see
    /// [`dead_letter_queue_kind`](QueueTopology::dead_letter_queue_kind)), and for a quorum
    /// one on RabbitMQ 4 (`unlimited`), no delivery limit.
    fn dead_letter_arguments(&self, unlimited: bool) -> FieldTable {
        let mut arguments = FieldTable::default();
        // A classic one is declared without `x-queue-type`, as earlier versions declared it.
        if self.dead_letter_kind == QueueKind::Quorum {
            arguments.insert(
                ShortString::from("x-queue-type"),
                AMQPValue::LongString("quorum".into()),
            );
            if unlimited {
                arguments.insert(
                    ShortString::from("x-delivery-limit"),
                    AMQPValue::LongLongInt(-1),
                );
            }
        }
        arguments
    }

    /// The work queue's arguments: type, dead-letter exchange and delivery limit, which lapin has
    /// no helpers for.
    fn arguments(&self) -> FieldTable {
        let mut arguments = FieldTable::default();
        arguments.insert(
            ShortString::from("x-dead-letter-exchange"),
            AMQPValue::LongString(self.dead_letter_exchange.as_str().into()),
        );
        if let Some(routing_key) = &self.dead_letter_routing_key {
            arguments.insert(
                ShortString::from("x-dead-letter-routing-key"),
                AMQPValue::LongString(routing_key.as_str().into()),
            );
        }
        if self.kind == Some(QueueKind::Classic) && self.declare {
            // A virtual host may default to another type.
            arguments.insert(
                ShortString::from("x-queue-type"),
                AMQPValue::LongString("classic".into()),
            );
        }
        if self.kind == Some(QueueKind::Quorum) {
            let mut text = |name: &str, value: &str| {
                arguments.insert(ShortString::from(name), AMQPValue::LongString(value.into()));
            };
            text("x-queue-type", "quorum");
            // Without these, the broker's own dead-lettering (past `x-delivery-limit`) drops a
            // message that the dead-letter queue did not take.
            text("x-dead-letter-strategy", "at-least-once");
            text("x-overflow", "reject-publish");
            if let Some(limit) = self.delivery_limit {
                arguments.insert(
                    ShortString::from("x-delivery-limit"),
                    AMQPValue::LongLongInt(i64::from(limit)),
                );
            }
        }
        arguments
    }
}

/// The operation named by an error of the queue-type check's global prefetch.
const PROBE_QOS: &str = "basic.qos global";

/// How long closing a check's channel or connection is waited for.
const CHECK_CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

impl QueueTopology {
    /// The queue's type: the declared one; for an existing queue, the broker's, which must be
    /// the stated one if any.
    ///
    /// AMQP does not tell a queue's arguments (a passive `queue.declare` ignores them, and a
    /// redeclaration fails on the first argument it does not repeat), so the type is told by
    /// what only a quorum queue refuses: a consumer on a channel with a global prefetch
    /// (`NOT_IMPLEMENTED`, which closes the connection; hence a connection of its own, closed
    /// at once). On a classic queue that consumer exists for an instant, at the lowest
    /// priority; a message it may receive goes back to the queue when its connection closes.
    pub(crate) async fn resolve_kind(&self, url: &AmqpUrl, name: &str) -> Result<QueueKind> {
        if self.declare {
            return Ok(self.kind.unwrap_or(QueueKind::Classic));
        }
        let broker = match self.broker_kind(url, name).await {
            Ok(broker) => broker,
            // A broker that refuses the global prefetch itself (RabbitMQ 4.3 may deny it as a
            // deprecated feature) cannot be asked: the stated type is taken as it is.
            Err(Error::Amqp { operation, source }) if operation == PROBE_QOS => {
                let Some(stated) = self.kind else {
                    return Err(Error::Amqp {
                        operation: format!(
                            "{PROBE_QOS} (checking the type of the queue {}: state it with \
                             QueueTopology::queue_kind)",
                            self.queue
                        ),
                        source,
                    });
                };
                tracing::warn!(queue = %self.queue, %source, "the broker cannot tell the queue's type; taking the stated one");
                return Ok(stated);
            }
            Err(error) => return Err(error),
        };
        match self.kind {
            Some(stated) if stated != broker => Err(SettingError::QueueKindMismatch {
                queue: self.queue.clone(),
                broker,
                stated,
            }
            .into()),
            Some(_) => Ok(broker),
            None => {
                tracing::info!(queue = %self.queue, kind = broker.name(), "queue type from the broker");
                Ok(broker)
            }
        }
    }

    async fn broker_kind(&self, url: &AmqpUrl, name: &str) -> Result<QueueKind> {
        let properties = ConnectionProperties::default();
        let connection =
            crate::connect::open(url, &format!("{name} type check"), properties).await?;
        let kind = self.probe(&connection).await;
        let _ = close_within(&connection, "queue type checked", CHECK_CLOSE_TIMEOUT).await;
        kind
    }

    async fn probe(&self, connection: &Connection) -> Result<QueueKind> {
        let channel = connection
            .create_channel()
            .await
            .map_err(Error::amqp("channel.open"))?;
        channel
            .basic_qos(1, BasicQosOptions { global: true })
            .await
            .map_err(Error::amqp(PROBE_QOS))?;
        let mut arguments = FieldTable::default();
        arguments.insert(
            ShortString::from("x-priority"),
            AMQPValue::LongInt(i32::MIN),
        );
        let consumed = channel
            .basic_consume(
                self.queue.as_str().into(),
                "idem-queue-type-check".into(),
                BasicConsumeOptions::default(),
                arguments,
            )
            .await;
        match consumed {
            Ok(consumer) => {
                let _ = channel
                    .basic_cancel(consumer.tag(), BasicCancelOptions::default())
                    .await;
                Ok(QueueKind::Classic)
            }
            Err(error) if refuses_global_prefetch(&error) => Ok(QueueKind::Quorum),
            Err(source) => Err(Error::Amqp {
                operation: format!("basic.consume {} (checking the queue's type)", self.queue),
                source,
            }),
        }
    }
}

/// The type of the existing queue `queue` on the broker at `url`, told over AMQP alone (see
/// [`QueueTopology::existing`]): on a connection of its own named `connection_name`, a
/// consumer on a channel with a global prefetch, which only a quorum queue refuses. On a
/// classic queue that consumer exists for an instant, at the lowest priority; a message it may
/// receive goes back to its place when the connection closes.
///
/// # Errors
///
/// The broker cannot be reached, has no such queue, or refuses the global prefetch itself.
pub async fn queue_kind(url: &AmqpUrl, queue: &str, connection_name: &str) -> Result<QueueKind> {
    let topology = QueueTopology::existing(queue, "");
    topology.broker_kind(url, connection_name).await
}

/// Whether the broker refused an operation because it differs from what exists
/// (`PRECONDITION_FAILED`: a queue redeclared with other arguments).
fn is_precondition_failed(error: &lapin::Error) -> bool {
    matches!(
        error.kind(),
        ErrorKind::ProtocolError(amqp)
            if matches!(amqp.kind(), AMQPErrorKind::Soft(AMQPSoftError::PRECONDITIONFAILED))
    )
}

/// Whether the broker refused a consumer because its queue does not support a global prefetch,
/// as quorum (and stream) queues do.
fn refuses_global_prefetch(error: &lapin::Error) -> bool {
    matches!(
        error.kind(),
        ErrorKind::ProtocolError(amqp)
            if matches!(amqp.kind(), AMQPErrorKind::Hard(AMQPHardError::NOTIMPLEMENTED))
    )
}

/// The options of a queue that outlives a broker restart.
fn durable() -> QueueDeclareOptions {
    QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    }
}

/// The options of an exchange that outlives a broker restart.
fn durable_exchange() -> ExchangeDeclareOptions {
    ExchangeDeclareOptions {
        durable: true,
        ..ExchangeDeclareOptions::default()
    }
}

fn declare_error(what: &'static str, name: &str) -> impl FnOnce(lapin::Error) -> Error {
    let operation = format!(
        "declaring {what} {name:?} (a PRECONDITION_FAILED error means it exists with other arguments)"
    );
    Error::amqp(operation)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queues_carry_their_type_and_quorum_ones_dead_letter_exchange_and_limit() {
        let args = QueueTopology::quorum("q").delivery_limit(7).arguments();
        let args = args.inner();
        assert_eq!(
            args.get("x-queue-type"),
            Some(&AMQPValue::LongString("quorum".into()))
        );
        assert_eq!(
            args.get("x-dead-letter-exchange"),
            Some(&AMQPValue::LongString("q.dlx".into()))
        );
        assert_eq!(
            args.get("x-delivery-limit"),
            Some(&AMQPValue::LongLongInt(7))
        );
        assert_eq!(
            args.get("x-dead-letter-strategy"),
            Some(&AMQPValue::LongString("at-least-once".into()))
        );
        assert_eq!(
            QueueTopology::classic("q")
                .arguments()
                .inner()
                .get("x-queue-type"),
            Some(&AMQPValue::LongString("classic".into()))
        );
    }

    #[test]
    fn a_quorum_queue_dead_letters_into_a_quorum_queue_unless_told_otherwise() {
        let kind = |topology: QueueTopology| {
            topology
                .dead_letter_arguments(false)
                .inner()
                .get("x-queue-type")
                .cloned()
        };
        let quorum = Some(AMQPValue::LongString("quorum".into()));
        assert_eq!(kind(QueueTopology::quorum("q")), quorum);
        assert_eq!(kind(QueueTopology::classic("q")), None);
        let kept = QueueTopology::quorum("q").dead_letter_queue_kind(QueueKind::Classic);
        assert_eq!(kind(kept), None);
    }

    #[test]
    fn a_quorum_dead_letter_queue_has_no_delivery_limit_on_rabbitmq_4() {
        let limit = |topology: &QueueTopology, unlimited: bool| {
            (topology.dead_letter_arguments(unlimited).inner())
                .get("x-delivery-limit")
                .cloned()
        };
        let quorum = QueueTopology::quorum("q");
        assert_eq!(limit(&quorum, true), Some(AMQPValue::LongLongInt(-1)));
        assert_eq!(limit(&quorum, false), None, "RabbitMQ 3 takes -1 as 0");
        assert_eq!(limit(&QueueTopology::classic("q"), true), None);
    }

    #[test]
    fn a_dead_letter_routing_key_is_declared() {
        let topology = QueueTopology::classic("q").dead_letter_routing_key("dead");
        assert_eq!(topology.dead_letter_key(), Some("dead"));
        assert_eq!(
            topology
                .arguments()
                .inner()
                .get("x-dead-letter-routing-key"),
            Some(&AMQPValue::LongString("dead".into()))
        );
        assert!(
            !QueueTopology::classic("q")
                .arguments()
                .inner()
                .contains_key("x-dead-letter-routing-key")
        );
    }
}
