//! The SQL text of every outbox statement, built once per outbox for its dialect and table;
//! what differs between backends, each backend's room writes (`store/sql/`).
//!
//! Times are the database's clock ([`Syntax::now_ms`](crate::store::sql::Syntax::now_ms)), in milliseconds. Statements over a
//! list of values bind an array on PostgreSQL and, elsewhere, are written for the next power of
//! two, padded with values no row has, so that a handful of texts serve every batch.

use sea_orm::Value;

use crate::store::dialect::Dialect;
pub(super) use crate::store::sql::Bound;
pub(crate) use crate::store::sql::Staging;
use crate::store::sql::WithValues;
use crate::store::table::TableName;

/// The columns a pending message is read with, in the order `Outbox::read_pending` reads them;
/// the database's clock comes last.
const PENDING_COLUMNS: &str =
    "seq, message_id, exchange, routing_key, content_type, headers, payload, origin, staged_at";

/// The most holds one statement releases; `Relaying::release_holds` runs it again while it
/// releases as many.
pub(super) const RELEASE_BATCH: u64 = 10_000;

/// How a staging checks that a handler run's transaction still holds its inbox claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Guard {
    /// No check: a staging outside handlers.
    None,
    /// The claim's record, by consumer, key and token (bound after the message's values).
    Claim,
    /// The transaction open (`@@in_transaction`, MariaDB), which a rolled-back one is not.
    InTransaction,
}

/// The statements of the stagings of an inbox's handler runs, which read its table: built once,
/// when the inbox is.
#[derive(Debug, Clone)]
pub(crate) struct RunStatements {
    /// Staging with the run's guard.
    pub(super) stage: Staging,
    /// The guard.
    pub(super) guard: Guard,
    /// Binds consumer, message key and claim token; returns a row while the claim is held.
    pub(super) claim_held: String,
}

#[derive(Debug)]
pub(super) struct Statements {
    dialect: Dialect,
    /// The table's name, quoted.
    table: String,
    /// Stagings by guard, the inbox table's name still to fill in (`{inbox}`).
    stage: [Staging; 3],
    /// Binds the seq to take after and the limit; `FOR UPDATE SKIP LOCKED` where rows lock.
    pub(super) take: String,
    /// The same without row locks (SQLite, whose relays take turns in process).
    pub(super) take_unlocked: String,
    /// The hint naming the index of runs, where the planner needs one.
    runs_hint: String,
    /// Holds a run from a seq on: binds the pause (ms), the run (as often as the backend
    /// compares it) and the seq.
    pub(super) hold_run: String,
    /// How many times `hold_run` binds the run.
    run_binds: usize,
    /// Holds one message of no run: binds the pause and its seq.
    pub(super) hold_message: String,
    /// Holds every message to an exchange, and every message of a run that has one, each
    /// statement with the values it binds in order.
    hold_exchange: Vec<(String, &'static [Bound])>,
    /// Releases the holds that ran out.
    pub(super) release: String,
    /// Deletes sent messages older than the retention: binds the retention (ms) and the limit.
    pub(super) delete_sent: String,
    /// Reads every column this version uses, from no row (through the indexes that MySQL/MariaDB
    /// statements name).
    pub(super) check_schema: String,
    /// Binds consumer, message key and claim token; the inbox table's name still to fill in.
    claim_held: String,
}

impl Statements {
    pub(super) fn new(dialect: Dialect, table: &TableName) -> Self {
        let t = dialect.quote(table.as_str());
        let now = dialect.now_ms();
        let claim = " WHERE EXISTS (SELECT 1 FROM {inbox} WHERE consumer = ? AND message_key = ? \
                     AND claim_token = ?)";
        let open =
            (dialect.open_transaction()).map_or(String::new(), |open| format!(" WHERE {open}"));
        let stage =
            [String::new(), claim.to_owned(), open].map(|guard| dialect.staging(&t, &guard));
        // MariaDB took the index of holds for `held_until IS NULL` once the statement read
        // the payload too, and stepped over every sent row from the first at each batch.
        // So did it for the order check, taking the index of pending rows for `sent_at IS
        // NULL` over the runs' ranges: every unsent row read, 370 ms beside 100 k of them.
        let forced = |suffixes: &[&str]| {
            let names: Vec<String> = (suffixes.iter())
                .map(|suffix| dialect.quote(&format!("{}_{suffix}", table.as_str())))
                .collect();
            dialect.force_index(&names)
        };
        let ready = forced(&["ready"]);
        let take = |lock: &str| {
            dialect.placeholders(&format!(
                "SELECT {PENDING_COLUMNS}, {now} FROM {t}{ready} \
                 WHERE sent_at IS NULL AND held_until IS NULL AND seq > ? \
                 ORDER BY seq LIMIT ?{lock}"
            ))
        };
        let same_run = dialect.same_run();
        Self {
            stage,
            claim_held: dialect.placeholders(
                "SELECT 1 FROM {inbox} WHERE consumer = ? AND message_key = ? AND claim_token = ?",
            ),
            take: take(dialect.skip_locked()),
            take_unlocked: take(""),
            runs_hint: forced(&["runs"]),
            hold_run: dialect.placeholders(&format!(
                "UPDATE {t} SET held_until = {now} + ? \
                 WHERE sent_at IS NULL AND {same_run} AND seq >= ?"
            )),
            run_binds: same_run.matches('?').count(),
            hold_message: dialect.placeholders(&format!(
                "UPDATE {t} SET held_until = {now} + ? WHERE sent_at IS NULL AND seq = ?"
            )),
            hold_exchange: dialect.hold_exchange(&t),
            // Bounded and in the order of the index of holds, whatever the planner knows of the
            // table: without statistics (a table just filled), PostgreSQL scanned it whole.
            release: dialect.release_holds(&t, RELEASE_BATCH),
            delete_sent: dialect.delete_sent(&t),
            check_schema: format!(
                "SELECT {PENDING_COLUMNS}, sent_at, held_until FROM {t}{} WHERE 1 = 0",
                forced(&["ready", "runs"])
            ),
            table: t,
            dialect,
        }
    }

