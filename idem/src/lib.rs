//! Effectively-once message consumers, in one dependency: the runtime of idem at the root
//! ([`Inbox`], [`Handler`], [`idempotent`], the [`outbox`]...), RabbitMQ as `idem::rabbitmq` and
//! HTTP `Idempotency-Key` as `idem::http`, each behind its feature.
//!
//! `#[idempotent]` finds this crate by itself: a handler crate that depends on `idem` alone
//! needs nothing else.
//!
//! ```
//! use idem::sea_orm::{ConnectionTrait, Database, DatabaseTransaction, DbErr};
//! use idem::{Inbox, Metadata, Outcome, idempotent};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize)]
//! struct OrderPlaced { id: String, amount: i64 }
//!
//! #[idempotent(key = order.id, consumer = "billing")]
//! async fn charge(tx: &DatabaseTransaction, order: OrderPlaced) -> Result<i64, DbErr> {
//!     tx.execute_unprepared("INSERT INTO charges VALUES (1)").await?;
//!     Ok(order.amount)
//! }
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let db = Database::connect("sqlite::memory:").await?;
//! db.execute_unprepared("CREATE TABLE charges (n INTEGER)").await?;
//! let inbox = Inbox::builder(db).build().await?;
//! let order = || OrderPlaced { id: "o-1".into(), amount: 42 };
//! let meta = Metadata::default();
//! assert_eq!(inbox.process(&charge_handler(), order(), &meta).await?, Outcome::Processed(42));
//! assert_eq!(inbox.process(&charge_handler(), order(), &meta).await?, Outcome::Duplicate(42));
//! # Ok(()) }
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo()).unwrap();
//! ```
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | `macros` | yes | [`idempotent`] |
//! | `sqlite` | yes | SQLite (bundled) |
//! | `postgres`, `mysql` | no | PostgreSQL; MySQL and MariaDB |
//! | `tls-rustls` | no | TLS to the database |
//! | `migration` | no | `migration` for sea-orm-migration |
//! | `rabbitmq` | no | `rabbitmq`: the consumer, publisher and outbox relay (lapin 4) |
//! | `rabbitmq-tls` | no | `amqps://` URLs |
//! | `http` | no | `http`: `Idempotency-Key` for tower and axum services |
//! | `otel` | no | W3C Trace Context through `tracing-opentelemetry` |

pub use idem_runtime::*;

/// RabbitMQ: the consumer, the publisher and the outbox relay ([`idem-rabbitmq`](idem_rabbitmq)).
#[cfg(feature = "rabbitmq")]
pub use idem_rabbitmq as rabbitmq;

/// `Idempotency-Key` for HTTP services ([`idem-http`](idem_http)).
#[cfg(feature = "http")]
pub use idem_http as http;
