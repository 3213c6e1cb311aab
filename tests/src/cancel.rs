//! Cancelling a future at a chosen moment, finer than a timer's millisecond.

use std::pin::pin;
use std::task::Poll;
use std::time::{Duration, Instant};

/// Polls `work` until `delay` has passed, yielding between polls, then drops it, as a caller
/// that gave up (a stopping consumer, an HTTP client hanging up) does; returns early if it
/// completes first.
pub async fn cancelled_after(delay: Duration, work: impl Future) {
    let mut work = pin!(work);
    let begun = Instant::now();
    while begun.elapsed() < delay {
        let polled = std::future::poll_fn(|cx| Poll::Ready(work.as_mut().poll(cx))).await;
        if polled.is_ready() {
            return;
        }
        tokio::task::yield_now().await;
    }
}