    /// The staging of messages outside handlers.
    pub(super) fn stage(&self) -> &Staging {
        &self.stage[Guard::None as usize]
    }

    /// The statements of the handler runs of the inbox whose table is `inbox` (quoted): each
    /// staging checks that the run's transaction still holds its inbox claim (MariaDB tells it
    /// cheaper: a transaction is open only until it is rolled back).
    pub(super) fn for_inbox(&self, inbox: &str) -> RunStatements {
        let guard = if self.dialect.tells_open_transaction() {
            Guard::InTransaction
        } else {
            Guard::Claim
        };
        RunStatements {
            stage: self.stage[guard as usize].filled(inbox),
            guard,
            claim_held: self.claim_held.replace("{inbox}", inbox),
        }
    }

    /// The unsent rows of runs within bounds (each run with the seq it starts after and the
    /// last seq it reads up to): run, seq, hold (ms, or NULL) and the database's clock.
    /// Unordered: the caller sorts each run's few rows, rather than the database sorting them
    /// all, and leaves out rows outside a run's own bounds.
    pub(super) fn unsent_of_runs(&self, runs: &[(&str, i64, i64)]) -> WithValues {
        self.dialect
            .unsent_of_runs(&self.table, &self.runs_hint, runs)
    }

    /// The statements that hold an exchange, each with the values it binds in order: which of
    /// the pause and the exchange.
    pub(super) fn hold_exchange(&self) -> impl Iterator<Item = (&str, &'static [Bound])> {
        (self.hold_exchange.iter()).map(|(sql, binds)| (sql.as_str(), *binds))
    }

    /// Marks `seqs` sent.
    pub(super) fn mark_sent(&self, seqs: &[i64]) -> WithValues {
        self.dialect.mark_sent(&self.table, seqs)
    }

    /// The values of a message of `run` to hold from `seq` on, the pause first.
    pub(super) fn hold_run_values(&self, pause_ms: i64, run: &str, seq: i64) -> Vec<Value> {
        let mut values = vec![Value::from(pause_ms)];
        values.extend((0..self.run_binds).map(|_| Value::from(run.to_owned())));
        values.push(Value::from(seq));
        values
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postgres_announces_in_the_staging_statement() {
        let table = TableName::new("idem_outbox").unwrap();
        let pg = Statements::new(Dialect::named("postgres"), &table);
        let sql = pg.stage().sql(true);
        assert!(sql.starts_with("WITH staged AS (INSERT"), "{sql}");
        assert!(sql.contains("pg_notify($8"), "{sql}");
        let run = pg.for_inbox("\"inbox\"");
        assert_eq!(run.guard, Guard::Claim);
        let guarded = run.stage.sql(false);
        assert!(
            guarded.contains("FROM \"inbox\" WHERE consumer = $8"),
            "{guarded}"
        );
        assert!(
            run.claim_held.contains("consumer = $1"),
            "{}",
            run.claim_held
        );
        let my = Statements::new(Dialect::named("mariadb"), &table);
        assert!(!my.stage().sql(true).contains("pg_notify"));
        assert_eq!(my.for_inbox("`inbox`").guard, Guard::InTransaction);
    }
}
