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
//! | `tls` | `amqps://` URLs, with rustls and the platform's root certificates |
//! | `postgres` | a [`Relay`] on a PostgreSQL outbox is woken by commits in other processes (`LISTEN`) |
//!
//! # Metrics
//!
//! `idem_rabbitmq_deliveries_total{queue, settle}` counts settled deliveries (`acked`,
//! `duplicate`, `requeued`, `dead-lettered`, `dead-letter-failed`, `settle-lost`), besides the
//! inbox's own `idem_messages_total`. A rising `dead-letter-failed` means the dead-letter
//! exchange routes copies to no queue: messages stay on their queue until it is fixed.
//!
//! The outbox [`Relay`] counts `idem_outbox_published_total{table}` and
//! `idem_outbox_publish_failures_total{table, reason}`, and sets the gauge
//! `idem_outbox_pending_age_seconds{table}`.

mod codec;
mod confirm;
mod connect;
mod consumer;
mod error;
mod metadata;
pub mod metrics;
mod publisher;
mod queue_kind;
mod relay;
mod stop;
mod topology;
mod url;

pub use codec::{Codec, DecodeError, Json};
pub use connect::connect;
pub use consumer::{
    Binding, Consumer, ConsumerBuilder, ConsumerStats, DEFAULT_BATCHES_IN_FLIGHT, ShutdownHandle,
    ShutdownReport, headers,
};
pub use error::{Error, Result, SettingError};
pub use metadata::metadata_of;
pub use publisher::{PublishOptions, Publisher, PublisherBuilder};
pub use queue_kind::QueueKind;
pub use relay::{MAX_RELAY_BATCH, Relay, RelayBuilder, RelayHandle, RelayStats};
pub use topology::{ExchangeBinding, QueueTopology};
pub use url::{AmqpUrl, redact_url};

/// lapin, re-exported so applications name the same types.
pub use lapin;
