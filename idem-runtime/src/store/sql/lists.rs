//! Statements over lists of values written with a placeholder per value, as every backend but
//! PostgreSQL (which binds arrays) writes them, and PostgreSQL too without its driver.
//!
//! Their text depends on how many values they carry, so each is written for the next power of
//! two ([`rows_for`]), padded with rows that change nothing: lists of any length share a few
//! texts. Each connection prepares every text it runs and keeps the last hundred, and
//! MySQL/MariaDB count them against `max_prepared_stmt_count` across all their clients, after
//! which every statement fails.

use std::time::Duration;

use sea_orm::Value;

use super::inbox::{Completion, InboxTable};
use super::outbox::RunBounds;
use super::syntax::WithValues;
use crate::clock::duration_ms;
use crate::key::{ConsumerName, MessageKey};
use crate::store::values::{BatchClaim, CLAIM_COLUMNS, READ_COLUMNS, Status, opt_text, text};

/// How many rows a statement over `n` values is written for: the next power of two.
pub(crate) fn rows_for(n: usize) -> usize {
    n.max(1).next_power_of_two()
}

/// `?, ?, ...`: `n` placeholders.
pub(crate) fn placeholders(n: usize) -> String {
    vec!["?"; n].join(", ")
}

/// `keys`, then the last of them again up to [`rows_for`] of them: a key of the list changes
/// nothing a second time, where a key no record has would make MySQL/MariaDB lock the gap
/// where it would be, holding up other consumers' claims for as long as the batch runs.
pub(crate) fn padded_keys(keys: &[&MessageKey]) -> impl Iterator<Item = Value> {
    let padding = rows_for(keys.len()) - keys.len();
    let last = keys.last().into_iter().cycle().take(padding);
    keys.iter().chain(last).map(|key| text(key.as_str()))
}

/// A derived table of `n` rows binding a key `k` each, and an output `o` when `outputs`:
/// `(SELECT ? AS k UNION ALL SELECT ? ...)`.
pub(crate) fn key_table(n: usize, outputs: bool) -> String {
    let (first, rest) = if outputs {
        ("SELECT ? AS k, ? AS o", " UNION ALL SELECT ?, ?")
    } else {
        ("SELECT ? AS k", " UNION ALL SELECT ?")
    };
    format!("({first}{})", rest.repeat(n.saturating_sub(1)))
}

/// The rows of a batch's claim: `padded` rows of six placeholders each, in progress with
/// `now` as their clock.
pub(crate) fn claim_rows(now: &str, padded: usize) -> String {
    let row = format!("(?, ?, ?, ?, 1, ?, {now}, {now}, NULL, NULL, {now} + ?)");
    vec![row.as_str(); padded].join(", ")
}

