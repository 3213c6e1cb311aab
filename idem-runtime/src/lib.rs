//! Effectively-once message processing: the Idempotent Consumer (Inbox) pattern on sea-orm.
//!
//! Brokers deliver at least once: a producer retries, an acknowledgment is lost, a consumer
//! crashes after its write. idem keeps an inbox of processed message keys in the application's
//! own database and commits it atomically with the handler's effects, so processing a message
//! twice has the effect of processing it once.
//!
//! # How it works
//!
//! A [`Handler`] names its consumer, derives a [`MessageKey`] from each message and, by default,
//! a [`Fingerprint`](fingerprint::Fingerprint) of its content. [`Inbox::process`] then:
//!
//! 1. claims the inbox key `(consumer, message key)` with one atomic conditional insert: the
//!    table's primary key, not application code, decides between concurrent copies;
//! 2. on a fresh claim, runs the handler and records its output, so a duplicate gets the same
//!    output back ([`Outcome::Duplicate`]) without running the handler;
//! 3. refuses a known key with different content ([`Error::FingerprintMismatch`]): a reused key
//!    is dead-lettered, never dropped and never processed.
//!
//! In [`Mode::Transactional`] (the default) the claim, the handler's writes (through
//! [`Context::transaction`]) and the output are one transaction: a crash anywhere before the
//! commit leaves nothing, and after it the redelivery finds the record. [`Mode::TwoPhase`] is for
//! effects that cannot join the transaction; see its documentation for what it guarantees.
//!
//! Every [`Error`] carries its [`Settle`](transport::Settle) decision — acknowledge, requeue or dead-letter — for
//! the transport adapter (`idem-rabbitmq`). Records expire after their retention
//! ([`RetentionPolicy`], 7 days by default, checked against the broker's
//! [`RedeliveryWindow`](retention::RedeliveryWindow)); the [`Cleaner`](retention::Cleaner) deletes
//! them in bounded batches.
//!
//! # Example
//!
//! ```
//! use idem_runtime::{Context, Handler, Inbox, KeyError, MessageKey, Metadata, Outcome};
//! use idem_runtime::fingerprint::{Fingerprint, FingerprintError};
//! use sea_orm::sea_query::Query;
//! use sea_orm::{ConnectionTrait, Statement};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize)]
//! struct OrderPlaced { id: String, amount: i64 }
//!
//! struct Billing;
//!
//! impl Handler for Billing {
//!     type Message = OrderPlaced;
//!     type Output = i64;
//!     type Error = sea_orm::DbErr;
//!
//!     fn consumer(&self) -> &str { "billing" }
//!     fn key(&self, order: &OrderPlaced, _: &Metadata) -> Result<MessageKey, KeyError> {
//!         MessageKey::new(order.id.as_str())
//!     }
//!     fn fingerprint(&self, order: &OrderPlaced, meta: &Metadata)
//!         -> Result<Option<Fingerprint>, FingerprintError> {
//!         meta.content_fingerprint(order).map(Some)
//!     }
//!     async fn handle(&self, cx: &Context<'_>, order: OrderPlaced) -> Result<i64, sea_orm::DbErr> {
//!         let tx = cx.transaction().expect("transactional handler");
//!         // sea-query writes the statement for whichever backend `tx` is on.
//!         let insert = Query::insert()
//!             .into_table("charges")
//!             .columns(["order_id", "amount"])
//!             .values_panic([order.id.into(), order.amount.into()])
//!             .to_owned();
//!         tx.execute(&insert).await?;
//!         Ok(order.amount)
//!     }
//! }
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let db = sea_orm::Database::connect("sqlite::memory:").await?;
//! db.execute_unprepared("CREATE TABLE charges (order_id TEXT, amount INTEGER)").await?;
//! let inbox = Inbox::builder(db.clone()).build().await?;
//!
//! let order = || OrderPlaced { id: "o-1".into(), amount: 42 };
//! let meta = Metadata::default();
//! assert_eq!(inbox.process(&Billing, order(), &meta).await?, Outcome::Processed(42));
//! assert_eq!(inbox.process(&Billing, order(), &meta).await?, Outcome::Duplicate(42));
//!
//! let charges = db.query_one_raw(Statement::from_string(
//!     db.get_database_backend(), "SELECT COUNT(*) FROM charges",
//! )).await?.unwrap().try_get_by_index::<i64>(0)?;
//! assert_eq!(charges, 1);
//! # Ok(()) }
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo()).unwrap();
//! ```
//!
//! # Where to find what
//!
//! The crate's root holds what a handler's author uses: the handler traits, the inbox and its
//! errors, keys and fingerprints, and the outbox a handler stages into. The rest is grouped by
//! who needs it:
//!
//! - [`admin`]: for operators and their tools (the `idem` command): counts, lookups, claims
//!   ended, records forgotten, held runs lifted;
//! - [`transport`]: for adapters between a broker and the inbox (settle decisions, dead-letter
//!   reasons, the delivery policy, batch items);
//! - [`outbox`]: for relays that publish what handlers staged;
//! - [`retention`]: the cleaner that deletes expired records;
//! - [`schema`]: the tables' DDL, for migrations run by hand;
//! - [`metrics`]: every metric name the crate records, with its labels.
//!
//! # Guides
//!
//! - [`guide::attribute`]: the reference of `#[idempotent]`;
//! - [`guide::backends`]: what a transactional handler may do with its transaction, and how each
//!   backend claims and keeps time;
//! - [`guide::guarantees`]: what holds under each fault, and the test that proves it.
//!
//! # Features
//!
//! | feature | default | what it enables |
//! |---|---|---|
//! | `macros` | yes | `#[idempotent]`, re-exported from `idem-macros` |
//! | `sqlite` | yes | SQLite (bundled), the embedded default |
//! | `postgres` | no | PostgreSQL |
//! | `mysql` | no | MySQL and MariaDB |
//! | `tls-rustls` | no | TLS to the database |
//! | `migration` | no | `migration::CreateInbox`, `CreateInboxCompanions` and `UpgradeInboxCompanions` for `sea-orm-migration` |
//! | `otel` | no | staged outbox messages carry the handler's trace context (`traceparent`), through `tracing-opentelemetry` (the module `trace_context`) |

pub mod admin;
mod clock;
mod configured;
mod context;
mod delivery;
pub mod entity;
mod error;
pub mod fingerprint;
pub mod guide;
mod handler;
mod inbox;
mod key;
mod metadata;
pub mod metrics;
mod observe;
pub mod outbox;
mod report;
pub mod retention;
pub mod schema;
mod slice;
mod store;
mod telemetry;
#[cfg(feature = "otel")]
pub mod trace_context;
pub mod transport;

#[cfg(feature = "migration")]
pub mod migration;

#[doc(hidden)]
pub mod __private;
// Hidden here too so that a message without `Serialize` gets an error naming the trait plainly,
// never through `__private` (see `__private::Fingerprintable`).
#[doc(hidden)]
pub use __private::Fingerprintable;

pub use configured::{Configured, HandlerExt};
pub use context::Context;
pub use error::{ConfigError, Error, Result};
pub use handler::{Handler, Mode, Outcome};
pub use inbox::{Inbox, InboxBuilder};
pub use key::{KeyError, MessageKey};
pub use metadata::Metadata;
pub use outbox::message::OutboxMessage;
pub use retention::policy::RetentionPolicy;
pub use slice::{SliceContext, SliceHandler};

#[cfg(feature = "macros")]
pub use idem_macros::idempotent;

/// The sea-orm version idem is built on, re-exported so handlers name the same types.
pub use sea_orm;
