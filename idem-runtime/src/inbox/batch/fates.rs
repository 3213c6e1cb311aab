//! A batch's items sorted into fates: the first copy of each key (a lead, sorted by key, the
//! order their claims lock in), its later copies (repeats), and the results known before any
//! statement; after the transaction, each fate turned into the result the message would have
//! had alone.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use super::item::BatchItem;
use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::handler::{Handler, Outcome};
use crate::inbox::claim::check_stored_fingerprint;
use crate::inbox::handling::{decode_stored, fingerprint_of};
use crate::key::{ConsumerName, InboxKey, MessageKey};
use crate::metadata::Metadata;
use crate::observe;
use crate::store::{Row, Status};
use crate::telemetry::Telemetry;

/// What became of the first copy of a key in the batch.
pub(super) enum Fate<T> {
    /// Claimed fresh; its handler has not run yet.
    Fresh,
    /// Processed here, to be committed: the output and its JSON as stored.
    Processed(T, Option<String>),
    /// A completed record.
    Duplicate(Recorded),
    /// Left for the per-message path after the commit.
    Deferred,
    /// Failed with this error; nothing of it is committed.
    Failed(Error),
}

/// What the inbox holds of a completed key, for its copies.
pub(super) struct Recorded {
    /// The output as stored (JSON).
    output: Option<String>,
    /// The fingerprint stored with it.
    fingerprint: Option<Vec<u8>>,
    /// How long before the batch it was completed (zero when in this batch).
    age: Option<Duration>,
}

/// The first copy of a key in the batch.
pub(super) struct Lead<M, T> {
    pub(super) index: usize,
    pub(super) key: InboxKey,
    pub(super) fingerprint: Option<Fingerprint>,
    /// Kept until it commits: the batch may run again, or leave it to the per-message path.
    pub(super) message: Option<M>,
    pub(super) fate: Fate<T>,
    /// Whether this try inserted its claim.
    pub(super) claimed: bool,
    /// Whether its handler failed in an unguarded try: its error stands, and the next try
    /// leaves it out.
    pub(super) failed_alone: bool,
    /// How many messages its handler staged in the outbox.
    pub(super) staged: u32,
}

/// What a handler that succeeded gave: its output, the JSON stored for it, and how many
/// messages it staged in the outbox.
pub(super) struct Handled<T> {
    pub(super) output: T,
    pub(super) stored: Option<String>,
    pub(super) staged: u32,
}

impl<M, T> Lead<M, T> {
    /// A copy of the message for its handler.
    pub(super) fn message_copy(&self) -> M
    where
        M: Clone,
    {
        self.message
            .clone()
            .expect("a fresh message is kept until it commits")
    }

    pub(super) fn processed(&mut self, handled: Handled<T>) {
        self.staged = handled.staged;
        self.fate = Fate::Processed(handled.output, handled.stored);
    }

    pub(super) fn failed(&mut self, error: Error) {
        self.staged = 0;
        self.fate = Fate::Failed(error);
    }

    /// Fails it with `error` for the rest of the batch: its claim goes with this try, and the
    /// next try leaves it out.
    pub(super) fn fail_alone(&mut self, error: Error) {
        self.failed(error);
        self.set_aside();
    }

    /// Leaves it, failed already, out of the batch's next tries: its claim goes with this try.
    pub(super) fn set_aside(&mut self) {
        self.claimed = false;
        self.failed_alone = true;
    }

    pub(super) fn is_fresh(&self) -> bool {
        matches!(self.fate, Fate::Fresh)
    }

    pub(super) fn is_processed(&self) -> bool {
        matches!(self.fate, Fate::Processed(..))
    }

    /// Whether this try's claim of it is to be given up (its handler failed).
    pub(super) fn claim_to_release(&self) -> bool {
        self.claimed && matches!(self.fate, Fate::Failed(_))
    }
}

/// A later copy of a key already in the batch.
pub(super) struct Repeat<M> {
    index: usize,
    key: MessageKey,
    fingerprint: Option<Fingerprint>,
    message: M,
}

