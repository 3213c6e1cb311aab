//! A guarded request runs in a task of its own, to its end whatever becomes of its caller: a
//! client that hangs up (hyper then drops the request's future) must not cancel the database
//! work in the middle of a statement, which leaves a connection that sqlx cannot always
//! recover. The request completes and its response is stored, for the client's retry to get.
//!
//! Such a request keeps its caller's place: the next caller of the same service waits for it
//! before the service is ready, so that a concurrency limit in front of the guard (tower's
//! `ConcurrencyLimit`, which frees a place when its caller goes) still bounds the requests
//! running. Each request left running holds back one caller, once.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::Response;
use tokio::sync::oneshot;
use tracing::Instrument;

use crate::problem::Problem;

/// Ends (its sender dropped) when a detached request's task ends, however it ends.
type Ended = oneshot::Receiver<()>;

/// The requests of one service still running after their callers went, oldest first.
#[derive(Debug, Default)]
pub(crate) struct LeftRunning {
    requests: Mutex<VecDeque<Ended>>,
}

impl LeftRunning {
    fn requests(&self) -> MutexGuard<'_, VecDeque<Ended>> {
        // Nothing panics while holding the lock: a poisoned queue is whole.
        self.requests
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Counts `request` among those left running, unless it has ended; forgets those that have.
    fn leave(&self, mut request: Ended) {
        let mut requests = self.requests();
        requests.retain_mut(running);
        if running(&mut request) {
            requests.push_back(request);
        }
    }

    /// The oldest request left running that no caller waits for yet.
    fn take(&self) -> Option<Ended> {
        let mut requests = self.requests();
        while let Some(mut request) = requests.pop_front() {
            if running(&mut request) {
                return Some(request);
            }
        }
        None
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.requests().len()
    }
}

fn running(request: &mut Ended) -> bool {
    matches!(request.try_recv(), Err(oneshot::error::TryRecvError::Empty))
}

/// A caller's place in a service (one per clone of the service): ready once the request left
/// running that it took the place of, if any, has ended.
#[derive(Debug)]
pub(crate) struct Place {
    left: Arc<LeftRunning>,
    state: State,
}

#[derive(Debug)]
enum State {
    /// Not polled since its last call.
    Free,
    /// Waiting for a request left running.
    Waiting(Ended),
    /// Ready for a call.
    Ready,
}

impl Place {
    pub(crate) fn new(left: Arc<LeftRunning>) -> Self {
        Self {
            left,
            state: State::Free,
        }
    }

    /// Ready once the request left running that this caller takes the place of has ended.
    pub(crate) fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            match &mut self.state {
                State::Ready => return Poll::Ready(()),
                State::Free => {
                    self.state = match self.left.take() {
                        Some(request) => State::Waiting(request),
                        None => State::Ready,
                    };
                }
                State::Waiting(request) => {
                    // Ends with an error when the task drops its sender: it has ended.
                    let _ = ready!(Pin::new(request).poll(cx));
                    self.state = State::Ready;
                }
            }
        }
    }

    /// The place was used for a call: the next one waits again, if a request was left running.
    pub(crate) fn called(&mut self) {
        self.state = State::Free;
    }

    /// Runs `work` in a task of its own, in the caller's span; if the caller goes before it
    /// ends, it is counted among the requests left running.
    pub(crate) fn detach(
        &self,
        work: impl Future<Output = Response<Bytes>> + Send + 'static,
    ) -> impl Future<Output = Response<Bytes>> + Send + 'static {
        let (running, ended) = oneshot::channel::<()>();
        let work = async move {
            let _running = running;
            work.await
        };
        let task = tokio::spawn(work.instrument(tracing::Span::current()));
        let mut caller = Caller {
            left: Arc::clone(&self.left),
            ended: Some(ended),
        };
        async move {
            let joined = task.await;
            caller.answered();
            joined.unwrap_or_else(|join| {
                tracing::warn!(error = %join, "an idempotent request's task failed");
                Problem::failed("The request could not be completed.".to_owned()).response()
            })
        }
    }
}

impl Clone for Place {
    fn clone(&self) -> Self {
        Self::new(Arc::clone(&self.left))
    }
}

impl Drop for Place {
    /// A caller that goes while waiting leaves the request it waited for to the next one.
    fn drop(&mut self) {
        if let State::Waiting(request) = std::mem::replace(&mut self.state, State::Free) {
            self.left.leave(request);
        }
    }
}

/// The caller of a detached request: dropped before the answer, it leaves the request running.
struct Caller {
    left: Arc<LeftRunning>,
    ended: Option<Ended>,
}

impl Caller {
    /// The caller got its answer: the request did not outlive it.
    fn answered(&mut self) {
        self.ended = None;
    }
}

impl Drop for Caller {
    fn drop(&mut self) {
        if let Some(ended) = self.ended.take() {
            self.left.leave(ended);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::task::Waker;

    use super::*;

    fn poll(place: &mut Place) -> Poll<()> {
        place.poll_ready(&mut Context::from_waker(Waker::noop()))
    }

    #[tokio::test]
    async fn a_request_left_running_holds_back_one_caller_until_it_ends() {
        let left = Arc::new(LeftRunning::default());
        let (mut first, mut second) = (Place::new(left.clone()), Place::new(left.clone()));
        let (release, released) = oneshot::channel::<()>();
        let answer = first.detach(async move {
            let _ = released.await;
            Response::new(Bytes::from_static(b"done"))
        });
        first.called();
        drop(answer); // the caller hangs up
        assert_eq!(left.len(), 1);
        assert!(poll(&mut first).is_pending(), "the next caller waits");
        assert!(poll(&mut second).is_ready(), "only one does");
        second.called();
        drop(first); // a waiting caller that goes leaves its wait to the next
        assert_eq!(left.len(), 1);
        let mut third = second.clone();
        assert!(poll(&mut third).is_pending());
        release.send(()).unwrap();
        tokio::task::yield_now().await;
        while poll(&mut third).is_pending() {
            tokio::task::yield_now().await;
        }
        assert!(poll(&mut second).is_ready());
        assert_eq!(left.len(), 0, "nothing is left behind");
    }

    #[tokio::test]
    async fn a_request_answered_is_not_left_running() {
        let left = Arc::new(LeftRunning::default());
        let place = Place::new(left.clone());
        let answer = place.detach(async { Response::new(Bytes::new()) }).await;
        assert!(answer.body().is_empty());
        assert_eq!(left.len(), 0);
    }
}
