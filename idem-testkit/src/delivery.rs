//! One delivery of a message through idem, as a broker's consumer would make it, with a crash
//! at a boundary or none, and what became of it.

use std::time::Duration;

use idem_runtime::transport::Settle;
use idem_runtime::{Error, Handler, Inbox, Metadata, Mode, Outcome};
use tokio::sync::Notify;

use crate::faults::Faulty;
use crate::schedule::Boundary;

/// The header a quorum queue adds to a redelivery: how many times the message was delivered
/// before. The kit sets it, with `redelivered`, as a broker does.
pub const DELIVERY_COUNT_HEADER: &str = "x-delivery-count";

/// What became of one delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Fate {
    /// Processed: acknowledged.
    Processed,
    /// A duplicate: acknowledged.
    Duplicate,
    /// Processed or a duplicate, but the acknowledgment was lost: delivered again later.
    AckLost {
        /// Whether idem answered it as a duplicate.
        duplicate: bool,
    },
    /// The worker crashed at this boundary: delivered again later.
    Crashed(Boundary),
    /// idem said to requeue it, for this reason.
    Requeued {
        /// The error's code and text.
        reason: String,
        /// How long another worker's claim still runs, when that was the reason.
        wait: Option<Duration>,
    },
    /// idem said to dead-letter it, for this reason: never delivered again.
    DeadLettered(String),
}

impl Fate {
    /// Whether the broker is done with the message: acknowledged or dead-lettered.
    pub(crate) fn settled(&self) -> bool {
        matches!(
            self,
            Fate::Processed | Fate::Duplicate | Fate::DeadLettered(_)
        )
    }

    /// What happened, in words.
    pub(crate) fn describe(&self) -> String {
        match self {
            Fate::Processed => "processed".to_owned(),
            Fate::Duplicate => "duplicate".to_owned(),
            Fate::AckLost { duplicate: false } => "processed, acknowledgment lost".to_owned(),
            Fate::AckLost { duplicate: true } => "duplicate, acknowledgment lost".to_owned(),
            Fate::Crashed(_) => "crashed".to_owned(),
            Fate::Requeued { reason, .. } => format!("requeued ({reason})"),
            Fate::DeadLettered(reason) => format!("dead-lettered ({reason})"),
        }
    }
}

/// How a message ended, for a finding, when it did not end acknowledged: dead-lettered, or
/// never acknowledged (with its last delivery's fate).
pub(crate) fn ending(last: Option<&Fate>) -> Option<String> {
    match last {
        Some(fate) if !fate.settled() => Some(format!("never acknowledged: {}", fate.describe())),
        Some(fate @ Fate::DeadLettered(_)) => Some(fate.describe()),
        Some(_) => None,
        None => Some("never delivered".to_owned()),
    }
}

/// The metadata of a delivery of a message whose own metadata is `base`, after `earlier`
/// deliveries of it: a redelivery says so, and carries the count, as RabbitMQ's quorum queues
/// do.
pub(crate) fn delivery_metadata(base: &Metadata, earlier: u32) -> Metadata {
    let mut metadata = base.clone();
    metadata.redelivered = earlier > 0;
    if earlier > 0 {
        metadata
            .headers
            .insert(DELIVERY_COUNT_HEADER.to_owned(), earlier.to_string());
    }
    metadata
}

/// Delivers `message` to `handler` through `inbox`, crashing the worker at `crash`.
pub(crate) async fn deliver<H: Handler>(
    inbox: &Inbox,
    handler: &H,
    message: H::Message,
    metadata: &Metadata,
    crash: Option<Boundary>,
) -> Fate {
    let crashed = Notify::new();
    let faulty = Faulty::new(handler, crash, &crashed);
    let processing = inbox.process(&faulty, message, metadata);
    let result = tokio::select! {
        biased;
        () = crashed.notified() => {
            return Fate::Crashed(crash.expect("only a planned crash is signalled"));
        }
        result = processing => result,
    };
    match result {
        Ok(outcome) if crash == Some(Boundary::AfterCommit) => Fate::AckLost {
            duplicate: outcome.is_duplicate(),
        },
        Ok(Outcome::Processed(_)) => Fate::Processed,
        Ok(Outcome::Duplicate(_)) => Fate::Duplicate,
        Err(error) => fate_of(&error),
    }
}

fn fate_of(error: &Error) -> Fate {
    match error.settle() {
        Settle::Ack => Fate::Duplicate,
        Settle::Requeue => Fate::Requeued {
            reason: format!("{}: {error}", error.code()),
            wait: match error {
                Error::InProgressElsewhere { remaining, .. } => Some(*remaining),
                _ => None,
            },
        },
        Settle::DeadLetter(reason) => {
            Fate::DeadLettered(format!("{}: {}", reason.code, reason.detail))
        }
    }
}

/// The key `handler` gives `message` delivered with `metadata`, quoted, or why it gives none:
/// how findings name a message.
pub(crate) fn key_label<H: Handler>(
    handler: &H,
    message: &H::Message,
    metadata: &Metadata,
) -> String {
    match handler.key(message, metadata) {
        Ok(key) => format!("{:?}", key.as_str()),
        Err(error) => format!("none: {error}"),
    }
}

/// Whether `handler` runs in two-phase mode.
pub(crate) fn is_two_phase<H: Handler>(handler: &H) -> bool {
    matches!(handler.mode(), Mode::TwoPhase { .. })
}

/// How many times the drain delivers a message before it gives up on it.
pub(crate) const DRAIN_ATTEMPTS: u32 = 40;

/// How long the drain waits before delivering a requeued message again, after `attempt`
/// requeues: a claim another worker holds is waited out, anything else (a busy SQLite file, a
/// deadlock) is tried again after a short, growing pause.
pub(crate) fn pause_after(fate: &Fate, attempt: u32) -> Duration {
    let short = Duration::from_millis(10 * u64::from(attempt.min(20)));
    match fate {
        Fate::Requeued {
            wait: Some(wait), ..
        } => *wait + Duration::from_millis(20),
        _ => short,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_redelivery_says_so_and_counts_the_earlier_deliveries() {
        let mut base = Metadata {
            message_id: Some("m-1".to_owned()),
            ..Metadata::default()
        };
        base.headers.insert("tenant".to_owned(), "t".to_owned());
        let first = delivery_metadata(&base, 0);
        assert_eq!(first, base);
        let third = delivery_metadata(&base, 2);
        assert!(third.redelivered);
        assert_eq!(third.header(DELIVERY_COUNT_HEADER), Some("2"));
        assert_eq!(third.header("tenant"), Some("t"));
        assert_eq!(third.message_id(), Some("m-1"));
    }
}