/// The items of a batch sorted out.
pub(super) struct Sorted<M, T> {
    pub(super) leads: Vec<Lead<M, T>>,
    repeats: Vec<Repeat<M>>,
    pub(super) metadata: Vec<Metadata>,
    results: Vec<Option<Result<Outcome<T>>>>,
}

/// A message left for the per-message path.
pub(super) struct Later<M> {
    /// Its place in the batch.
    pub(super) index: usize,
    pub(super) key: MessageKey,
    pub(super) message: M,
}

/// Sorts the items out: their metadata, the results known before any statement (an invalid
/// key, a message that cannot be fingerprinted), the first copy of each key (sorted by key) and
/// the later copies.
pub(super) fn sort_out<H: Handler>(
    handler: &H,
    consumer: &ConsumerName,
    items: Vec<BatchItem<H::Message>>,
) -> Sorted<H::Message, H::Output> {
    let mut sorted = Sorted {
        leads: Vec::with_capacity(items.len()),
        repeats: Vec::new(),
        metadata: Vec::with_capacity(items.len()),
        results: Vec::with_capacity(items.len()),
    };
    let mut seen = HashSet::new();
    for (index, item) in items.into_iter().enumerate() {
        let early = match item.key {
            Err(error) => Some(Err(Error::InvalidKey(error))),
            Ok(key) => match fingerprint_of(handler, &item.message, &item.metadata) {
                Err(error) => Some(Err(error)),
                Ok(fingerprint) if seen.contains(&key) => {
                    sorted.repeats.push(Repeat {
                        index,
                        key,
                        fingerprint,
                        message: item.message,
                    });
                    None
                }
                Ok(fingerprint) => {
                    seen.insert(key.clone());
                    sorted.leads.push(Lead {
                        index,
                        key: InboxKey {
                            consumer: consumer.clone(),
                            message_key: key,
                        },
                        fingerprint,
                        message: Some(item.message),
                        fate: Fate::Deferred,
                        claimed: false,
                        failed_alone: false,
                        staged: 0,
                    });
                    None
                }
            },
        };
        if let Some(result) = &early {
            record(consumer.as_str(), &item.metadata, result);
        }
        sorted.results.push(early);
        sorted.metadata.push(item.metadata);
    }
    sorted
        .leads
        .sort_by(|a, b| a.key.message_key.cmp(&b.key.message_key));
    sorted
}

/// What a record found for a first copy means: a completed, unexpired record is a duplicate
/// (or a mismatch); an unreadable one is corrupt; anything else goes the per-message way.
pub(super) fn known_fate<M, T>(lead: &Lead<M, T>, row: Row) -> Fate<T> {
    let Some(status) = Status::parse(&row.status) else {
        return Fate::Failed(Error::CorruptRecord {
            key: lead.key.clone(),
            detail: format!("unknown status {:?}", row.status),
        });
    };
    if status != Status::Completed || row.expires_at <= row.now {
        return Fate::Deferred;
    }
    match check_stored_fingerprint(
        &lead.key,
        row.fingerprint.as_deref(),
        lead.fingerprint.as_ref(),
    ) {
        Ok(()) => {
            let age = row.completed_age();
            Fate::Duplicate(Recorded {
                output: row.output,
                fingerprint: row.fingerprint,
                age,
            })
        }
        Err(error) => Fate::Failed(error),
    }
}

/// What a later copy of a key learns from its first copy.
enum First {
    /// It is recorded.
    Stored(Recorded),
    /// It failed.
    Failed,
}

impl<M, T: serde::de::DeserializeOwned> Sorted<M, T> {
    /// Turns every settled fate into its message's result (counted and logged as the
    /// per-message path does), and answers later copies from their first copy. Returns the
    /// messages left for the per-message path, first copies before their later copies.
    pub(super) fn answer(
        &mut self,
        consumer: &ConsumerName,
        telemetry: &Telemetry,
    ) -> Vec<Later<M>> {
        let mut later = Vec::new();
        let firsts = self.answer_leads(consumer, telemetry, &mut later);
        self.answer_repeats(consumer, telemetry, &firsts, &mut later);
        later.sort_by_key(|later| later.index);
        later
    }

