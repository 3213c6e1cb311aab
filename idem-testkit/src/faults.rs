//! The handler wrapper that crashes a worker at a boundary: it runs the user's handler, and at
//! the boundary it tells the kit and never returns, so that the kit drops the processing
//! future as a killed process would stop. idem itself runs unchanged around it.

use std::time::Duration;

use idem_runtime::fingerprint::{Fingerprint, FingerprintError};
use idem_runtime::{Context, Handler, KeyError, MessageKey, Metadata, Mode};
use tokio::sync::Notify;

use crate::schedule::Boundary;

/// `inner`, crashing its worker at `crash_at` (the boundaries inside a run: before and after
/// the handler). The kit learns of the crash through `crashed`.
pub(crate) struct Faulty<'a, H> {
    inner: &'a H,
    crash_at: Option<Boundary>,
    crashed: &'a Notify,
}

impl<'a, H: Handler> Faulty<'a, H> {
    pub(crate) fn new(inner: &'a H, crash_at: Option<Boundary>, crashed: &'a Notify) -> Self {
        Self {
            inner,
            crash_at,
            crashed,
        }
    }

    /// Tells the kit this worker crashed, and never returns: the kit drops the future.
    async fn crash<T>(&self) -> T {
        self.crashed.notify_one();
        std::future::pending().await
    }
}

impl<H: Handler> Handler for Faulty<'_, H> {
    type Message = H::Message;
    type Output = H::Output;
    type Error = H::Error;

    fn consumer(&self) -> &str {
        self.inner.consumer()
    }

    fn key(&self, message: &Self::Message, metadata: &Metadata) -> Result<MessageKey, KeyError> {
        self.inner.key(message, metadata)
    }

    fn fingerprint(
        &self,
        message: &Self::Message,
        metadata: &Metadata,
    ) -> Result<Option<Fingerprint>, FingerprintError> {
        self.inner.fingerprint(message, metadata)
    }

    fn mode(&self) -> Mode {
        self.inner.mode()
    }

    fn retention(&self) -> Option<Duration> {
        self.inner.retention()
    }

    fn is_permanent(&self, error: &Self::Error) -> bool {
        self.inner.is_permanent(error)
    }

    async fn handle(
        &self,
        cx: &Context<'_>,
        message: Self::Message,
    ) -> Result<Self::Output, Self::Error> {
        if self.crash_at == Some(Boundary::BeforeHandler) {
            return self.crash().await;
        }
        let output = self.inner.handle(cx, message).await?;
        if self.crash_at == Some(Boundary::AfterHandler) {
            return self.crash().await;
        }
        Ok(output)
    }
}
