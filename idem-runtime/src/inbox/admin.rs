//! The operators' side of an inbox (see `crate::admin`): counts, lookups, claims ended,
//! records forgotten, summaries.

use std::time::Duration;

use super::handle::Inbox;
use super::operate::{ConsumerStats, Forgotten, Released};
use super::record::InboxRecord;
use crate::error::Result;
use crate::key::InboxKey;
use crate::store::LiveClaim;
use crate::telemetry::DuplicateSummary;

/// What an operator does with an inbox besides processing: counts per consumer, one record, a
/// stuck claim ended, a record forgotten, the duplicates' summaries. Import it to call these on
/// an [`Inbox`] (the `idem` command does).
pub trait InboxAdmin {
    /// Counts the records of each consumer, or of `consumer` only, by the database's clock.
    fn stats(
        &self,
        consumer: Option<&str>,
    ) -> impl Future<Output = Result<Vec<ConsumerStats>>> + Send;

    /// Reads the record of `key` as committed, if any, without waiting for a claim still in
    /// its transaction (for operators and tests).
    fn lookup(&self, key: &InboxKey) -> impl Future<Output = Result<Option<InboxRecord>>> + Send;

    /// Ends the claim held on `key` now, as a lease running out would, and takes its token away:
    /// the record and its attempts stay, the next delivery takes the key over under a new
    /// claim token, and the worker that held it can neither renew nor complete it. For a worker
    /// known dead, or stuck past any use. A claim whose lease still runs is left alone unless
    /// `live` overrides it ([`Released::Live`]); one that changes while this runs is left alone
    /// too ([`Released::Changed`]): it is not the one the caller meant to end.
    fn release(
        &self,
        key: &InboxKey,
        live: LiveClaim,
    ) -> impl Future<Output = Result<Released>> + Send;

    /// Deletes the record of `key`, so the next delivery of the message is processed again: an
    /// operator's tool after reconciling a message that needed intervention. A claim whose lease
    /// still runs is left alone unless `live` overrides it ([`Forgotten::Live`]).
    fn forget(
        &self,
        key: &InboxKey,
        live: LiveClaim,
    ) -> impl Future<Output = Result<Forgotten>> + Send;

    /// Each consumer's duplicates as every process that ran it wrote them (each adds its counts
    /// to the consumer's row of the day when its cleaner task looks at the table), summed over
    /// every day kept (90): their ages and the late duplicates. Reads only.
    ///
    /// # Errors
    ///
    /// The database failed, or the table of summaries is missing (an inbox table created
    /// before it came: see the migration `UpgradeInboxCompanions`, feature `migration`).
    fn duplicate_summaries(&self) -> impl Future<Output = Result<Vec<DuplicateSummary>>> + Send;

    /// Like [`duplicate_summaries`](crate::admin::InboxAdmin::duplicate_summaries), over the days that end within
    /// `window` of now (`7d`: the last seven days and today); the retention in force is read
    /// whatever the window.
    ///
    /// # Errors
    ///
    /// As [`duplicate_summaries`](crate::admin::InboxAdmin::duplicate_summaries).
    fn duplicate_summaries_since(
        &self,
        window: Duration,
    ) -> impl Future<Output = Result<Vec<DuplicateSummary>>> + Send;
}

impl InboxAdmin for Inbox {
    async fn stats(&self, consumer: Option<&str>) -> Result<Vec<ConsumerStats>> {
        self.inner().stats(consumer).await
    }

    async fn lookup(&self, key: &InboxKey) -> Result<Option<InboxRecord>> {
        self.inner().lookup(key).await
    }

    async fn release(&self, key: &InboxKey, live: LiveClaim) -> Result<Released> {
        self.inner().release(key, live).await
    }

    async fn forget(&self, key: &InboxKey, live: LiveClaim) -> Result<Forgotten> {
        self.inner().forget(key, live).await
    }

    async fn duplicate_summaries(&self) -> Result<Vec<DuplicateSummary>> {
        self.inner().duplicate_summaries().await
    }

    async fn duplicate_summaries_since(&self, window: Duration) -> Result<Vec<DuplicateSummary>> {
        self.inner().duplicate_summaries_since(window).await
    }
}
