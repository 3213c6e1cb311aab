//! The SQL text of every outbox statement, built once per outbox for its dialect and table.
//!
//! Times are the database's clock ([`Dialect::now_ms`]), in milliseconds. Statements over a
//! list of values bind an array on PostgreSQL and, elsewhere, are written for the next power of
//! two ([`list_of`]), padded with values no row has, so that a handful of texts serve every
//! batch.

use sea_orm::DbBackend;

use super::table::index_name;
use crate::store::dialect::Dialect;
use crate::store::table::TableName;

/// The columns a pending message is read with, in the order `Outbox::read_pending` reads them;
/// the database's clock comes last.
const PENDING_COLUMNS: &str =
    "seq, message_id, exchange, routing_key, content_type, headers, payload, origin, staged_at";

/// The most holds one statement releases; `Relaying::release_holds` runs it again while it
/// releases as many.
pub(super) const RELEASE_BATCH: u64 = 10_000;

/// The columns a staging writes, in the order it binds them; `staged_at` is the clock.
const STAGED_COLUMNS: &str =
    "message_id, exchange, routing_key, content_type, headers, payload, origin, staged_at";

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

/// The stagings of one guard: plain, and announced on the outbox's channel (PostgreSQL).
#[derive(Debug, Clone)]
pub(crate) struct Staging {
    /// Binds the message's seven values (then the claim's three for [`Guard::Claim`]); on
    /// PostgreSQL it returns a row when it inserted.
    plain: String,
    /// The same, announcing the commit on the outbox's channel (bound last) when it inserted;
    /// PostgreSQL only.
    announced: Option<String>,
}

impl Staging {
    /// The statement, announced where it can be and `announce` says so.
    pub(super) fn sql(&self, announce: bool) -> &str {
        match &self.announced {
            Some(announced) if announce => announced,
            _ => &self.plain,
        }
    }
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
    /// Stagings by guard, the inbox table's name still to fill in (`{inbox}`).
    stage: [Staging; 3],
    /// Binds the seq to take after and the limit; `FOR UPDATE SKIP LOCKED` where rows lock.
    pub(super) take: String,
    /// The same without row locks (SQLite, whose relays take turns in process).
    pub(super) take_unlocked: String,
    /// The unsent rows of runs within bounds: run, seq, hold (ms, or NULL) and the database's
    /// clock. Binds each run with the seq it starts after and the last seq it reads up to
    /// (`{ranges}` of them); on PostgreSQL, the runs as an array, the lowest start and the
    /// highest end (rows outside a run's own bounds are left to the caller). Unordered: the
    /// caller sorts each run's few rows, rather than the database sorting them all.
    run_unsent: String,
    /// Holds a run from a seq on: binds the pause (ms), the run (twice on MySQL/MariaDB) and
    /// the seq.
    pub(super) hold_run: String,
    /// Holds one message of no run: binds the pause and its seq.
    pub(super) hold_message: String,
    /// Holds every message to an exchange, and every message of a run that has one: binds the
    /// pause and the exchange (each twice where it takes two statements, see
    /// [`Statements::hold_exchange`]).
    hold_exchange: Vec<String>,
    /// Releases the holds that ran out.
    pub(super) release: String,
    /// Marks a list of seqs sent (an array on PostgreSQL).
    mark_sent: String,
    /// Deletes sent messages older than the retention: binds the retention (ms) and the limit.
    pub(super) delete_sent: String,
    /// Reads every column this version uses, from no row (through the indexes that MySQL/MariaDB
    /// statements name).
    pub(super) check_schema: String,
    /// Binds consumer, message key and claim token; the inbox table's name still to fill in.
    claim_held: String,
    /// Whether handler runs check their open transaction rather than their claim (MariaDB).
    tells_open_transaction: bool,
    backend: DbBackend,
}

