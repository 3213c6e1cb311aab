//! The type of a work queue, which decides how the consumer requeues without counting a
//! delivery.

/// The type of the work queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueKind {
    /// A classic durable queue.
    Classic,
    /// A quorum queue (replicated; the broker counts deliveries and dead-letters a message past
    /// `x-delivery-limit`, which also stops a message that crashes consumers from looping). Its
    /// dead-lettering is declared at-least-once, so the broker keeps a message until the
    /// dead-letter queue has it; a full queue then refuses new publishes.
    Quorum,
}

impl QueueKind {
    /// The type's name, as `x-queue-type` spells it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            QueueKind::Classic => "classic",
            QueueKind::Quorum => "quorum",
        }
    }
}

impl std::fmt::Display for QueueKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
