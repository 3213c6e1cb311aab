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
//! a [`Fingerprint`] of its content. [`Inbox::process`] then:
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
//! Every [`Error`] carries its [`Settle`] decision — acknowledge, requeue or dead-letter — for
//! the transport adapter (`idem-rabbitmq`). Records expire after their retention
//! ([`RetentionPolicy`], 7 days by default, checked against the broker's
//! [`RedeliveryWindow`]); the [`Cleaner`] deletes them in bounded batches.
//!
//! # Example
//!
//! ```
//! use idem_runtime::{Context, Fingerprint, FingerprintError, Handler, Inbox, KeyError,
//!                    MessageKey, Metadata, Outcome};
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
//!     fn fingerprint(&self, order: &OrderPlaced) -> Result<Option<Fingerprint>, FingerprintError> {
//!         Fingerprint::of(order).map(Some)
//!     }
//!     async fn handle(&self, cx: &Context<'_>, order: OrderPlaced) -> Result<i64, sea_orm::DbErr> {
//!         let tx = cx.transaction().expect("transactional handler");
//!         let sql = "INSERT INTO charges (order_id, amount) VALUES (?, ?)";
//!         tx.execute_raw(Statement::from_sql_and_values(
//!             tx.get_database_backend(), sql, [order.id.into(), order.amount.into()],
//!         )).await?;
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
//! # Features
//!
//! | feature | default | what it enables |
//! |---|---|---|
//! | `macros` | yes | `#[idempotent]`, re-exported from `idem-macros` |
//! | `sqlite` | yes | SQLite (bundled), the embedded default |
//! | `postgres` | no | PostgreSQL |
//! | `mysql` | no | MySQL and MariaDB |
//! | `tls-rustls` | no | TLS to the database |
//! | `migration` | no | `migration::CreateInbox` for `sea-orm-migration` |
//!
//! # Backends
//!
//! The claim is `INSERT ... ON CONFLICT DO NOTHING` on PostgreSQL and SQLite and
//! `INSERT IGNORE` on MySQL/MariaDB, whose affected-row count stays 0 for a duplicate even with
//! `CLIENT_FOUND_ROWS`. SQLite transactions begin `IMMEDIATE`. In transactional mode the handler
//! holds a pooled connection for its transaction; with sea-orm's default single-connection SQLite
//! pool, write through the transaction only.

mod clock;
mod error;
mod fingerprint;
mod handler;
mod inbox;
mod key;
mod metadata;
pub mod observe;
mod report;
mod retention;
mod store;

#[cfg(feature = "migration")]
pub mod migration;

#[doc(hidden)]
pub mod __private;

pub use error::{BoxError, ConfigError, DeadLetterReason, Error, Result, Settle};
pub use fingerprint::{Fingerprint, FingerprintError};
pub use handler::{Context, Handler, Mode, Outcome};
pub use inbox::{Inbox, InboxBuilder, InboxRecord, panic_message};
pub use key::{ConsumerName, InboxKey, KeyError, KeySource, MessageKey};
pub use metadata::{CloudEvent, Metadata};
pub use report::{Report, ReportSource};
pub use retention::{Cleaner, CleanerHandle, CleanupReport, RedeliveryWindow, RetentionPolicy};
pub use store::Status;
pub use store::table::{TableName, create_table_statements};

#[cfg(feature = "macros")]
pub use idem_macros::idempotent;

/// The sea-orm version idem is built on, re-exported so handlers name the same types.
pub use sea_orm;