impl Statements {
    pub(super) fn new(dialect: Dialect, table: &TableName) -> Self {
        let backend = dialect.backend();
        let t = table.quoted(backend);
        let now = dialect.now_ms();
        let values = format!("?, ?, ?, ?, ?, ?, ?, {now}");
        let claim = " WHERE EXISTS (SELECT 1 FROM {inbox} WHERE consumer = ? AND message_key = ? \
                     AND claim_token = ?)";
        let guarded = |guard: Guard| match guard {
            Guard::None => String::new(),
            Guard::Claim => claim.to_owned(),
            Guard::InTransaction => " WHERE @@in_transaction = 1".to_owned(),
        };
        let insert = |guard: Guard| match (backend, guard) {
            // Not `INSERT IGNORE`, which would also store a value too long for its column
            // truncated, with a warning.
            (DbBackend::MySql, Guard::None) => format!(
                "INSERT INTO {t} ({STAGED_COLUMNS}) VALUES ({values}) \
                 ON DUPLICATE KEY UPDATE seq = seq"
            ),
            (DbBackend::MySql, guard) => format!(
                "INSERT INTO {t} ({STAGED_COLUMNS}) SELECT {values} FROM DUAL{} \
                 ON DUPLICATE KEY UPDATE seq = seq",
                guarded(guard)
            ),
            (_, Guard::None) => format!(
                "INSERT INTO {t} ({STAGED_COLUMNS}) VALUES ({values}) \
                 ON CONFLICT (message_id) DO NOTHING"
            ),
            (_, guard) => format!(
                "INSERT INTO {t} ({STAGED_COLUMNS}) SELECT {values}{} \
                 ON CONFLICT (message_id) DO NOTHING",
                guarded(guard)
            ),
        };
        let guards = [Guard::None, Guard::Claim, Guard::InTransaction];
        let stage = guards.map(|guard| match backend {
            DbBackend::Postgres => Staging {
                plain: dialect.placeholders(&format!("{} RETURNING 1", insert(guard))),
                // One statement: an insert that commits on its own (outside a transaction)
                // announces itself in the same statement, or not at all.
                announced: Some(dialect.placeholders(&format!(
                    "WITH staged AS ({} RETURNING 1) SELECT pg_notify(?, '') FROM staged",
                    insert(guard)
                ))),
            },
            _ => Staging {
                plain: insert(guard),
                announced: None,
            },
        });
        let origin = origin_bytes(backend);
        let (take_lock, same_run) = match backend {
            DbBackend::Postgres => (" FOR UPDATE SKIP LOCKED", "origin = ?".to_owned()),
            // The run compares by the column's collation (through its index), then by its
            // bytes.
            DbBackend::MySql => (
                " FOR UPDATE SKIP LOCKED",
                format!("origin = ? AND {origin} = ?"),
            ),
            _ => ("", "origin = ?".to_owned()),
        };
        // MariaDB took the index of holds for `held_until IS NULL` once the statement read
        // the payload too, and stepped over every sent row from the first at each batch.
        // So did it for the order check, taking the index of pending rows for `sent_at IS
        // NULL` over the runs' ranges: every unsent row read, 370 ms beside 100 k of them.
        let forced = |suffixes: &[&str]| match backend {
            DbBackend::MySql => {
                let names: Vec<String> = (suffixes.iter())
                    .map(|suffix| index_name(backend, table, suffix))
                    .collect();
                format!(" FORCE INDEX ({})", names.join(", "))
            }
            _ => String::new(),
        };
        let (ready, runs) = (forced(&["ready"]), forced(&["runs"]));
        let take = |lock: &str| {
            dialect.placeholders(&format!(
                "SELECT {PENDING_COLUMNS}, {now} FROM {t}{ready} \
                 WHERE sent_at IS NULL AND held_until IS NULL AND seq > ? \
                 ORDER BY seq LIMIT ?{lock}"
            ))
        };
        let run_unsent = match backend {
            DbBackend::Postgres => dialect.placeholders(&format!(
                "SELECT origin, seq, held_until, {now} FROM {t} \
                 WHERE sent_at IS NULL AND origin = ANY(?::text[]) AND seq > ? AND seq <= ?"
            )),
            // One range of the runs' index per run. The run compares by the column's
            // collation (a superset of the run, through its index); the caller keeps the
            // run's own bytes.
            _ => format!("SELECT {origin}, seq, held_until, {now} FROM {t}{runs} WHERE {{ranges}}"),
        };
        let hold_exchange = match backend {
            // MySQL/MariaDB update a table they read in a join only.
            DbBackend::MySql => vec![
                format!(
                    "UPDATE {t} AS r JOIN (SELECT DISTINCT origin FROM {t} \
                     WHERE sent_at IS NULL AND exchange = ? AND origin IS NOT NULL) AS h \
                     ON r.origin = h.origin SET r.held_until = {now} + ? \
                     WHERE r.sent_at IS NULL"
                ),
                // Those of no run: the first holds the others (writing them twice doubled
                // the cost of holding a large backlog).
                format!(
                    "UPDATE {t} SET held_until = {now} + ? \
                     WHERE sent_at IS NULL AND exchange = ? AND origin IS NULL"
                ),
            ],
            _ => vec![dialect.placeholders(&format!(
                "UPDATE {t} SET held_until = {now} + ? WHERE sent_at IS NULL AND \
                 (exchange = ? OR origin IN (SELECT origin FROM {t} \
                 WHERE sent_at IS NULL AND exchange = ? AND origin IS NOT NULL))"
            ))],
        };
        let mark_sent = match backend {
            DbBackend::Postgres => {
                format!("UPDATE {t} SET sent_at = {now} WHERE seq = ANY($1::bigint[])")
            }
            _ => format!("UPDATE {t} SET sent_at = {now} WHERE seq IN ({{list}})"),
        };
        let delete_sent = match backend {
            DbBackend::MySql => {
                format!("DELETE FROM {t} WHERE sent_at < {now} - ? ORDER BY sent_at LIMIT ?")
            }
            _ => dialect.placeholders(&format!(
                "DELETE FROM {t} WHERE seq IN \
                 (SELECT seq FROM {t} WHERE sent_at < {now} - ? LIMIT ?)"
            )),
        };
        Self {
            stage,
            claim_held: dialect.placeholders(
                "SELECT 1 FROM {inbox} WHERE consumer = ? AND message_key = ? AND claim_token = ?",
            ),
            tells_open_transaction: dialect.tells_open_transaction(),
            take: take(take_lock),
            take_unlocked: take(""),
            run_unsent,
            hold_run: dialect.placeholders(&format!(
                "UPDATE {t} SET held_until = {now} + ? \
                 WHERE sent_at IS NULL AND {same_run} AND seq >= ?"
            )),
            hold_message: dialect.placeholders(&format!(
                "UPDATE {t} SET held_until = {now} + ? WHERE sent_at IS NULL AND seq = ?"
            )),
            hold_exchange,
            // Bounded and in the order of the index of holds, whatever the planner knows of the
            // table: without statistics (a table just filled), PostgreSQL scanned it whole.
            release: match backend {
                DbBackend::MySql => format!(
                    "UPDATE {t} SET held_until = NULL WHERE held_until IS NOT NULL \
                     AND held_until <= {now} ORDER BY held_until LIMIT {RELEASE_BATCH}"
                ),
                _ => format!(
                    "UPDATE {t} SET held_until = NULL WHERE seq IN (SELECT seq FROM {t} \
                     WHERE held_until IS NOT NULL AND held_until <= {now} \
                     ORDER BY held_until LIMIT {RELEASE_BATCH})"
                ),
            },
            mark_sent,
            delete_sent,
            check_schema: format!(
                "SELECT {PENDING_COLUMNS}, sent_at, held_until FROM {t}{} WHERE 1 = 0",
                forced(&["ready", "runs"])
            ),
            backend,
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
        let guard = if self.tells_open_transaction {
            Guard::InTransaction
        } else {
            Guard::Claim
        };
        let staging = &self.stage[guard as usize];
        let fill = |sql: &str| sql.replace("{inbox}", inbox);
        RunStatements {
            stage: Staging {
                plain: fill(&staging.plain),
                announced: staging.announced.as_deref().map(fill),
            },
            guard,
            claim_held: fill(&self.claim_held),
        }
    }

    /// [`Statements::run_unsent`] for `count` runs.
    pub(super) fn run_unsent(&self, count: usize) -> String {
        let range = "(origin = ? AND sent_at IS NULL AND seq > ? AND seq <= ?)";
        let ranges = vec![range; rows_for(count)].join(" OR ");
        self.run_unsent.replace("{ranges}", &ranges)
    }

    /// The statements that hold an exchange, each with the values it binds in order: which of
    /// the pause (`P`) and the exchange (`E`).
    pub(super) fn hold_exchange(&self) -> impl Iterator<Item = (&str, &'static [Bound])> {
        let binds: &[&'static [Bound]] = match self.backend {
            DbBackend::MySql => &[
                &[Bound::Exchange, Bound::Pause],
                &[Bound::Pause, Bound::Exchange],
            ],
            _ => &[&[Bound::Pause, Bound::Exchange, Bound::Exchange]],
        };
        self.hold_exchange
            .iter()
            .map(String::as_str)
            .zip(binds.iter().copied())
    }

    /// [`Statements::mark_sent`] for `count` seqs.
    pub(super) fn mark_sent(&self, count: usize) -> String {
        self.mark_sent.replace("{list}", &list_of(count))
    }
}

/// A value an exchange hold binds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Bound {
    /// The hold's length, in milliseconds.
    Pause,
    /// The exchange.
    Exchange,
}

