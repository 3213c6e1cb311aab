//! The stop a consumer or a relay is asked for, and the waits it cuts short.

use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;

/// Set, once, when a consumer or a relay is asked to stop; a stop signal whose sender is gone
/// counts as set.
#[derive(Debug, Clone)]
pub(crate) struct StopSignal(watch::Receiver<bool>);

impl StopSignal {
    /// The signal `receiver` carries: `true` once the stop is asked for.
    pub(crate) fn new(receiver: watch::Receiver<bool>) -> Self {
        Self(receiver)
    }

    /// Whether the stop was asked for.
    pub(crate) fn is_set(&self) -> bool {
        *self.0.borrow()
    }

    /// Waits until the stop is asked for; returns at once if it was.
    pub(crate) async fn wait(&self) {
        let mut receiver = self.0.clone();
        let _ = receiver.wait_for(|stop| *stop).await;
    }

    /// Runs `work` unless the stop is asked for first: `None` then, and `work` is dropped. The
    /// stop is looked at first, so a stop already asked for wins over work that is ready.
    pub(crate) async fn unless_stopped<F: Future>(&self, work: F) -> Option<F::Output> {
        tokio::select! {
            biased;
            () = self.wait() => None,
            output = work => Some(output),
        }
    }

    /// Sleeps `delay`, or less if the stop is asked for; returns whether it slept it all.
    pub(crate) async fn sleep(&self, delay: Duration) -> bool {
        self.unless_stopped(tokio::time::sleep(delay))
            .await
            .is_some()
    }
}
