//! The runtime each connection's lapin tasks run on: a worker thread of its own, so that a lapin
//! task that blocks its thread for good (lapin 4.12's recovery deadlock,
//! `docs/lapin-recovery-deadlock.md`) takes its connection down with it, never the
//! application's workers.

use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::{Builder, Handle, Runtime};

/// Where a connection's lapin tasks run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tasks {
    /// On a runtime of the connection's own ([`LinkRuntime::start`]).
    Own,
    /// On the caller's runtime, for a connection handed to the caller (who decides its life).
    Caller,
}

/// The runtime a connection's lapin tasks run on. One of its own lives as long as the last
/// clone of it, then a while longer, for lapin's thread to end with the connection: lapin can
/// leave tasks of a connection behind (one that failed to open), and they go with it.
#[derive(Debug, Clone)]
pub(crate) struct LinkRuntime {
    handle: Handle,
    /// The runtime, when it is the connection's own.
    _owned: Option<Arc<Owned>>,
}

/// How long a connection's own runtime outlives the connection's last handle: longer than lapin's
/// thread of the connection may still try to reconnect with it (its recovery is bounded well below).
const GRACE: Duration = Duration::from_secs(180);

impl LinkRuntime {
    /// Where `tasks` says: a runtime of the connection's own (one worker thread), or the caller's.
    pub(crate) fn start(tasks: Tasks) -> std::io::Result<Self> {
        if tasks == Tasks::Caller {
            return Ok(Self {
                handle: Handle::current(),
                _owned: None,
            });
        }
        let runtime = Builder::new_multi_thread()
            .worker_threads(1)
            .max_blocking_threads(1)
            .thread_name("idem-amqp")
            .enable_all()
            .build()?;
        Ok(Self {
            handle: runtime.handle().clone(),
            _owned: Some(Arc::new(Owned(Some(runtime)))),
        })
    }

    /// The form lapin takes it in.
    pub(crate) fn lapin(&self) -> async_rs::TokioRuntime {
        async_rs::Runtime::tokio_with_handle(self.handle.clone())
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

/// A connection's own runtime, shut down [`GRACE`] after its last handle went (at once outside
/// any runtime), without waiting for a thread that may be blocked for good.
#[derive(Debug)]
struct Owned(Option<Runtime>);

impl Drop for Owned {
    fn drop(&mut self) {
        let Some(runtime) = self.0.take() else {
            return;
        };
        let reaped = Reaped(Some(runtime));
        match Handle::try_current() {
            Ok(caller) => drop(caller.spawn(async move {
                tokio::time::sleep(GRACE).await;
                drop(reaped);
            })),
            Err(_) => drop(reaped),
        }
    }
}

/// A runtime shut down in the background whenever it is dropped: inside a task of another
/// runtime too (one ending at its own shutdown), where dropping a runtime would panic.
struct Reaped(Option<Runtime>);

impl Drop for Reaped {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection's runtime whose thread is blocked for good answers nothing, in time, and the
    /// caller's one thread goes on running its other tasks.
    #[tokio::test(flavor = "current_thread")]
    async fn a_blocked_connection_runtime_never_blocks_the_caller() {
        let runtime = LinkRuntime::start(Tasks::Own).expect("a runtime");
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
    }

    /// A connection's own runtime ends once its last handle has gone, with the tasks left on it
    /// (as lapin leaves some of a connection that failed to open).
    #[test]
    fn a_connections_own_runtime_ends_with_its_last_handle() {
        let runtime = LinkRuntime::start(Tasks::Own).expect("a runtime");
        let handle = runtime.handle.clone();
        runtime.spawn(std::future::pending());
        drop(runtime);
        let caller = Builder::new_current_thread().enable_all().build().unwrap();
        let ended = caller.block_on(async { handle.spawn(async {}).await });
        assert!(ended.is_err_and(|error| error.is_cancelled()));
    }
}