/// `?, ?, ...`, as many as the next power of two from `count`.
pub(super) fn list_of(count: usize) -> String {
    vec!["?"; rows_for(count)].join(", ")
}

/// How many values a list of `count` is written for: the next power of two.
pub(super) fn rows_for(count: usize) -> usize {
    count.max(1).next_power_of_two()
}

/// The origin column compared by its bytes: MySQL/MariaDB's default collation takes runs that
/// differ in case, accents or trailing spaces (`c/a`, `c/A`) for one.
pub(super) fn origin_bytes(backend: DbBackend) -> &'static str {
    if backend == DbBackend::MySql {
        // Converted first: an origin column created latin1 by an older version.
        "CAST(CONVERT(origin USING utf8mb4) AS BINARY)"
    } else {
        "origin"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_are_written_for_powers_of_two() {
        assert_eq!(list_of(0), "?");
        assert_eq!(list_of(3), "?, ?, ?, ?");
        assert_eq!(rows_for(1000), 1024);
    }

    #[test]
    fn postgres_announces_in_the_staging_statement() {
        let table = TableName::new("idem_outbox").unwrap();
        let pg = Statements::new(Dialect::new(DbBackend::Postgres), &table);
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
        let my = Statements::new(Dialect::new(DbBackend::MySql), &table);
        assert!(!my.stage().sql(true).contains("pg_notify"));
        assert_eq!(my.for_inbox("`inbox`").guard, Guard::InTransaction);
    }
}
