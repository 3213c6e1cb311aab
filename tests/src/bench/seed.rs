//! Rows made by the database itself, a million in seconds with no round trip per row: expired
//! records for the cleaner to delete, and live records and sent outbox messages for tables
//! grown by months of traffic.

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
    let backend = db.backend;
    generate_rows(db, table, INBOX_COLUMNS, from, count, |n, _| {
        // Each chunk's records expire over the same span, as one insert of a chunk made them.
        format!(
            "'{consumer}', {}, 'completed', NULL, 'null', 1, 1, {created}, {created}, NULL, \
             {created}, {day_ago} - {CHUNK} + 1 + (({n} - {from} - 1) % {CHUNK})",
            prefixed(backend, "expired-", n)
        )
    })
    .await;
}

/// Columns of idem's inbox table (see idem-runtime's `store::table`).
const INBOX_COLUMNS: &str = "consumer, message_key, status, fingerprint, output, attempts, \
                             claim_token, created_at, claimed_at, lease_until, completed_at, expires_at";

/// `prefix` before the text of the SQL expression `value`.
fn prefixed(backend: Backend, prefix: &str, value: &str) -> String {
    match backend {
        Backend::MySql => format!("CONCAT('{prefix}', {value})"),
        _ => format!("'{prefix}' || {value}"),
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

/// Inserts `count` rows the database generates, numbered `from + 1` on: `select(n, hex)` gives
/// the values of row `n` (an SQL expression) from `n` and `hex`, a random-looking text of 32 hex
/// digits unique to the row, so that keys made of it spread over an index as real keys do.
async fn generate_rows(
    db: &TestDb,
    table: &str,
    columns: &str,
    from: u64,
    count: u64,
    select: impl Fn(&str, &str) -> String,
) {
    let mut done = 0;
    while done < count {
        let (first, last) = (from + done + 1, from + (done + CHUNK).min(count));
        let sql = match db.backend {
            Backend::Postgres => format!(
                "INSERT INTO {table} ({columns}) SELECT {} FROM generate_series({first}, {last}) AS g",
                select("g", "md5('k' || g)")
            ),
            Backend::MySql => format!(
                "INSERT INTO {table} ({columns}) SELECT {} FROM seq_{first}_to_{last}",
                select("seq", "MD5(CONCAT('k', seq))")
            ),
            Backend::Sqlite => format!(
                "WITH RECURSIVE s(n) AS (SELECT {first} UNION ALL SELECT n + 1 FROM s \
                 WHERE n < {last}) INSERT INTO {table} ({columns}) SELECT {} FROM s",
                select("n", "lower(hex(randomblob(16)))")
            ),
        };
        db.exec(&sql).await;
        done = last - from;
    }
}

/// How long the records [`insert_live`] makes still live: a week, idem's default retention.
const WEEK_MS: i64 = 7 * 86_400_000;

/// Inserts `count` live (completed, not expired) records of `consumer` into idem's inbox
/// `table`, keyed by 32 hex digits: a table grown by months of traffic, its keys spread over the
/// same index as the benchmark's orders' ids (see [`orders`](super::orders)).
pub async fn insert_live(db: &TestDb, table: &str, consumer: &str, count: u64) {
    let now = now_ms();
    generate_rows(db, table, INBOX_COLUMNS, 0, count, |_, hex| {
        format!(
            "'{consumer}', {hex}, 'completed', NULL, 'null', 1, 1, {now}, {now}, NULL, {now}, {}",
            now + WEEK_MS
        )
    })
    .await;
}

/// [`insert_live`] for the hand-written inbox `table` (consumer `bench`), its fingerprints
/// 32 bytes as SHA-256's.
pub async fn insert_live_hand(db: &TestDb, table: &str, count: u64) {
    let now = now_ms();
    let columns = "consumer, message_key, status, fingerprint, output, created_at, \
                   completed_at, expires_at";
    let backend = db.backend;
    generate_rows(db, table, columns, 0, count, |_, hex| {
        let (key, fingerprint) = match backend {
            Backend::Postgres => (hex.to_owned(), format!("sha256(convert_to({hex}, 'UTF8'))")),
            Backend::MySql => (hex.to_owned(), format!("UNHEX(SHA2({hex}, 256))")),
            Backend::Sqlite => (hex.to_owned(), "randomblob(32)".to_owned()),
        };
        format!(
            "'bench', {key}, 'completed', {fingerprint}, 'null', {now}, {now}, {}",
            now + WEEK_MS
        )
    })
    .await;
}

/// Inserts `count` messages sent a minute ago into idem's outbox `table` (kept, not yet due
/// for the cleaner), each in a run of ten.
pub async fn insert_sent(db: &TestDb, table: &str, count: u64) {
    let sent = now_ms() - 60_000;
    let columns =
        "message_id, exchange, routing_key, content_type, payload, origin, staged_at, sent_at";
    let backend = db.backend;
    generate_rows(db, table, columns, 0, count, |n, hex| {
        let (id, payload, origin) = match backend {
            Backend::Postgres => (
                format!("'sent-' || {hex}"),
                format!("convert_to({hex}, 'UTF8')"),
                format!("'run:sent-' || ({n} / 10)"),
            ),
            Backend::MySql => (
                format!("CONCAT('sent-', {hex})"),
                hex.to_owned(),
                format!("CONCAT('run:sent-', {n} DIV 10)"),
            ),
            Backend::Sqlite => (
                format!("'sent-' || {hex}"),
                "randomblob(64)".to_owned(),
                format!("'run:sent-' || ({n} / 10)"),
            ),
        };
        format!("{id}, 'bench', 'sent', 'application/json', {payload}, {origin}, {sent}, {sent}")
    })
    .await;
}

/// [`insert_sent`] for the hand-written outbox `table`.
pub async fn insert_sent_hand(db: &TestDb, table: &str, count: u64) {
    let sent = now_ms() - 60_000;
    let backend = db.backend;
    generate_rows(
        db,
        table,
        "message_id, sent_at, payload",
        0,
        count,
        |_, hex| {
            let (id, payload) = match backend {
                Backend::Postgres => (
                    format!("'sent-' || {hex}"),
                    format!("convert_to({hex}, 'UTF8')"),
                ),
                Backend::MySql => (format!("CONCAT('sent-', {hex})"), hex.to_owned()),
                Backend::Sqlite => (format!("'sent-' || {hex}"), "randomblob(64)".to_owned()),
            };
            format!("{id}, {sent}, {payload}")
        },
    )
    .await;
}
