//! Tracing spans and metrics for every processed message (the metrics' names and labels are in
//! [`metrics`](crate::metrics)).

use tracing::Span;
use tracing::field::Empty;

use crate::error::{Error, Result, Settle};
use crate::handler::Outcome;
use crate::metadata::Metadata;

use crate::metrics::{
    BATCH_DURATION_SECONDS, BATCH_SIZE, DUPLICATE_AGE_SECONDS, MESSAGES_TOTAL,
    PROCESSING_DURATION_SECONDS,
};
use std::time::{Duration, Instant};

/// The span of one message: consumer, message key, correlation id and outcome.
pub(crate) fn span(consumer: &str, metadata: &Metadata) -> Span {
    tracing::info_span!(
        "idem.process",
        consumer,
        key = Empty,
        message_id = metadata.message_id.as_deref(),
        correlation_id = metadata.correlation_id.as_deref(),
        outcome = Empty,
    )
}

/// Records the outcome on the span, counts it, and logs failures at a level matching how they
/// settle: a dead-lettered message is an error (an alert for a fingerprint mismatch), a requeued
/// one a warning; an error its handler `expected` (a client's mistake) at debug level.
pub(crate) fn record<T>(span: &Span, consumer: &str, result: &Result<Outcome<T>>, expected: bool) {
    let outcome = outcome(result);
    span.record("outcome", outcome);
    metrics::counter!(MESSAGES_TOTAL, "consumer" => consumer.to_owned(), "outcome" => outcome)
        .increment(1);
    match result {
        Err(error) if expected => {
            let _entered = span.enter();
            tracing::debug!(%error, "message ended as its handler expected");
        }
        Err(error) => log_error(span, error),
        Ok(_) => {}
    }
}

/// Records how long a message processed on its own took, begun at `begun`, with its outcome.
pub(crate) fn processing_duration<T>(consumer: &str, begun: Instant, result: &Result<Outcome<T>>) {
    metrics::histogram!(
        PROCESSING_DURATION_SECONDS,
        "consumer" => consumer.to_owned(),
        "outcome" => outcome(result)
    )
    .record(begun.elapsed().as_secs_f64());
}

/// Records a batch transaction of `size` messages, begun at `begun`.
pub(crate) fn batch(consumer: &str, size: usize, begun: Instant) {
    let consumer = consumer.to_owned();
    metrics::histogram!(BATCH_SIZE, "consumer" => consumer.clone()).record(size as f64);
    metrics::histogram!(BATCH_DURATION_SECONDS, "consumer" => consumer)
        .record(begun.elapsed().as_secs_f64());
}

/// A result's outcome label: `processed`, `duplicate`, or the error's code.
fn outcome<T>(result: &Result<Outcome<T>>) -> &'static str {
    match result {
        Ok(Outcome::Processed(_)) => "processed",
        Ok(Outcome::Duplicate(_)) => "duplicate",
        Err(error) => error.code(),
    }
}

fn log_error(span: &Span, error: &Error) {
    let _entered = span.enter();
    match error.settle() {
        Settle::DeadLetter(_) if matches!(error, Error::FingerprintMismatch { .. }) => {
            tracing::error!(alert = true, %error, "reused key with different content")
        }
        Settle::DeadLetter(_) => tracing::error!(%error, "message cannot be processed"),
        Settle::Requeue => tracing::warn!(%error, "message will be retried"),
        Settle::Ack => tracing::warn!(%error, "message was processed before"),
    }
}

/// Records a duplicate's age: how long before it came its key's record was completed (zero
/// for a copy in its original's batch). Call it once the duplicate's result is settled.
pub(crate) fn duplicate_age(consumer: &str, age: Option<Duration>) {
    if let Some(age) = age {
        metrics::histogram!(DUPLICATE_AGE_SECONDS, "consumer" => consumer.to_owned())
            .record(age.as_secs_f64());
    }
}
