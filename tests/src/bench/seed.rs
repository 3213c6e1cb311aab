//! Expired records for the cleaner to delete, made by the database itself: a million rows in
//! seconds, with no round trip per row.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::db::{Backend, TestDb};

/// How many rows one insert makes: bounds a statement's undo log on MariaDB.
const CHUNK: u64 = 250_000;

/// Inserts `count` expired, completed records of consumer `bench` into idem's inbox `table`,
/// keyed `expired-<from + 1>` to `expired-<from + count>`, with a server-side generator:
/// `generate_series` on PostgreSQL, the sequence engine (`seq_1_to_N`) on MariaDB, a
/// recursive CTE on SQLite. Their `expires_at` lies a day or more in the past.
pub async fn insert_expired(db: &TestDb, table: &str, from: u64, count: u64) {
    insert_expired_of(db, table, "bench", from, count).await;
}

/// [`insert_expired`] for `consumer`.
pub async fn insert_expired_of(db: &TestDb, table: &str, consumer: &str, from: u64, count: u64) {
    let day_ago = now_ms() - 86_400_000;
    let created = day_ago - 8 * 86_400_000;
    let mut done = 0;
    while done < count {
        let first = from + done + 1;
        let last = from + (done + CHUNK).min(count);
        // Columns of idem's inbox table (see idem-runtime's `store::table`).
        let columns = "consumer, message_key, status, fingerprint, output, attempts, \
                       claim_token, created_at, claimed_at, lease_until, completed_at, expires_at";
        let row = |n: &str, key: &str| {
            format!(
                "'{consumer}', {key}, 'completed', NULL, 'null', 1, 1, {created}, {created}, NULL, \
                 {created}, {day_ago} - {last} + {n}"
            )
        };
        let sql = match db.backend {
            Backend::Postgres => format!(
                "INSERT INTO {table} ({columns}) SELECT {} FROM generate_series({first}, {last}) AS g",
                row("g", "'expired-' || g")
            ),
            Backend::MySql => format!(
                "INSERT INTO {table} ({columns}) SELECT {} FROM seq_{first}_to_{last}",
                row("seq", "CONCAT('expired-', seq)")
            ),
            Backend::Sqlite => format!(
                "WITH RECURSIVE s(n) AS (SELECT {first} UNION ALL SELECT n + 1 FROM s \
                 WHERE n < {last}) INSERT INTO {table} ({columns}) SELECT {} FROM s",
                row("n", "'expired-' || n")
            ),
        };
        db.exec(&sql).await;
        done = last - from;
    }
}

/// How many records of `table` have expired.
pub async fn count_expired(db: &TestDb, table: &str) -> u64 {
    db.count(table, &format!("expires_at < {}", now_ms())).await as u64
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
