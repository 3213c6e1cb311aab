//! The runtime each connection's lapin tasks run on: a worker thread of its own, so that a lapin
//! task that blocks its thread for good (lapin 4.12's recovery deadlock,
//! `docs/lapin-recovery-deadlock.md`) takes its connection down with it, never the
//! application's workers.

use std::time::Duration;

use tokio::runtime::{Builder, Handle};

/// A connection's own runtime: one worker thread, alive while lapin holds the connection (lapin
/// owns it, and shuts it down when the connection's last handle goes).
#[derive(Debug, Clone)]
pub(crate) struct LinkRuntime {
    handle: Handle,
}

impl LinkRuntime {
    /// Starts a runtime for one connection, and the form lapin takes it in.
    pub(crate) fn start() -> std::io::Result<(Self, async_rs::TokioRuntime)> {
        let runtime = Builder::new_multi_thread()
            .worker_threads(1)
            .max_blocking_threads(1)
            .thread_name("idem-amqp")
            .enable_all()
            .build()?;
        let handle = runtime.handle().clone();
        Ok((
            Self { handle },
            async_rs::Runtime::tokio_with_runtime(runtime),
        ))
    }

    /// Runs `work` on the connection's runtime, where a call into lapin may block a thread:
    /// `None` when it has not ended within `limit` (the thread is blocked, or the connection
    /// makes no progress), or the runtime is gone. The caller's thread never waits on lapin.
    pub(crate) async fn run<T: Send + 'static>(
        &self,
        limit: Duration,
        work: impl Future<Output = T> + Send + 'static,
    ) -> Option<T> {
        let task = self.handle.spawn(work);
        let abort = task.abort_handle();
        match tokio::time::timeout(limit, task).await {
            Ok(ended) => ended.ok(),
            Err(_) => {
                abort.abort();
                None
            }
        }
    }

    /// Starts `work` on the connection's runtime, for as long as the runtime lives.
    pub(crate) fn spawn(
        &self,
        work: impl Future<Output = ()> + Send + 'static,
    ) -> tokio::task::AbortHandle {
        self.handle.spawn(work).abort_handle()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection's runtime whose thread is blocked for good answers nothing, in time, and the
    /// caller's one thread goes on running its other tasks.
    #[tokio::test(flavor = "current_thread")]
    async fn a_blocked_connection_runtime_never_blocks_the_caller() {
        let (runtime, owned) = LinkRuntime::start().expect("a runtime");
        let (unblock, blocked) = std::sync::mpsc::channel::<()>();
        runtime.spawn(async move {
            // A lapin task holding its thread, as a lock that is never released does.
            let _ = blocked.recv();
        });
        let look = runtime.run(Duration::from_millis(200), async { "up" });
        assert_eq!(look.await, None);
        assert_eq!(tokio::spawn(async { 2 }).await.ok(), Some(2));
        drop(unblock);
        let look = runtime.run(Duration::from_secs(5), async { "up" });
        assert_eq!(look.await, Some("up"));
        drop(owned);
    }
}
