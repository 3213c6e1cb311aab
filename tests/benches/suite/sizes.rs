//! `--table-sizes`: the batch and per-message consumers and the outbox relay on tables grown by
//! months of traffic, beside the hand-written code on tables of the same size. Before each size's
//! rounds, every case's inbox is filled with live (completed, not expired) records and its outbox
//! with messages sent a minute ago, by the database itself; its tables are dropped after, so that
//! one size's tables are on disk at a time. The empty tables come first, as the baseline.

use std::time::{Duration, Instant};

use idem_tests::bench::figures::median;
use idem_tests::bench::seed;
use idem_tests::{Backend, TestDb};
use sea_orm::{ConnectionTrait, Statement};
use serde_json::json;

use crate::args::{BackendArg, Mode};
use crate::case::Case;
use crate::outbox::Staging;
use crate::statements::StatementCounter;
use crate::{DEFAULT_CONCURRENCY, POOL, Suite, plan, run_rounds};

/// The modes a table's size can slow down: the inbox's claims and the outbox's writes and reads.
const SIZED_MODES: [Mode; 6] = [
    Mode::HandPerMessage,
    Mode::IdemPerMessage,
    Mode::HandBatch,
    Mode::IdemBatch,
    Mode::HandOutbox,
    Mode::IdemOutbox,
];

/// The median rate of one mode at one table size.
struct Point {
    backend: BackendArg,
    prefetch: u16,
    mode: Mode,
    concurrency: usize,
    rows: u64,
    msgs_per_s: f64,
}

/// Runs the sized modes at each of `sizes` (empty tables first), on each backend and prefetch,
/// and prints the curve.
pub(crate) async fn table_sizes(suite: &mut Suite, sizes: &[u64]) {
    let mut sizes = sizes.to_vec();
    if !sizes.contains(&0) {
        sizes.insert(0, 0);
    }
    let modes: Vec<Mode> = (suite.args.modes.iter().copied())
        .filter(|mode| SIZED_MODES.contains(mode))
        .collect();
    // Per message at the consumer's default concurrency only: its one-at-a-time figure adds
    // nothing a table's size would change.
    let cases: Vec<(Mode, usize)> = plan(&modes)
        .into_iter()
        .filter(|(mode, concurrency)| !mode.per_message() || *concurrency == DEFAULT_CONCURRENCY)
        .collect();
    let mut points = Vec::new();
    for backend in suite.args.backends.clone() {
        let mut db = TestDb::connect_with_pool(backend.backend(), POOL).await;
        let counter = StatementCounter::attach(&mut db).await;
        for prefetch in suite.args.prefetch.clone() {
            for &rows in &sizes {
                let mut group = Vec::new();
                for &(mode, concurrency) in &cases {
                    let case =
                        Case::create(suite, &db, backend, prefetch, mode, concurrency, None).await;
                    group.push(case);
                }
                fill(&db, &group, rows).await;
                run_rounds(suite, (&db, &counter), &mut group, None).await;
                for case in &group {
                    if let Some(failure) = &case.failure {
                        eprintln!("FAILED at {rows} rows: {failure}");
                        continue;
                    }
                    eprintln!(
                        "  {} rows: {} c={} {:.0} msg/s",
                        rows,
                        case.mode.name(),
                        case.concurrency,
                        median(case.rates.clone())
                    );
                    points.push(Point {
                        backend,
                        prefetch,
                        mode: case.mode,
                        concurrency: case.concurrency,
                        rows,
                        msgs_per_s: median(case.rates.clone()),
                    });
                }
                drop_tables(&db, &group).await;
            }
        }
    }
    if suite.args.json {
        print_json(&points);
    } else {
        print_curves(&points, &sizes);
    }
}

/// Fills the inbox and outbox tables of every case of `group` with `rows` rows each, then lets
/// the database's planner know their sizes, as its statistics would after months.
async fn fill(db: &TestDb, group: &[Case], rows: u64) {
    if rows == 0 {
        return;
    }
    let started = Instant::now();
    let mut filled = Vec::new();
    for case in group {
        if let Some(inbox) = &case.inbox {
            let table = inbox.table().as_str().to_owned();
            seed::insert_live(db, &table, "bench", rows).await;
            filled.push(table);
        }
        if let Some(hand) = &case.hand {
            seed::insert_live_hand(db, hand.table(), rows).await;
            filled.push(hand.table().to_owned());
        }
        match case
            .downstream
            .as_ref()
            .map(|downstream| &downstream.outbox)
        {
            Some(Staging::Idem(outbox)) => {
                let table = outbox.table().as_str().to_owned();
                seed::insert_sent(db, &table, rows).await;
                filled.push(table);
            }
            Some(Staging::Hand(outbox)) => {
                seed::insert_sent_hand(db, outbox.table(), rows).await;
                filled.push(outbox.table().to_owned());
            }
            None => {}
        }
    }
    let filling = started.elapsed();
    settle(db, &filled).await;
    eprintln!(
        "  filled {} tables with {rows} rows each in {:.0} s, settled in {:.0} s",
        filled.len(),
        filling.as_secs_f64(),
        (started.elapsed() - filling).as_secs_f64()
    );
}

