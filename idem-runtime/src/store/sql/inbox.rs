//! The inbox's statements that differ between backends: the claim, the cleaner's delete,
//! what start-up reads of the table, and the statements over many keys of batches.
//!
//! Every time a statement compares or writes is the database's clock
//! ([`Syntax::now_ms`](super::syntax::Syntax::now_ms)); durations are bound as milliseconds
//! and added to it.

use std::time::Duration;

use super::syntax::WithValues;
use crate::key::{ConsumerName, MessageKey};
use crate::store::values::BatchClaim;

/// The inbox table as statements over many keys see it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct InboxTable<'a> {
    /// Its name, quoted.
    pub(crate) quoted: &'a str,
    /// The hint naming its unique index on `(consumer, message_key)`, where one was found
    /// (MySQL/MariaDB): an `IN` list read without it may be scanned, locking the whole
    /// consumer's records.
    pub(crate) key_index: Option<&'a str>,
    /// How long a claim waits for another transaction holding its key.
    pub(crate) claim_wait: Duration,
    /// The `lock_timeout` the application configured (PostgreSQL), which a batch's claim
    /// restores once every key is claimed.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) lock_timeout: &'a str,
}

impl InboxTable<'_> {
    /// The key index's hint, or nothing.
    pub(crate) fn hint(&self) -> &str {
        self.key_index.unwrap_or("")
    }
}

/// How the cleaner deletes expired records.
#[derive(Debug, Clone)]
pub(crate) enum ExpiredDelete {
    /// One statement deletes them, skipping those other transactions hold, and returns their
    /// `consumer, message_key, status, completed_at`. Binds the time before which records
    /// expired and the batch size.
    Returning(String),
    /// A statement selects those columns of them, locking them and skipping those other
    /// transactions hold, and `delete` writes the delete of so many of them by key (binding
    /// consumer and key of each), in one short transaction: a delete by a range would wait for
    /// every record it meets that another transaction holds (MySQL/MariaDB).
    SelectThenDelete {
        /// Binds as [`ExpiredDelete::Returning`] does.
        select: String,
        /// The delete of `rows` records by key.
        delete: fn(&InboxTable<'_>, usize) -> String,
    },
}

impl ExpiredDelete {
    /// The same, its first statement's text mapped by `f`.
    pub(crate) fn map(self, f: impl FnOnce(String) -> String) -> Self {
        match self {
            ExpiredDelete::Returning(sql) => ExpiredDelete::Returning(f(sql)),
            ExpiredDelete::SelectThenDelete { select, delete } => ExpiredDelete::SelectThenDelete {
                select: f(select),
                delete,
            },
        }
    }
}

/// What a batch's claim statement returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ClaimsReturn {
    /// Nothing (MySQL has no `INSERT ... RETURNING`): the keys it inserted are the ones that
    /// now carry its token.
    Nothing,
    /// The keys it inserted.
    Keys,
    /// The keys it inserted, each with the id of the transaction holding them (PostgreSQL);
    /// the statement also ends its bounded lock wait, once every key is claimed.
    KeysAndTransaction,
}

/// What one completion statement of a batch writes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Completion<'a> {
    pub(crate) consumer: &'a ConsumerName,
    /// The token that holds the claims.
    pub(crate) token: i64,
    /// The keys and their outputs.
    pub(crate) outputs: &'a [(&'a MessageKey, Option<&'a str>)],
    /// How long the records are kept from now.
    pub(crate) retention: Duration,
    /// The batch's transaction, where the database tells it: the statement completes nothing
    /// in another (one a handler's own `COMMIT` left it in).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) transaction_id: Option<i64>,
}

impl Completion<'_> {
    /// Whether no record stores an output: the statement sets none.
    pub(crate) fn all_null(&self) -> bool {
        self.outputs.iter().all(|(_, output)| output.is_none())
    }
}

/// The inbox's statements that differ between backends.
pub(crate) trait InboxSql {
    /// The conditional insert of a claim into `t` (quoted) with `values` (the placeholders and
    /// clock expressions of `CLAIM_COLUMNS`), unless a record of its key exists, waiting at most
    /// `wait` for a concurrent claim of the key that has not committed. Where the backend bounds
    /// lock waits per transaction ([`Syntax::set_lock_timeout`](super::syntax::Syntax)), it
    /// also binds the bound to restore, and returns a row when it inserted.
    fn insert_claim(&self, t: &str, values: &str, wait: Duration) -> String;

    /// A claim, as `insert_claim` writes it, that tells a duplicate from a row the table drops
    /// by the rows it counts, where the conditional insert drops both without an error
    /// (MySQL/MariaDB's `INSERT IGNORE`): 0 dropped, 1 stored, more a duplicate.
    fn counting_probe(&self, insert_claim: &str) -> Option<String>;

    /// How the cleaner deletes the records of `t` (quoted) that expired.
    fn delete_expired(&self, t: &str) -> ExpiredDelete;

    /// The query that reads the unique indexes of the table (bound by name): each one's name,
    /// its columns (lower case, comma-separated, in order) and whether one covers only a
    /// prefix of a column; where batches name the key's index (MySQL/MariaDB).
    fn key_index_query(&self) -> Option<&'static str>;

    /// The hint that names the index `index` (unquoted, as the server names it).
    fn key_index_hint(&self, index: &str) -> String;

    /// The query that reads the largest packet the server takes, where a larger one resets the
    /// connection (MySQL/MariaDB's `max_allowed_packet`).
    fn packet_limit_query(&self) -> Option<&'static str>;

    /// What [`InboxSql::insert_claims`] returns.
    fn claims_return(&self) -> ClaimsReturn;

    /// The claim of every key of `claims` for `consumer` in one statement, each in progress
    /// with `token` and kept `retention`, unless a record exists; a concurrent claim of a key
    /// that has not committed is waited for at most the claim wait.
    fn insert_claims(
        &self,
        at: &InboxTable<'_>,
        consumer: &ConsumerName,
        claims: &[BatchClaim<'_>],
        token: i64,
        retention: Duration,
    ) -> WithValues;

    /// The read of the records of `keys` for `consumer` (`message_key`, `READ_COLUMNS`, the
    /// database's clock), as a claim reads one.
    fn find_many(
        &self,
        at: &InboxTable<'_>,
        consumer: &ConsumerName,
        keys: &[&MessageKey],
    ) -> WithValues;

    /// The most bytes of keys and outputs one completion may carry within `limit`: half where
    /// its padding repeats the last output.
    fn completion_bytes(&self, at: &InboxTable<'_>, limit: usize) -> usize;

    /// The completion of the claims `completion.token` holds, each with its output.
    fn complete_many(&self, at: &InboxTable<'_>, completion: &Completion<'_>) -> WithValues;

    /// The delete of the claims `token` holds on `keys`.
    fn release_many(
        &self,
        at: &InboxTable<'_>,
        consumer: &ConsumerName,
        token: i64,
        keys: &[&MessageKey],
    ) -> WithValues;
}