/// The values of [`claim_rows`]: six per claim, padded to `padded` rows with repeats of the
/// last claim, which conflict with it and insert nothing.
pub(crate) fn claim_values(
    consumer: &ConsumerName,
    claims: &[BatchClaim<'_>],
    padded: usize,
    token: i64,
    retention: Duration,
) -> Vec<Value> {
    let expiry = Value::from(duration_ms(retention));
    let mut values = Vec::with_capacity(padded * 6);
    let last = claims
        .last()
        .into_iter()
        .cycle()
        .take(padded - claims.len());
    for claim in claims.iter().chain(last) {
        values.extend([
            text(consumer.as_str()),
            text(claim.key.as_str()),
            text(Status::InProgress.as_str()),
            Value::from(claim.fingerprint.map(|print| print.as_bytes().to_vec())),
            Value::from(token),
            expiry.clone(),
        ]);
    }
    values
}

/// A batch's claim as `ON CONFLICT DO NOTHING` writes it, returning the keys it inserted.
pub(crate) fn insert_claims(
    at: &InboxTable<'_>,
    now: &str,
    consumer: &ConsumerName,
    claims: &[BatchClaim<'_>],
    token: i64,
    retention: Duration,
) -> WithValues {
    let padded = rows_for(claims.len());
    let sql = format!(
        "INSERT INTO {} ({CLAIM_COLUMNS}) VALUES {} \
         ON CONFLICT (consumer, message_key) DO NOTHING RETURNING message_key",
        at.quoted,
        claim_rows(now, padded)
    );
    let values = claim_values(consumer, claims, padded, token, retention);
    (sql, values)
}

/// The read of `keys`' records, listed in `IN` (through the key's index, named by `hint`).
pub(crate) fn find_many(
    at: &InboxTable<'_>,
    now: &str,
    hint: &str,
    consumer: &ConsumerName,
    keys: &[&MessageKey],
) -> WithValues {
    let mut values = vec![text(consumer.as_str())];
    values.extend(padded_keys(keys));
    let sql = format!(
        "SELECT message_key, {READ_COLUMNS}, {now} FROM {}{hint} \
         WHERE consumer = ? AND message_key IN ({})",
        at.quoted,
        placeholders(rows_for(keys.len()))
    );
    (sql, values)
}

/// `completion`'s outputs, padded to [`rows_for`] of them with the last key again (see
/// [`padded_keys`]): a record completed once, with its output when `repeat_output` (a join
/// of them, where either row may set it), with none otherwise (a `CASE` takes the first match:
/// no output carried twice).
pub(crate) fn padded_outputs<'a>(
    completion: &Completion<'a>,
    repeat_output: bool,
) -> Vec<(&'a str, Option<&'a str>)> {
    let outputs = completion.outputs;
    let last = outputs
        .last()
        .map(|(key, output)| (*key, if repeat_output { *output } else { None }));
    let padding = last
        .into_iter()
        .cycle()
        .take(rows_for(outputs.len()) - outputs.len());
    (outputs.iter().copied())
        .chain(padding)
        .map(|(key, output)| (key.as_str(), output))
        .collect()
}

/// A completion whose outputs are chosen by a `CASE` on the key, of keys listed in `IN`
/// (through the key's index, named by `hint`).
pub(crate) fn case_completion(
    at: &InboxTable<'_>,
    now: &str,
    hint: &str,
    completion: &Completion<'_>,
) -> WithValues {
    let padded = padded_outputs(completion, false);
    let mut values = Vec::with_capacity(padded.len() * 3 + 3);
    let output = if completion.all_null() {
        "NULL".to_owned()
    } else {
        let mut case = "CASE message_key".to_owned();
        for (key, output) in &padded {
            case.push_str(" WHEN ? THEN ?");
            values.extend([text(key), opt_text(*output)]);
        }
        case + " END"
    };
    values.extend([
        Value::from(duration_ms(completion.retention)),
        text(completion.consumer.as_str()),
        Value::from(completion.token),
    ]);
    values.extend(padded.iter().map(|(key, _)| text(key)));
    let sql = format!(
        "UPDATE {}{hint} SET status = 'completed', output = {output}, \
         completed_at = {now}, expires_at = {now} + ?, lease_until = NULL \
         WHERE consumer = ? AND claim_token = ? AND status = 'in_progress' \
         AND message_key IN ({})",
        at.quoted,
        placeholders(padded.len())
    );
    (sql, values)
}

/// The delete of the claims `token` holds on `keys`, listed in `IN`.
pub(crate) fn release_many(
    at: &InboxTable<'_>,
    consumer: &ConsumerName,
    token: i64,
    keys: &[&MessageKey],
) -> WithValues {
    let mut values = vec![text(consumer.as_str()), Value::from(token)];
    values.extend(padded_keys(keys));
    let sql = format!(
        "DELETE FROM {} WHERE consumer = ? AND claim_token = ? AND message_key IN ({})",
        at.quoted,
        placeholders(rows_for(keys.len()))
    );
    (sql, values)
}

/// The unsent rows of `runs` within their bounds, one range of the runs' index (named by
/// `hint`) per run, padded with an empty range of a run no message has. The run compares by the
/// column's collation (a superset of the run, through its index); the caller keeps the run's own
/// bytes, read as `origin`.
pub(crate) fn unsent_of_runs(
    t: &str,
    now: &str,
    (origin, hint): (&str, &str),
    runs: &[RunBounds<'_>],
) -> WithValues {
    let range = "(origin = ? AND sent_at IS NULL AND seq > ? AND seq <= ?)";
    let rows = rows_for(runs.len());
    let ranges = vec![range; rows].join(" OR ");
    let sql = format!("SELECT {origin}, seq, held_until, {now} FROM {t}{hint} WHERE {ranges}");
    let padding = std::iter::repeat_n(("", 0, 0), rows - runs.len());
    let values = (runs.iter().copied().chain(padding))
        .flat_map(|(run, after, upto)| [Value::from(run.to_owned()), after.into(), upto.into()])
        .collect();
    (sql, values)
}

/// The messages of `seqs` marked sent, padded with a seq no message has.
pub(crate) fn mark_sent(t: &str, now: &str, seqs: &[i64]) -> WithValues {
    let rows = rows_for(seqs.len());
    let sql = format!(
        "UPDATE {t} SET sent_at = {now} WHERE seq IN ({})",
        placeholders(rows)
    );
    let padding = std::iter::repeat_n(0, rows - seqs.len());
    let values = (seqs.iter().copied().chain(padding))
        .map(Value::from)
        .collect();
    (sql, values)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_are_written_for_powers_of_two() {
        assert_eq!(placeholders(0), "");
        assert_eq!(placeholders(3), "?, ?, ?");
        assert_eq!(rows_for(0), 1);
        assert_eq!(rows_for(3), 4);
        assert_eq!(rows_for(1000), 1024);
        let keys = [MessageKey::new("a").unwrap(), MessageKey::new("b").unwrap()];
        let three: Vec<&MessageKey> = vec![&keys[0], &keys[1], &keys[1]];
        // Padded with the last key again, up to the power of two.
        let padded: Vec<Value> = padded_keys(&three).collect();
        assert_eq!(padded.len(), 4);
        assert_eq!(padded[3], text("b"));
    }
}
