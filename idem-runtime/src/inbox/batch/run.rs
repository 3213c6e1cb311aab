//! A batch from its items to their results: sorted by key, claimed, handled and completed in
//! one transaction, what needs more than a read processed on its own after the commit.

use std::time::Duration;

use super::attempt::Batch;
use super::fates::{Fate, Later, Lead, Sorted, record, sort_out};
use super::item::{BatchChecks, BatchItem, MAX_BATCH, in_chunk};
use super::lost::Lost;
use crate::error::{Error, Result};
use crate::handler::{Handler, Mode, Outcome};
use crate::inbox::inner::Inner;
use crate::key::ConsumerName;

impl Inner {
    /// See the `Inbox` method of this name.
    pub(crate) async fn process_batch<H: Handler>(
        &self,
        handler: &H,
        items: Vec<BatchItem<H::Message>>,
    ) -> Vec<Result<Outcome<H::Output>>>
    where
        H::Message: Clone,
    {
        self.process_batch_with(handler, items, BatchChecks::default())
            .await
    }

    /// See the `Inbox` method of this name.
    pub(crate) async fn process_batch_with<H: Handler>(
        &self,
        handler: &H,
        items: Vec<BatchItem<H::Message>>,
        checks: BatchChecks,
    ) -> Vec<Result<Outcome<H::Output>>>
    where
        H::Message: Clone,
    {
        if handler.mode() != Mode::Transactional {
            let mut results = Vec::with_capacity(items.len());
            for item in items {
                let result = self
                    .process_with_key(handler, item.key, item.message, &item.metadata)
                    .await;
                results.push(result);
            }
            return results;
        }
        let mut results = Vec::with_capacity(items.len());
        let mut items = items.into_iter().peekable();
        while items.peek().is_some() {
            let chunk: Vec<_> = items.by_ref().take(MAX_BATCH).collect();
            let size = chunk.len();
            let one = self.one_batch(handler, chunk, checks);
            results.extend(in_chunk(handler.consumer(), size, one).await);
        }
        results
    }

    /// One transaction's worth of a batch, each fresh message run by its own call.
    async fn one_batch<H: Handler>(
        &self,
        handler: &H,
        items: Vec<BatchItem<H::Message>>,
        checks: BatchChecks,
    ) -> Vec<Result<Outcome<H::Output>>>
    where
        H::Message: Clone,
    {
        let (mut sorted, consumer, retention) = match self.sort(handler, items) {
            Ok(sorted) => sorted,
            Err(failed) => return failed,
        };
        let mut leads = std::mem::take(&mut sorted.leads);
        let batch = Batch {
            handler,
            consumer: &consumer,
            metadata: &sorted.metadata,
            retention,
            checks,
        };
        let transacted = self.transact(&batch, &mut leads).await;
        self.conclude(handler, sorted, leads, &consumer, transacted)
            .await
    }

    /// The items sorted into fates, with the handler's consumer and retention; every item
    /// failed when the handler's configuration cannot work.
    #[allow(clippy::type_complexity)]
    pub(super) fn sort<H: Handler>(
        &self,
        handler: &H,
        items: Vec<BatchItem<H::Message>>,
    ) -> Result<
        (Sorted<H::Message, H::Output>, ConsumerName, Duration),
        Vec<Result<Outcome<H::Output>>>,
    > {
        let consumer = match ConsumerName::new(handler.consumer()) {
            Ok(consumer) => consumer,
            Err(error) => {
                let error = || Error::InvalidConsumer(error.clone());
                return Err(fail_all(handler.consumer(), &items, error));
            }
        };
        let retention = match self.settings_for(&consumer, handler) {
            Ok((retention, _)) => retention,
            Err(error) => {
                return Err(fail_all(consumer.as_str(), &items, || {
                    Error::Config(error.clone())
                }));
            }
        };
        Ok((sort_out(handler, &consumer, items), consumer, retention))
    }

    /// Turns the fates into results once the transaction ended (every message it held
    /// failed with its error when it was lost), and processes the messages left for later one
    /// by one.
    pub(super) async fn conclude<H: Handler>(
        &self,
        handler: &H,
        mut sorted: Sorted<H::Message, H::Output>,
        mut leads: Vec<Lead<H::Message, H::Output>>,
        consumer: &ConsumerName,
        transacted: Result<(), Lost>,
    ) -> Vec<Result<Outcome<H::Output>>> {
        if let Err(lost) = transacted {
            // A statement of the batch refused for a reason of the database's own (a statement
            // timeout on a large batch, say) is no message's fault: each goes the per-message
            // way, which tells.
            let alone = lost.refused();
            for lead in &mut leads {
                if matches!(
                    lead.fate,
                    Fate::Fresh | Fate::Processed(..) | Fate::Deferred
                ) {
                    lead.fate = if alone {
                        Fate::Deferred
                    } else {
                        Fate::Failed(lost.error_for(&lead.key))
                    };
                }
            }
        }
        sorted.leads = leads;
        for Later {
            index,
            key,
            message,
        } in sorted.answer(consumer, &self.telemetry)
        {
            let metadata = &sorted.metadata[index];
            let result = self
                .process_with_key(handler, Ok(key), message, metadata)
                .await;
            sorted.put(index, result);
        }
        sorted.results()
    }
}

/// Fails every item with `error` (a configuration that cannot work), recorded for `consumer`.
fn fail_all<M, T>(
    consumer: &str,
    items: &[BatchItem<M>],
    error: impl Fn() -> Error,
) -> Vec<Result<Outcome<T>>> {
    let results: Vec<_> = items.iter().map(|_| Err(error())).collect();
    for (item, result) in items.iter().zip(&results) {
        record(consumer, &item.metadata, result);
    }
    results
}
