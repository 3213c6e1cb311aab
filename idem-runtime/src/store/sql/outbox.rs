//! The outbox's statements that differ between backends: staging, the relays' reads and
//! holds, marking sent, and the checks of the table's shape.
//!
//! Times are the database's clock, in milliseconds.

use sea_orm::TransactionOptions;

use super::syntax::WithValues;

/// The columns a staging writes, in the order it binds them; `staged_at` is the clock.
pub(crate) const STAGED_COLUMNS: &str =
    "message_id, exchange, routing_key, content_type, headers, payload, origin, staged_at";

/// A staging statement: plain, and announced on the outbox's channel where the backend can
/// (PostgreSQL).
#[derive(Debug, Clone)]
pub(crate) struct Staging {
    /// Binds the message's seven values, then those of its guard.
    pub(crate) plain: String,
    /// The same, announcing the commit on the outbox's channel (bound last) when it inserted.
    pub(crate) announced: Option<String>,
    /// Whether it returns a row when it inserted (PostgreSQL), rather than counting the rows it
    /// wrote.
    pub(crate) returns_rows: bool,
}

impl Staging {
    /// The statement, announced where it can be and `announce` says so.
    pub(crate) fn sql(&self, announce: bool) -> &str {
        match &self.announced {
            Some(announced) if announce => announced,
            _ => &self.plain,
        }
    }

    /// Whether it can announce its commit.
    pub(crate) fn announces(&self) -> bool {
        self.announced.is_some()
    }

    /// The same with `{inbox}` replaced by `inbox`.
    pub(crate) fn filled(&self, inbox: &str) -> Self {
        let fill = |sql: &str| sql.replace("{inbox}", inbox);
        Self {
            plain: fill(&self.plain),
            announced: self.announced.as_deref().map(fill),
            returns_rows: self.returns_rows,
        }
    }
}

/// A value an exchange hold binds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Bound {
    /// The hold's length, in milliseconds.
    Pause,
    /// The exchange.
    Exchange,
}

/// One run's rows a relay reads: the run, the seq it starts after, the last seq it reads up to.
pub(crate) type RunBounds<'a> = (&'a str, i64, i64);

/// The outbox's statements that differ between backends.
pub(crate) trait OutboxSql {
    /// The staging of a message into `t` (quoted), once per message id, under `guard` (a
    /// ` WHERE ...` condition, or nothing).
    fn staging(&self, t: &str, guard: &str) -> Staging;

    /// The origin column compared by its bytes where its collation would take runs that differ
    /// in case, accents or trailing spaces for one (MySQL/MariaDB).
    fn origin_bytes(&self) -> &'static str;

    /// The condition on the rows of one run, binding the run at each of its placeholders: by the
    /// column's collation (through its index), then by its bytes where they differ.
    fn same_run(&self) -> &'static str;

    /// The unsent rows of `runs` (origin, seq, hold, the database's clock) through the index
    /// `hint` names, each run's within its bounds where the backend reads one range per run;
    /// unordered.
    fn unsent_of_runs(&self, t: &str, hint: &str, runs: &[RunBounds<'_>]) -> WithValues;

    /// The statements that hold every message to an exchange, and every message of a run that
    /// has one, each with the values it binds in order.
    fn hold_exchange(&self, t: &str) -> Vec<(String, &'static [Bound])>;

    /// Marks the messages of `seqs` sent.
    fn mark_sent(&self, t: &str, seqs: &[i64]) -> WithValues;

    /// Deletes sent messages older than the retention: binds the retention (ms) and the limit.
    fn delete_sent(&self, t: &str) -> String;

    /// Releases at most `limit` holds that ran out, in the order of the index of holds.
    fn release_holds(&self, t: &str, limit: u64) -> String;

    /// How a relay's transaction begins, whose row locks hold its batch; `None` where relays
    /// take turns in process instead (SQLite).
    fn relay_transaction(&self) -> Option<TransactionOptions>;

    /// The statement that wakes the relays listening on a channel (bound), where they listen
    /// (PostgreSQL).
    fn notify(&self) -> Option<&'static str>;

    /// The query that returns a row when the table (bound by name) has the column `column`.
    fn column_exists(&self, column: &str) -> String;
}

/// The values a staging binds besides its guard's: the message's seven, and the clock.
fn staged_values(now: &str) -> String {
    format!("?, ?, ?, ?, ?, ?, ?, {now}")
}

/// A staging into `t` under `guard` that does nothing on a message id staged already, as
/// PostgreSQL and SQLite write it.
pub(crate) fn insert_or_nothing(t: &str, now: &str, guard: &str) -> String {
    let values = staged_values(now);
    if guard.is_empty() {
        format!(
            "INSERT INTO {t} ({STAGED_COLUMNS}) VALUES ({values}) \
             ON CONFLICT (message_id) DO NOTHING"
        )
    } else {
        format!(
            "INSERT INTO {t} ({STAGED_COLUMNS}) SELECT {values}{guard} \
             ON CONFLICT (message_id) DO NOTHING"
        )
    }
}

/// A staging into `t` under `guard` that changes nothing on a message id staged already, as
/// MySQL/MariaDB write it: not `INSERT IGNORE`, which would also store a value too long for
/// its column truncated, with a warning.
pub(crate) fn insert_or_keep(t: &str, now: &str, guard: &str) -> String {
    let values = staged_values(now);
    if guard.is_empty() {
        format!(
            "INSERT INTO {t} ({STAGED_COLUMNS}) VALUES ({values}) \
             ON DUPLICATE KEY UPDATE seq = seq"
        )
    } else {
        format!(
            "INSERT INTO {t} ({STAGED_COLUMNS}) SELECT {values} FROM DUAL{guard} \
             ON DUPLICATE KEY UPDATE seq = seq"
        )
    }
}

/// The hold of an exchange's messages and runs in one statement, which reads the table it
/// updates in a subquery: binds the pause, then the exchange twice.
pub(crate) fn hold_exchange_at_once(t: &str, now: &str) -> String {
    format!(
        "UPDATE {t} SET held_until = {now} + ? WHERE sent_at IS NULL AND \
         (exchange = ? OR origin IN (SELECT origin FROM {t} \
         WHERE sent_at IS NULL AND exchange = ? AND origin IS NOT NULL))"
    )
}

/// The delete of sent messages, chosen by a subquery on seqs.
pub(crate) fn delete_sent_by_seq(t: &str, now: &str) -> String {
    format!(
        "DELETE FROM {t} WHERE seq IN \
         (SELECT seq FROM {t} WHERE sent_at < {now} - ? LIMIT ?)"
    )
}

/// The release of holds that ran out, chosen by a subquery on seqs (bounded and in the order
/// of the index of holds, whatever the planner knows of the table: without statistics, a
/// table just filled, PostgreSQL scanned it whole).
pub(crate) fn release_by_seq(t: &str, now: &str, limit: u64) -> String {
    format!(
        "UPDATE {t} SET held_until = NULL WHERE seq IN (SELECT seq FROM {t} \
         WHERE held_until IS NOT NULL AND held_until <= {now} \
         ORDER BY held_until LIMIT {limit})"
    )
}