    /// Settles every first copy whose fate is known, and leaves the others in `later`; returns
    /// what their later copies learn from them.
    fn answer_leads(
        &mut self,
        consumer: &ConsumerName,
        telemetry: &Telemetry,
        later: &mut Vec<Later<M>>,
    ) -> HashMap<MessageKey, First> {
        let mut firsts = HashMap::new();
        for lead in std::mem::take(&mut self.leads) {
            let Lead {
                index, key, fate, ..
            } = lead;
            let result = match fate {
                Fate::Processed(output, json) => {
                    let first = First::Stored(Recorded {
                        output: json,
                        fingerprint: lead.fingerprint.map(|print| print.as_bytes().to_vec()),
                        age: Some(Duration::ZERO),
                    });
                    firsts.insert(key.message_key.clone(), first);
                    Ok(Outcome::Processed(output))
                }
                Fate::Duplicate(recorded) => {
                    let result =
                        decode_stored(&key, recorded.output.clone()).map(Outcome::Duplicate);
                    if result.is_ok() {
                        telemetry.duplicate(consumer.as_str(), recorded.age);
                    }
                    firsts.insert(key.message_key.clone(), First::Stored(recorded));
                    result
                }
                Fate::Failed(error) => {
                    firsts.insert(key.message_key.clone(), First::Failed);
                    Err(error)
                }
                Fate::Deferred => {
                    let message = lead.message.expect("a deferred message was not run");
                    later.push(Later {
                        index,
                        key: key.message_key,
                        message,
                    });
                    continue;
                }
                Fate::Fresh => unreachable!("a fresh claim either ran or its batch was lost"),
            };
            self.settle(consumer, index, result);
        }
        firsts
    }

    /// Answers later copies from their first copy, and leaves those whose first copy was left
    /// in `later`.
    fn answer_repeats(
        &mut self,
        consumer: &ConsumerName,
        telemetry: &Telemetry,
        firsts: &HashMap<MessageKey, First>,
        later: &mut Vec<Later<M>>,
    ) {
        for repeat in std::mem::take(&mut self.repeats) {
            let key = InboxKey {
                consumer: consumer.clone(),
                message_key: repeat.key,
            };
            let result = match firsts.get(&key.message_key) {
                Some(First::Stored(recorded)) => {
                    let result = check_stored_fingerprint(
                        &key,
                        recorded.fingerprint.as_deref(),
                        repeat.fingerprint.as_ref(),
                    )
                    .and_then(|()| decode_stored(&key, recorded.output.clone()))
                    .map(Outcome::Duplicate);
                    if result.is_ok() {
                        telemetry.duplicate(consumer.as_str(), recorded.age);
                    }
                    result
                }
                // The first copy failed: this one is retried after it, not beside it.
                Some(First::Failed) => Err(Error::InProgressElsewhere {
                    key,
                    remaining: Duration::ZERO,
                }),
                None => {
                    later.push(Later {
                        index: repeat.index,
                        key: key.message_key,
                        message: repeat.message,
                    });
                    continue;
                }
            };
            self.settle(consumer, repeat.index, result);
        }
    }

    /// Records the result of the message at `index`, counted and logged.
    fn settle(&mut self, consumer: &ConsumerName, index: usize, result: Result<Outcome<T>>) {
        record(consumer.as_str(), &self.metadata[index], &result);
        self.results[index] = Some(result);
    }

    /// The result of the message at `index`, processed (and counted) on its own.
    pub(super) fn put(&mut self, index: usize, result: Result<Outcome<T>>) {
        self.results[index] = Some(result);
    }

    /// Every message's result, in the batch's order.
    pub(super) fn results(self) -> Vec<Result<Outcome<T>>> {
        self.results
            .into_iter()
            .map(|result| result.expect("every message of a batch has a result"))
            .collect()
    }
}

/// Counts and logs one message's result, as the per-message path does.
pub(super) fn record<T>(consumer: &str, metadata: &Metadata, result: &Result<Outcome<T>>) {
    let span = observe::span(consumer, metadata);
    observe::record(&span, consumer, result, false);
}
