//! For operators: what an inbox and an outbox tell and let do besides processing: records
//! counted per consumer, one record looked up, a stuck claim ended, a record forgotten, the
//! duplicates' summaries; the outbox's counts, its held runs and their holds lifted. The `idem`
//! command is written against this module alone.
//!
//! Import the traits to call their methods on an [`Inbox`](crate::Inbox) or an [`Outbox`](crate::outbox::Outbox):
//!
//! ```no_run
//! # async fn demo(inbox: idem_runtime::Inbox) -> Result<(), Box<dyn std::error::Error>> {
//! use idem_runtime::MessageKey;
//! use idem_runtime::admin::{ConsumerName, InboxAdmin, InboxKey, LiveClaim};
//!
//! for stats in inbox.stats(None).await? {
//!     println!("{}: {} completed", stats.consumer, stats.completed);
//! }
//! let key = InboxKey {
//!     consumer: ConsumerName::new("billing.charge")?,
//!     message_key: MessageKey::new("o-42")?,
//! };
//! inbox.release(&key, LiveClaim::Refuse).await?;
//! # Ok(()) }
//! ```

pub use crate::inbox::{ConsumerStats, Forgotten, InboxAdmin, InboxRecord, Released};
pub use crate::key::{ConsumerName, InboxKey};
pub use crate::outbox::admin::OutboxAdmin;
pub use crate::outbox::holds::{HeldRun, HeldSubject, PendingRow};
pub use crate::outbox::stats::{HeldExchange, OutboxStats};
pub use crate::store::{LiveClaim, Status};
pub use crate::telemetry::DuplicateSummary;
