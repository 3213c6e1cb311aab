//! Slice handlers: the fresh messages of a batch handled in one call, so that the business
//! write can be one multi-row statement.

use std::future::Future;

use sea_orm::DatabaseTransaction;

use crate::context::Context;
use crate::handler::Handler;

/// A handler of many messages at once: the fresh messages of a batch, in order, in one call,
/// writing their effects through one transaction (one multi-row `INSERT`, as a careful engineer
/// writes a batch by hand).
///
/// Everything else is the [`Handler`]'s: the consumer name, each message's key and fingerprint,
/// the retention, which errors are permanent. Duplicates are answered from their records and
/// never reach the slice; each message settles as it would alone. The slice runs first with no
/// savepoint, as a hand-written multi-row batch does. When the call fails (an error, a panic,
/// fewer or more outputs than messages), or the completion finds the transaction aborted or
/// lost under it, the batch is rolled back and the inbox finds the messages that fail by
/// halving the slice, each half under a savepoint of its own, down to single messages: the
/// others commit, and a failing message gets its own error. A slice handler must not end the
/// transaction it is given (its own `COMMIT` or `ROLLBACK`): what it commits by itself is
/// outside these guarantees.
///
/// `#[idempotent(key = ..., slice)]` implements it, and [`Handler::handle`] as a slice of one
/// message, for a function of a `Vec` of messages. Transactional only.
pub trait SliceHandler: Handler {
    /// Processes `messages` in the transaction [`SliceContext::transaction`] gives: one output
    /// per message, in their order.
    fn handle_slice(
        &self,
        cx: &SliceContext<'_>,
        messages: Vec<Self::Message>,
    ) -> impl Future<Output = Result<Vec<Self::Output>, Self::Error>> + Send;
}

/// What a slice handler learns about the messages it processes: their transaction, and each
/// message's own [`Context`] (its key, its metadata, where it stages outgoing messages).
#[derive(Debug)]
pub struct SliceContext<'a> {
    transaction: &'a DatabaseTransaction,
    messages: &'a [Context<'a>],
}

impl<'a> SliceContext<'a> {
    /// The context of a slice whose messages' contexts are `messages`, each with the same
    /// transaction: the inbox makes it so, and a unit test of a slice handler may too.
    pub fn new(transaction: &'a DatabaseTransaction, messages: &'a [Context<'a>]) -> Self {
        Self {
            transaction,
            messages,
        }
    }

    /// The transaction the slice writes its effects through: committed with the inbox records
    /// of its messages, or not at all.
    pub fn transaction(&self) -> &'a DatabaseTransaction {
        self.transaction
    }

    /// Each message's context, in the slice's order: stage a message's outgoing messages
    /// through its own ([`Context::stage`]), so that their ids derive from that message.
    pub fn messages(&self) -> &'a [Context<'a>] {
        self.messages
    }

    /// How many messages the slice has.
    pub fn len(&self) -> usize {
        self.messages.len()
    }

    /// Whether the slice is empty (never, when the inbox calls the handler).
    pub fn is_empty(&self) -> bool {
        self.messages.is_empty()
    }
}
