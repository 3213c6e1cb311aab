//! For transport adapters: what a broker's consumer needs to drive handlers (the RabbitMQ
//! adapter, `idem-rabbitmq`, is one; another broker's would use the same pieces).
//!
//! A delivery's path: decode the message; [`Handler::key`](crate::Handler::key) names it (an
//! invalid key is [`Error::InvalidKey`](crate::Error::InvalidKey), settled like any other
//! error); [`Inbox::process`](crate::Inbox::process) claims it, runs the handler and completes
//! the record, or several deliveries at once in one transaction with
//! [`Inbox::process_batch`](crate::Inbox::process_batch) ([`BatchItem`]s, at most
//! [`MAX_BATCH`] per transaction); the result's [`Settle`] decision
//! ([`Error::settle`](crate::Error::settle)) says acknowledge, requeue or dead-letter (with a
//! [`DeadLetterReason`]), and the [`DeliveryPolicy`] turns a requeue into a wait, counted or not
//! against the message's delivery limit ([`Decision`]), remembering what it needs per consumer in
//! a [`RetryMemory`].
//!
//! ```
//! use std::time::Duration;
//! use idem_runtime::transport::{Backoff, Decision, DeliveryPolicy, Retry, RetryMemory};
//!
//! let policy = DeliveryPolicy::new(3, Backoff::new(Duration::from_millis(100), Duration::from_secs(5)));
//! let memory = RetryMemory::default();
//! // The handler failed on the first and second deliveries: requeued, counted, waiting longer.
//! assert_eq!(
//!     policy.decide(&memory, "m-1", Retry::Failed, 1, "handler-error", "boom"),
//!     Decision::Requeue { counted: true, after: Duration::from_millis(100) },
//! );
//! assert_eq!(
//!     policy.decide(&memory, "m-1", Retry::Failed, 2, "handler-error", "boom"),
//!     Decision::Requeue { counted: true, after: Duration::from_millis(200) },
//! );
//! // The third was its last.
//! assert!(matches!(
//!     policy.decide(&memory, "m-1", Retry::Failed, 3, "handler-error", "boom"),
//!     Decision::GiveUp(reason) if reason.code == "delivery-limit"
//! ));
//! ```

pub use crate::delivery::{Backoff, Decision, DeliveryPolicy, Retry, RetryMemory};
pub use crate::error::{BoxError, DeadLetterReason, Settle};
pub use crate::inbox::{BatchChecks, BatchItem, MAX_BATCH, Processing, panic_message};
pub use crate::key::KeySource;
pub use crate::metadata::CloudEvent;
pub use crate::report::{Report, ReportSource};
