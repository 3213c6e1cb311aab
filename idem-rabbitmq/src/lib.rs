//! RabbitMQ for idem: a lapin 4 consumer that runs idempotent handlers and settles every
//! delivery as the inbox decides, a publisher with confirms and stable message ids, and the
//! [`Relay`] that publishes what handlers staged in their transactional outbox.
//!
//! Data flows one way: delivery → decode ([`Codec`], JSON by default) → key (the handler's, from
//! the message or the [`Metadata`](idem_runtime::Metadata) this crate fills from the AMQP
//! properties: `message_id`, headers, CloudEvents `source` + `id` from `cloudEvents:` or
//! `cloudEvents_` headers) → [`Inbox`](idem_runtime::Inbox) → settle: ack, requeue within a
//! delivery limit, or dead-letter with a reason. See [`Consumer`] for the contract.
//!
//! ```no_run
//! use idem_rabbitmq::{Consumer, PublishOptions, Publisher, QueueTopology};
//! use idem_runtime::sea_orm::{Database, DatabaseTransaction, DbErr};
//! use idem_runtime::{Inbox, idempotent};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize)]
//! struct OrderPlaced { id: String, amount: i64 }
//!
//! #[idempotent(key = order.id, consumer = "billing")]
//! async fn charge(tx: &DatabaseTransaction, order: OrderPlaced) -> Result<i64, DbErr> {
//!     // write the charge through `tx`
//!     Ok(order.amount)
//! }
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let url = "amqp://guest:guest@127.0.0.1:5672/%2f";
//! let db = Database::connect("sqlite://billing.db?mode=rwc").await?;
//! let inbox = Inbox::builder(db).build().await?;
//! let topology = QueueTopology::quorum("billing.orders").delivery_limit(20);
//! let consumer = Consumer::builder(url, inbox).bind(topology, charge_handler()).start().await?;
//!
//! let publisher = Publisher::connect(url).await?;
//! let order = OrderPlaced { id: "o-1".into(), amount: 42 };
//! publisher.publish("", "billing.orders", &order, PublishOptions::default()).await?;
//!
//! consumer.run_until(async { let _ = tokio::signal::ctrl_c().await; }).await;
//! # Ok(()) }
//! ```
//!
//! # Features
//!
//! | feature | what it enables |
//! |---|---|
//! | `tls` | `amqps://` URLs, with rustls: the platform's root certificates, a private CA and a client certificate ([`TlsSettings`]) |
//! | `postgres` | a [`Relay`] on a PostgreSQL outbox is woken by commits in other processes (`LISTEN`) |
//! | `otel` | W3C Trace Context across services through `tracing-opentelemetry`: a delivery's span continues the trace its `traceparent` header (or CloudEvents' `cloudEvents:traceparent`) names, a batch's links every message's; [`Publisher`] publishes and outbox stagings carry the current span on (`idem_runtime::trace_context`) |
//!
//! # A cluster
//!
//! Give every connection a cluster's nodes: comma-separated URLs
//! (`amqp://u:p@rabbit-1/%2f,amqp://u:p@rabbit-2/%2f`) or [`AmqpUrl::nodes`]. Each connection
//! (the consumer's, its dead-letter copies', the publisher's, the relay's) tries them in turn,
//! starting from the last one reached, or from a random one with [`AmqpUrl::shuffled`], and
//! lapin's recovery moves to the next when its node goes away. Every failed attempt is logged
//! as a warning (the node, password hidden, the reason, the node tried next), every connection
//! made at `info` with its node, and counted by node in `idem_rabbitmq_connections_total`.
//!
//! # Metrics
//!
//! [`metrics`] names every metric this crate records, with its labels; besides them, the inbox
//! counts `idem_messages_total` (see `idem_runtime::metrics`). A rising `dead-letter-failed`
//! settlement means the dead-letter exchange routes copies to no queue: messages stay on their
//! queue until it is fixed.

mod broker;
mod codec;
mod confirm;
mod connect;
mod consumer;
mod error;
pub mod guide;
mod link_runtime;
mod metadata;
pub mod metrics;
mod nodes;
mod opening;
mod publisher;
mod queue_kind;
mod relay;
mod stop;
mod tls;
mod topology;
mod url;

pub use codec::{Codec, DecodeError, Json};
pub use consumer::{Binding, Consumer, ConsumerBuilder, headers};
pub use error::{Error, Result, SettingError};
pub use publisher::{PublishOptions, Publisher, PublisherBuilder};
pub use queue_kind::QueueKind;
pub use relay::{Relay, RelayBuilder};
pub use tls::{TlsError, TlsSettings};
pub use topology::{ExchangeBinding, QueueTopology};
pub use url::AmqpUrl;

/// AMQP at a lower level, for code that talks to the broker beside idem (a tool, a test, an
/// adapter of its own): connections made and closed as idem makes them, a delivery's
/// [`Metadata`](idem_runtime::Metadata), a message's properties copied, a queue's kind probed,
/// a URL with its password hidden.
pub mod amqp {
    pub use crate::broker::server_version;
    pub use crate::connect::{close_within, connect, connect_once};
    pub use crate::consumer::copy_properties;
    pub use crate::metadata::metadata_of;
    pub use crate::topology::queue_kind;
    pub use crate::url::redact_url;
}

/// What a started consumer and relay give back (their handles, shutdown reports and counters),
/// and the limits they run within.
pub mod running {
    pub use crate::consumer::{
        DEFAULT_BATCHES_IN_FLIGHT, DeliveryStats, ShutdownHandle, ShutdownReport,
    };
    #[allow(deprecated)]
    pub use crate::relay::RelayHandle;
    pub use crate::relay::{MAX_RELAY_BATCH, RelayStats};
}

/// lapin, re-exported so applications name the same types.
pub use lapin;