/// Lets the database finish what the fill left it to do, so that the rounds do not pay for it:
/// statistics and the visibility map (PostgreSQL's `VACUUM (ANALYZE)`, then a checkpoint),
/// dirty pages flushed and old row versions purged (MariaDB, waited for, at most 10 min), the
/// write-ahead log folded in (SQLite).
async fn settle(db: &TestDb, tables: &[String]) {
    match db.backend {
        Backend::Postgres => {
            for table in tables {
                db.exec(&format!("VACUUM (ANALYZE) {table}")).await;
            }
            db.exec("CHECKPOINT").await;
        }
        Backend::MySql => {
            for table in tables {
                db.exec(&format!("ANALYZE TABLE {table}")).await;
            }
            let deadline = Instant::now() + Duration::from_secs(600);
            while Instant::now() < deadline {
                let dirty = scalar(
                    db,
                    "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS \
                     WHERE VARIABLE_NAME = 'INNODB_BUFFER_POOL_PAGES_DIRTY'",
                )
                .await;
                let history = scalar(
                    db,
                    "SELECT `COUNT` FROM information_schema.INNODB_METRICS \
                     WHERE NAME = 'trx_rseg_history_len'",
                )
                .await;
                if dirty < 1_000 && history < 10_000 {
                    break;
                }
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        }
        Backend::Sqlite => {
            db.exec("ANALYZE").await;
            db.exec("PRAGMA wal_checkpoint(TRUNCATE)").await;
        }
    }
}

/// The number the query's first row and column holds (0 when there is none).
async fn scalar(db: &TestDb, sql: &str) -> i64 {
    let statement = Statement::from_string(db.db.get_database_backend(), sql.to_owned());
    let row = db
        .db
        .query_one_raw(statement)
        .await
        .expect("the database answers");
    row.and_then(|row| {
        (row.try_get_by_index::<i64>(0).ok())
            .or_else(|| row.try_get_by_index::<String>(0).ok()?.parse().ok())
    })
    .unwrap_or(0)
}

/// Drops every table of `group`: the next size starts from empty tables, and the disk holds
/// one size's tables at a time.
async fn drop_tables(db: &TestDb, group: &[Case]) {
    for table in group.iter().flat_map(|case| &case.tables) {
        db.exec(&format!("DROP TABLE IF EXISTS {table}")).await;
        // An idem inbox's companions: its late-duplicate digest and daily summaries.
        for companion in ["_key_digest", "_dup_daily"] {
            db.exec(&format!("DROP TABLE IF EXISTS {table}{companion}"))
                .await;
        }
    }
}

fn print_json(points: &[Point]) {
    for point in points {
        let line = json!({
            "bench": "suite-table-sizes",
            "backend": point.backend.name(),
            "prefetch": point.prefetch,
            "mode": point.mode.name(),
            "concurrency": point.concurrency,
            "rows": point.rows,
            "msgs_per_s": (point.msgs_per_s * 10.0).round() / 10.0,
        });
        println!("{line}");
    }
}

/// Per backend and prefetch: each mode's rate at every size, its share of the empty tables'
/// rate at the largest, idem's share of the hand-written code's at each size, and the target.
fn print_curves(points: &[Point], sizes: &[u64]) {
    let largest = *sizes.iter().max().expect("a size");
    let mut groups: Vec<(BackendArg, u16)> = Vec::new();
    for point in points {
        if !groups.contains(&(point.backend, point.prefetch)) {
            groups.push((point.backend, point.prefetch));
        }
    }
    for (backend, prefetch) in groups {
        let at = |mode: Mode, rows: u64| {
            points
                .iter()
                .find(|p| {
                    (p.backend, p.prefetch, p.mode, p.rows) == (backend, prefetch, mode, rows)
                })
                .map(|p| p.msgs_per_s)
        };
        println!(
            "\ntable sizes: {} prefetch {prefetch} (msg/s, median)",
            backend.name()
        );
        let heads: Vec<String> = sizes
            .iter()
            .map(|rows| format!("{:>9}", rows_label(*rows)))
            .collect();
        println!("{:<22} {} {:>11}", "mode", heads.join(" "), "largest/0");
        let modes: Vec<Mode> = SIZED_MODES
            .into_iter()
            .filter(|mode| {
                points
                    .iter()
                    .any(|p| p.mode == *mode && p.backend == backend)
            })
            .collect();
        for &mode in &modes {
            let rates: Vec<String> = (sizes.iter())
                .map(|rows| at(mode, *rows).map_or("-".to_owned(), |rate| format!("{rate:.0}")))
                .map(|cell| format!("{cell:>9}"))
                .collect();
            let slope = match (at(mode, largest), at(mode, 0)) {
                (Some(large), Some(empty)) if empty > 0.0 => format!("{:.2}", large / empty),
                _ => "-".to_owned(),
            };
            println!("{:<22} {} {slope:>11}", mode.name(), rates.join(" "));
        }
        for (idem, hand) in [
            (Mode::IdemBatch, Mode::HandBatch),
            (Mode::IdemPerMessage, Mode::HandPerMessage),
            (Mode::IdemOutbox, Mode::HandOutbox),
        ] {
            let shares: Vec<String> = (sizes.iter())
                .map(|rows| match (at(idem, *rows), at(hand, *rows)) {
                    (Some(i), Some(h)) if h > 0.0 => format!("{:>9.2}", i / h),
                    _ => format!("{:>9}", "-"),
                })
                .collect();
            println!(
                "{:<22} {}",
                format!("{} / hand", idem.name()),
                shares.join(" ")
            );
        }
        for mode in modes.iter().filter(|mode| mode.idem()) {
            if let (Some(large), Some(empty)) = (at(*mode, largest), at(*mode, 0)) {
                let share = large / empty;
                let verdict = if share >= 0.9 { "met" } else { "NOT met" };
                println!(
                    "target: {} at {} rows >= 0.9 of empty tables: {share:.2}, {verdict}",
                    mode.name(),
                    rows_label(largest)
                );
            }
        }
    }
}

/// `1M`, `500k`, `empty`.
fn rows_label(rows: u64) -> String {
    match rows {
        0 => "empty".to_owned(),
        r if r % 1_000_000 == 0 => format!("{}M", r / 1_000_000),
        r if r % 1_000 == 0 => format!("{}k", r / 1_000),
        r => r.to_string(),
    }
}
