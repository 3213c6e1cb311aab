//! The `idem` command against the real databases: the counts it prints are the table's, a
//! released claim is taken over by the next delivery, a forgotten key is processed again.
//!
//! Run: `cargo test -p idem-cli` with PostgreSQL and MariaDB up (SQLite is a file).

use std::process::{Command, Output, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idem_rabbitmq::{PublishOptions, headers};
use idem_runtime::admin::{ConsumerName, InboxAdmin, InboxKey, Status};
use idem_runtime::outbox::Outbox;
use idem_runtime::outbox::Relaying;
use idem_runtime::{Inbox, MessageKey, Metadata, OutboxMessage, RetentionPolicy};
use idem_tests::cluster::run_script;
use idem_tests::db::Reader;
use idem_tests::rabbit::amqp_url;
use idem_tests::{Backend, Msg, Recorder, TestBroker, TestDb, on_each_backend, unique};
use serde_json::Value;

on_each_backend!(
    stats_count_what_the_table_holds,
    release_lets_the_next_delivery_take_a_stuck_claim_over,
    forget_asks_then_deletes_the_record,
    a_missing_record_or_table_has_its_own_exit_code,
    outbox_stats_count_pending_held_and_sent,
    outbox_show_lists_held_runs_and_retry_lifts_them,
    runs_differing_in_case_are_told_apart,
    retention_advise_weighs_duplicates_and_late_ones,
    reading_commands_work_with_read_only_credentials,
    forget_spares_a_live_claim_unless_forced,
    a_database_that_refuses_is_said_at_once,
    retention_advise_covers_the_oldest_late_copy_and_settles_once_applied,
    retention_advise_since_reads_only_the_window,
    retention_advise_reports_late_copies_a_nearly_empty_digest_caught,
    retention_advise_reads_with_credentials_that_cannot_write,
);

/// Runs `idem args...` on `db`'s database with the inbox table `table`.
fn idem(db: &TestDb, table: &str, args: &[&str]) -> Output {
    idem_at(db.url(), table, args)
}

/// Runs `idem args...` on the database at `url` with the inbox table `table`.
fn idem_at(url: &str, table: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(args)
        .env("DATABASE_URL", url)
        .env("IDEM_INBOX_TABLE", table)
        .stdin(Stdio::null())
        .output()
        .expect("idem runs")
}

fn json(output: &Output) -> Value {
    assert!(output.status.success(), "{output:?}");
    serde_json::from_slice(&output.stdout).expect("JSON on stdout")
}

async fn inbox(db: &TestDb) -> (Inbox, String) {
    let table = db.table("inbox");
    let inbox = Inbox::builder(db.db.clone())
        .table(table.as_str())
        .build()
        .await
        .expect("inbox builds");
    (inbox, table)
}

fn key(consumer: &str, key: &str) -> InboxKey {
    InboxKey {
        consumer: ConsumerName::new(consumer).unwrap(),
        message_key: MessageKey::new(key).unwrap(),
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Writes a two-phase claim taken `age` ago, its lease running for another hour, as a worker
/// that died after claiming leaves it.
async fn stuck_claim(db: &TestDb, table: &str, consumer: &str, message_key: &str, age: Duration) {
    let claimed = now_ms() - age.as_millis() as i64;
    let hour = 3_600_000;
    db.exec(&format!(
        "INSERT INTO {table} (consumer, message_key, status, attempts, claim_token, created_at, \
         claimed_at, lease_until, expires_at) VALUES ('{consumer}', '{message_key}', \
         'in_progress', 1, 42, {claimed}, {claimed}, {}, {})",
        now_ms() + hour,
        now_ms() + 24 * hour
    ))
    .await;
}

async fn stats_count_what_the_table_holds(backend: Backend) {
    let db = TestDb::connect(backend).await;
    let (inbox, table) = inbox(&db).await;
    let effects = db.effects_table().await;
    let consumer = unique("billing");
    let handler = Recorder::new(&db, &effects, &consumer);
    for id in ["a", "b", "c"] {
        inbox
            .process(&handler, Msg::new(id, "1"), &Metadata::default())
            .await
            .unwrap();
    }
    let other = unique("shipping");
    stuck_claim(&db, &table, &other, "s-1", Duration::from_secs(600)).await;

    let all = json(&idem(&db, &table, &["inbox", "stats", "--json"]));
    let rows = all.as_array().expect("one row per consumer");
    assert_eq!(rows.len(), 2, "{all}");
    let row = |name: &str| {
        rows.iter()
            .find(|row| row["consumer"] == name)
            .unwrap_or_else(|| panic!("{name} in {all}"))
    };
    assert_eq!(row(&consumer)["completed"], 3);
    assert_eq!(row(&consumer)["in_progress"], 0);
    assert_eq!(row(&other)["completed"], 0);
    assert_eq!(row(&other)["in_progress"], 1);
    let claim_age = row(&other)["oldest_claim_age_s"].as_f64().unwrap();
    assert!((590.0..700.0).contains(&claim_age), "{claim_age}");

    let one = json(&idem(
        &db,
        &table,
        &["inbox", "stats", "--consumer", &consumer, "--json"],
    ));
    assert_eq!(one.as_array().map(Vec::len), Some(1), "{one}");

    // For people: a header and a row per consumer.
    let printed = idem(&db, &table, &["inbox", "stats"]);
    let text = String::from_utf8(printed.stdout).unwrap();
    assert!(text.starts_with("consumer"), "{text}");
    assert_eq!(text.lines().count(), 3, "{text}");
    assert!(text.contains(&consumer), "{text}");
}

async fn release_lets_the_next_delivery_take_a_stuck_claim_over(backend: Backend) {
    let db = TestDb::connect(backend).await;
    let (inbox, table) = inbox(&db).await;
    let effects = db.effects_table().await;
    let consumer = unique("billing");
    stuck_claim(&db, &table, &consumer, "o-1", Duration::from_secs(60)).await;
    let handler = Recorder::new(&db, &effects, &consumer);
    // Held: the delivery is refused while the dead worker's lease runs.
    let held = inbox
        .process(&handler, Msg::new("o-1", "1"), &Metadata::default())
        .await;
    assert_eq!(held.unwrap_err().code(), "in-progress-elsewhere");

    // Its lease runs for another hour: its worker may still be at work. Refused, untouched.
    let refused = idem(
        &db,
        &table,
        &["inbox", "release", &consumer, "o-1", "--json"],
    );
    assert_eq!(refused.status.code(), Some(4), "{refused:?}");
    let said: serde_json::Value = serde_json::from_slice(&refused.stdout).unwrap();
    assert_eq!(said["result"], "live", "{said}");
    assert!(said["said"].as_str().unwrap().contains("--force"), "{said}");
    assert_eq!(db.count(&table, "claim_token = 42").await, 1);

    let released = json(&idem(
        &db,
        &table,
        &["inbox", "release", &consumer, "o-1", "--force", "--json"],
    ));
    assert_eq!(released["result"], "released", "{released}");
    // The dead worker's token is gone: it could neither renew nor complete its claim now.
    assert_eq!(db.count(&table, "claim_token = 42").await, 0);
    inbox
        .process(&handler, Msg::new("o-1", "1"), &Metadata::default())
        .await
        .expect("the next delivery takes the key over");
    assert_eq!(db.count(&effects, "message_key = 'o-1'").await, 1);
    let record = inbox.lookup(&key(&consumer, "o-1")).await.unwrap().unwrap();
    assert_eq!(record.status, Status::Completed);
    assert_eq!(record.attempts, 2, "the takeover is counted");

    // A completed record has no claim to end: said, nothing changed.
    let again = json(&idem(
        &db,
        &table,
        &["inbox", "release", &consumer, "o-1", "--json"],
    ));
    assert_eq!(again["result"], "completed", "{again}");
    let shown = json(&idem(
        &db,
        &table,
        &["inbox", "show", &consumer, "o-1", "--json"],
    ));
    assert_eq!(shown["status"], "completed");
    assert_eq!(shown["attempts"], 2);
}

async fn forget_asks_then_deletes_the_record(backend: Backend) {
    let db = TestDb::connect(backend).await;
    let (inbox, table) = inbox(&db).await;
    let effects = db.effects_table().await;
    let consumer = unique("billing");
    let handler = Recorder::new(&db, &effects, &consumer);
    let meta = Metadata::default();
    inbox
        .process(&handler, Msg::new("o-1", "1"), &meta)
        .await
        .unwrap();

    // No terminal to ask on and no --yes: declined, exit 2, the record kept.
    let declined = idem(&db, &table, &["inbox", "forget", &consumer, "o-1"]);
    assert_eq!(declined.status.code(), Some(2), "{declined:?}");
    assert!(
        inbox
            .lookup(&key(&consumer, "o-1"))
            .await
            .unwrap()
            .is_some()
    );

    let forgotten = idem(&db, &table, &["inbox", "forget", &consumer, "o-1", "--yes"]);
    assert!(forgotten.status.success(), "{forgotten:?}");
    assert!(
        inbox
            .lookup(&key(&consumer, "o-1"))
            .await
            .unwrap()
            .is_none()
    );
    let again = inbox
        .process(&handler, Msg::new("o-1", "1"), &meta)
        .await
        .unwrap();
    assert!(!again.is_duplicate(), "processed again once forgotten");
    assert_eq!(db.count(&effects, "message_key = 'o-1'").await, 2);
}

/// A key claimed by a worker whose lease still runs is not forgotten without `--force`: the
/// worker may still be running its handler, and the next delivery would run it again beside it.
async fn forget_spares_a_live_claim_unless_forced(backend: Backend) {
    let db = TestDb::connect(backend).await;
    let (_inbox, table) = inbox(&db).await;
    let consumer = unique("mailer");
    stuck_claim(&db, &table, &consumer, "m-1", Duration::from_secs(5)).await;
    let args = ["inbox", "forget", &consumer, "m-1", "--yes", "--json"];
    let refused = idem(&db, &table, &args);
    assert_eq!(refused.status.code(), Some(4), "{refused:?}");
    let said: serde_json::Value = serde_json::from_slice(&refused.stdout).unwrap();
    assert_eq!(said["result"], "live", "{said}");
    assert_eq!(db.count(&table, "1 = 1").await, 1, "the claim is kept");
    let mut forced = args.to_vec();
    forced.push("--force");
    assert_eq!(json(&idem(&db, &table, &forced))["result"], "forgotten");
    assert_eq!(db.count(&table, "1 = 1").await, 0);
}

async fn a_missing_record_or_table_has_its_own_exit_code(backend: Backend) {
    let db = TestDb::connect(backend).await;
    let (_inbox, table) = inbox(&db).await;
    for command in ["show", "release"] {
        let missing = idem(&db, &table, &["inbox", command, "nobody", "nothing"]);
        assert_eq!(missing.status.code(), Some(3), "{command}: {missing:?}");
    }
    let forgotten = idem(
        &db,
        &table,
        &["inbox", "forget", "nobody", "nothing", "--yes"],
    );
    assert_eq!(forgotten.status.code(), Some(3), "{forgotten:?}");
    // A table that is not there is a failure, said, and the command creates nothing.
    let absent = unique("absent");
    let failed = idem(&db, &absent, &["inbox", "stats"]);
    assert_eq!(failed.status.code(), Some(1), "{failed:?}");
    assert!(!failed.stderr.is_empty());
    let invalid = idem(&db, &table, &["inbox", "show", "", "k"]);
    assert_eq!(
        invalid.status.code(),
        Some(2),
        "an empty consumer: {invalid:?}"
    );
}

/// Stages a message to each `(exchange, run)`, in that run when there is one.
async fn stage(db: &TestDb, outbox: &Outbox, messages: &[(&str, Option<&str>)]) {
    for (exchange, run) in messages {
        let mut message = OutboxMessage::new(*exchange, "rk", b"{}".to_vec());
        if let Some(run) = run {
            message = message.in_run(*run);
        }
        outbox.stage(&db.db, message).await.expect("staged");
    }
}

async fn outbox_stats_count_pending_held_and_sent(backend: Backend) {
    let db = TestDb::connect(backend).await;
    let table = db.table("outbox");
    let outbox = Outbox::builder(db.db.clone())
        .table(table.as_str())
        .build()
        .await
        .expect("outbox builds");
    stage(
        &db,
        &outbox,
        &[("ex-a", Some("r-1")), ("ex-a", Some("r-1")), ("ex-b", None)],
    )
    .await;
    for _ in 0..2 {
        let message = OutboxMessage::new("ex-c", "rk", b"{}".to_vec());
        outbox.stage(&db.db, message).await.expect("staged");
    }
    // A relay's batch: the two messages to ex-c published, the one to ex-b held back.
    let batch = outbox.take_pending(10).await.expect("taken");
    let messages = batch.messages().to_vec();
    let held = messages
        .iter()
        .find(|m| m.exchange == "ex-b")
        .expect("ex-b");
    batch
        .hold(held, Duration::from_secs(600))
        .await
        .expect("held");
    let sent: Vec<i64> = (messages.iter())
        .filter(|m| m.exchange == "ex-c")
        .map(|m| m.seq)
        .collect();
    batch.mark_sent(&sent).await.expect("marked sent");
    tokio::time::sleep(Duration::from_millis(1_100)).await;

    let stats = json(&idem(
        &db,
        "unused",
        &[
            "outbox",
            "stats",
            "--table",
            &table,
            "--retention",
            "1s",
            "--json",
        ],
    ));
    assert_eq!(stats["pending"], 3, "{stats}");
    assert_eq!(stats["sent"], 2, "{stats}");
    assert_eq!(stats["sent_expired"], 2, "{stats}");
    let oldest = stats["oldest_pending_age_s"].as_f64().unwrap();
    assert!((1.0..60.0).contains(&oldest), "{stats}");
    let held = stats["held"].as_array().expect("held by exchange");
    assert_eq!(held.len(), 1, "{stats}");
    assert_eq!(held[0]["exchange"], "ex-b");
    assert_eq!(held[0]["messages"], 1);
    assert_eq!(held[0]["runs"], 0);
    let hold = held[0]["longest_hold_s"].as_f64().unwrap();
    assert!((500.0..=600.0).contains(&hold), "{stats}");

    // With the services' default retention nothing awaits the cleaner yet; for people, a line
    // per count and the held exchanges.
    let printed = idem(&db, "unused", &["outbox", "stats", "--table", &table]);
    let text = String::from_utf8(printed.stdout).unwrap();
    assert!(text.contains("pending       3"), "{text}");
    assert!(text.contains("sent          2 (0 past"), "{text}");
    assert!(text.contains("ex-b"), "{text}");
}

/// `outbox show` lists the held runs and messages of no run, and one run's pending messages;
/// `outbox retry` lifts a hold, so that the next batch takes its messages; a subject with
/// nothing held or pending exits 3, none named 2.
async fn outbox_show_lists_held_runs_and_retry_lifts_them(backend: Backend) {
    let db = TestDb::connect(backend).await;
    let table = db.table("outbox");
    let outbox = Outbox::builder(db.db.clone())
        .table(table.as_str())
        .build()
        .await
        .expect("outbox builds");
    let staged = [
        ("ex-a", Some("r-1")),
        ("ex-a", Some("r-1")),
        ("ex-b", None),
        ("ex-c", Some("r-2")),
    ];
    stage(&db, &outbox, &staged).await;
    // A relay's batch: r-1 (from its first message) and the message to ex-b held back.
    let batch = outbox.take_pending(10).await.expect("taken");
    let messages = batch.messages().to_vec();
    let lone = messages.iter().find(|m| m.exchange == "ex-b").unwrap();
    let lone_id = lone.message_id.clone();
    batch
        .hold(&messages[0], Duration::from_secs(600))
        .await
        .unwrap();
    batch.hold(lone, Duration::from_secs(600)).await.unwrap();
    batch.mark_sent(&[]).await.expect("committed");
    let run = |args: &[&str]| {
        let mut all = vec!["outbox"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--table", &table]);
        idem(&db, "unused", &all)
    };

    let held = json(&run(&["show", "--json"]));
    let held = held.as_array().unwrap();
    assert_eq!(held.len(), 2, "{held:?}");
    assert_eq!(held[0]["run"], "run:r-1");
    assert_eq!(held[0]["exchange"], "ex-a");
    assert_eq!(held[0]["messages"], 2);
    assert!(held[0]["hold_left_s"].as_f64().unwrap() > 500.0, "{held:?}");
    assert_eq!(held[1]["message"], lone_id.as_str());
    let pending = json(&run(&["show", "run:r-1", "--json"]));
    let pending = pending.as_array().unwrap();
    assert_eq!(pending.len(), 2, "{pending:?}");
    assert!(
        pending
            .iter()
            .all(|row| row["hold_left_s"].as_f64().unwrap() > 500.0)
    );
    let text = String::from_utf8(run(&["show"]).stdout).unwrap();
    assert!(text.contains("run:r-1") && text.contains("ex-a"), "{text}");

    let lifted = json(&run(&["retry", "run:r-1", "--json"]));
    assert_eq!(lifted["lifted"], 2);
    let batch = outbox.take_pending(10).await.expect("taken");
    let taken: Vec<&str> = batch
        .messages()
        .iter()
        .map(|m| m.exchange.as_str())
        .collect();
    assert_eq!(
        taken,
        ["ex-a", "ex-a", "ex-c"],
        "r-1 is taken again, ex-b still held"
    );
    batch.mark_sent(&[]).await.unwrap();
    assert_eq!(
        run(&["retry", "run:r-1"]).status.code(),
        Some(3),
        "nothing held"
    );
    let lifted = json(&run(&["retry", "--message", &lone_id, "--json"]));
    assert_eq!(lifted["lifted"], 1);
    assert_eq!(run(&["show", "run:nothing"]).status.code(), Some(3));
    assert_eq!(run(&["retry"]).status.code(), Some(2));
    assert!(
        json(&run(&["show", "--json"]))
            .as_array()
            .unwrap()
            .is_empty()
    );
}

/// `retention advise`: a consumer whose copy came eight days after its message, its record
/// kept seven, is told its retention is too short, with twice those eight days recommended; one
/// whose duplicates came at once has enough; the figures are those its processes wrote.
async fn retention_advise_weighs_duplicates_and_late_ones(backend: Backend) {
    let db = TestDb::connect(backend).await;
    let (inbox, table) = inbox(&db).await;
    let effects = db.effects_table().await;
    let (late, calm) = (unique("late"), unique("calm"));
    let (late_handler, calm_handler) = (
        Recorder::new(&db, &effects, &late),
        Recorder::new(&db, &effects, &calm),
    );
    expired_records(&db, &table, &late, &["k"], 8, 7).await;
    let meta = Metadata::default();
    for (handler, key) in [
        (&late_handler, "k"),
        (&calm_handler, "x"),
        (&calm_handler, "x"),
    ] {
        inbox
            .process(handler, Msg::new(key, "1"), &meta)
            .await
            .unwrap();
    }
    inbox.cleaner().run_once().await.unwrap();

    let advice = json(&idem(&db, &table, &["retention", "advise", "--json"]));
    let of = |consumer: &str| {
        advice
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["consumer"] == consumer)
            .unwrap_or_else(|| panic!("no {consumer} in {advice}"))
            .clone()
    };
    let day = 86_400.0;
    let (late, calm) = (of(&late), of(&calm));
    assert_eq!(late["late"], 1, "{late}");
    assert_eq!(late["verdict"], "too-short", "{late}");
    assert_eq!(late["retention_s"], 7.0 * day, "{late}");
    assert_eq!(late["retention_source"], "processes", "{late}");
    assert_eq!(late["recommended_s"], 16.0 * day, "{late}");
    assert_eq!(calm["duplicates"], 1, "{calm}");
    assert_eq!(calm["verdict"], "enough", "{calm}");
    assert_eq!(calm["recommended_s"], Value::Null);
    let text = String::from_utf8(idem(&db, &table, &["retention", "advise"]).stdout).unwrap();
    assert!(text.contains("too-short") && text.contains("16d"), "{text}");
}

/// Runs whose names differ in case only are two runs (MySQL's collation would merge them):
/// listed apart, lifted apart.
async fn runs_differing_in_case_are_told_apart(backend: Backend) {
    let db = TestDb::connect(backend).await;
    let table = db.table("outbox");
    let outbox = Outbox::builder(db.db.clone())
        .table(table.as_str())
        .build()
        .await
        .expect("outbox builds");
    stage(&db, &outbox, &[("ex", Some("Case")), ("ex", Some("case"))]).await;
    let batch = outbox.take_pending(10).await.expect("taken");
    for message in batch.messages().to_vec() {
        batch
            .hold(&message, Duration::from_secs(600))
            .await
            .unwrap();
    }
    batch.mark_sent(&[]).await.expect("committed");
    let run = |args: &[&str]| {
        let mut all = vec!["outbox"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--table", &table, "--json"]);
        json(&idem(&db, "unused", &all))
    };
    let held = run(&["show"]);
    let mut runs: Vec<&str> = (held.as_array().unwrap().iter())
        .map(|run| run["run"].as_str().unwrap())
        .collect();
    runs.sort();
    assert_eq!(runs, ["run:Case", "run:case"], "{held}");
    assert_eq!(run(&["retry", "run:case"])["lifted"], 1);
    assert_eq!(run(&["show"])[0]["run"], "run:Case");
}

/// Every command that only reads works for a user that may only read (a `SELECT`-only role, a
/// file opened read-only): nothing it runs writes, not even a probe rolled back.
async fn reading_commands_work_with_read_only_credentials(backend: Backend) {
    let db = TestDb::connect(backend).await;
    let (inbox, table) = inbox(&db).await;
    let effects = db.effects_table().await;
    let consumer = unique("billing");
    let handler = Recorder::new(&db, &effects, &consumer);
    inbox
        .process(&handler, Msg::new("o-1", "1"), &Metadata::default())
        .await
        .unwrap();
    inbox.cleaner().run_once().await.unwrap();
    let outbox_table = db.table("outbox");
    let outbox = Outbox::builder(db.db.clone())
        .table(outbox_table.as_str())
        .build()
        .await
        .expect("outbox builds");
    stage(&db, &outbox, &[("ex-a", Some("r-1"))]).await;
    let reader = Reader::grant(&db, &[&table, &outbox_table]).await;
    let url = reader.url.clone();

    let stats = json(&idem_at(&url, &table, &["inbox", "stats", "--json"]));
    assert_eq!(stats[0]["completed"], 1, "{stats}");
    let shown = json(&idem_at(
        &url,
        &table,
        &["inbox", "show", &consumer, "o-1", "--json"],
    ));
    assert_eq!(shown["status"], "completed", "{shown}");
    let advice = json(&idem_at(&url, &table, &["retention", "advise", "--json"]));
    assert_eq!(advice[0]["consumer"], consumer.as_str(), "{advice}");
    let outbox_args = ["outbox", "stats", "--table", &outbox_table, "--json"];
    let pending = json(&idem_at(&url, &table, &outbox_args));
    assert_eq!(pending["pending"], 1, "{pending}");
    let show_args = [
        "outbox",
        "show",
        "run:r-1",
        "--table",
        &outbox_table,
        "--json",
    ];
    let run = json(&idem_at(&url, &table, &show_args));
    assert_eq!(run.as_array().map(Vec::len), Some(1), "{run}");
    assert_eq!(
        dry_run_verdicts(&url, &table, &consumer).await,
        ["l-done duplicate", "l-new new"]
    );

    // A command that writes is refused by the server, said, and changes nothing.
    let refused = idem_at(
        &url,
        &table,
        &["inbox", "forget", &consumer, "o-1", "--yes"],
    );
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    assert_eq!(db.count(&table, "1 = 1").await, 1);
    reader.revoke(&db).await;
}

/// `idem dlq replay --dry-run` against the inbox at `url`: two letters of `consumer` in a
/// dead-letter queue of their own, `l-done` (key `o-1`, which the inbox holds completed) and
/// `l-new` (key `o-2`, which it does not). Returns each letter's id and verdict, after checking that
/// the dry run moved nothing.
async fn dry_run_verdicts(url: &str, table: &str, consumer: &str) -> Vec<String> {
    let broker = TestBroker::connect().await;
    let dlq = unique("dlq_read_only");
    let target = unique("dlq_read_only_target");
    broker.declare_queue(&dlq, &[]).await;
    broker.declare_queue(&target, &[]).await;
    for (id, key) in [("l-done", "o-1"), ("l-new", "o-2")] {
        let letter = PublishOptions::default()
            .message_id(id)
            .header(headers::REASON, "handler-error")
            .header(headers::CONSUMER, consumer)
            .header(headers::KEY, key);
        broker.send_bytes(&dlq, b"{}", letter).await;
    }
    let args = [
        "dlq",
        "replay",
        &dlq,
        "--to",
        &target,
        "--dry-run",
        "--json",
    ];
    let dry = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(args)
        .env("DATABASE_URL", url)
        .env("IDEM_INBOX_TABLE", table)
        .env("AMQP_URL", amqp_url())
        .stdin(Stdio::null())
        .output()
        .expect("idem runs");
    let dry = json(&dry);
    assert_eq!(
        broker.depth(&dlq).await,
        2,
        "a dry run moves nothing: {dry}"
    );
    assert_eq!(broker.depth(&target).await, 0, "{dry}");
    dry["messages"]
        .as_array()
        .expect("the letters")
        .iter()
        .map(|letter| {
            let id = letter["message_id"].as_str().unwrap_or_default();
            let verdict = letter["inbox"].as_str().unwrap_or_default();
            format!("{id} {verdict}")
        })
        .collect()
}

/// A database whose port refuses connections is said at once, with the reason, not after the
/// pool's wait as "pool timed out"; with `--json`, as a JSON object.
async fn a_database_that_refuses_is_said_at_once(backend: Backend) {
    let url = match backend {
        Backend::Postgres => "postgres://postgres@127.0.0.1:1/test",
        Backend::MySql => "mysql://root@127.0.0.1:1/test",
        Backend::Sqlite => "sqlite:///nonexistent-dir/idem.db?mode=ro",
    };
    let started = std::time::Instant::now();
    let failed = idem_at(url, "idem_inbox", &["inbox", "stats", "--json"]);
    assert_eq!(failed.status.code(), Some(1), "{failed:?}");
    let said: serde_json::Value = serde_json::from_slice(&failed.stdout).expect("JSON");
    let error = said["error"].as_str().unwrap();
    if backend != Backend::Sqlite {
        assert!(error.contains("refused"), "{error}");
        // A bound on the wait, not a measure of speed: the pool's own wait is 30 s.
        assert!(started.elapsed() < Duration::from_secs(20), "{error}");
    }
}

/// The reading commands on a hot standby (a PostgreSQL standby, a MariaDB replica with
/// `read_only`), as an operator at 3 a.m. points them away from the primary: each reads what
/// the primary committed, and writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reading_commands_work_on_a_standby() {
    let pairs = [
        (
            "postgres-pair",
            Backend::Postgres,
            "postgres://postgres@127.0.0.1:{}/postgres",
            5441,
            5442,
        ),
        (
            "mariadb-pair",
            Backend::MySql,
            "mysql://idem@127.0.0.1:{}/test",
            3341,
            3342,
        ),
    ];
    for (script, backend, url, primary, standby) in pairs {
        run_script(script, "start").await;
        let on = |port: u16| url.replace("{}", &port.to_string());
        let db = TestDb::connect_url(backend, on(primary), 4).await;
        let (inbox, table) = inbox(&db).await;
        let effects = db.effects_table().await;
        let consumer = unique("billing");
        let handler = Recorder::new(&db, &effects, &consumer);
        inbox
            .process(&handler, Msg::new("o-1", "1"), &Metadata::default())
            .await
            .unwrap();
        inbox.cleaner().run_once().await.unwrap();
        let replica = on(standby);
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let stats = loop {
            let stats = idem_at(&replica, &table, &["inbox", "stats", "--json"]);
            if stats.status.success() || std::time::Instant::now() > deadline {
                break stats;
            }
            // The replica applies the primary's table a moment later.
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        assert_eq!(json(&stats)[0]["completed"], 1, "{script}: {stats:?}");
        let show = ["inbox", "show", &consumer, "o-1", "--json"];
        assert_eq!(
            json(&idem_at(&replica, &table, &show))["status"],
            "completed"
        );
        let advice = json(&idem_at(
            &replica,
            &table,
            &["retention", "advise", "--json"],
        ));
        assert_eq!(
            advice[0]["consumer"],
            consumer.as_str(),
            "{script}: {advice}"
        );
        assert_eq!(
            dry_run_verdicts(&replica, &table, &consumer).await,
            ["l-done duplicate", "l-new new"],
            "{script}"
        );
        drop((inbox, db));
        run_script(script, "stop").await;
    }
}

const DAY_MS: i64 = 86_400_000;

/// Writes completed records of `consumer` for `keys`, processed `days_ago` days ago and kept
/// `kept_days` days (expired since).
async fn expired_records(
    db: &TestDb,
    table: &str,
    consumer: &str,
    keys: &[&str],
    days_ago: i64,
    kept_days: i64,
) {
    let completed = now_ms() - days_ago * DAY_MS;
    let expires = completed + kept_days * DAY_MS;
    for key in keys {
        db.exec(&format!(
            "INSERT INTO {table} (consumer, message_key, status, attempts, claim_token, \
             created_at, claimed_at, completed_at, expires_at) VALUES ('{consumer}', '{key}', \
             'completed', 1, 0, {completed}, {completed}, {completed}, {expires})"
        ))
        .await;
    }
}

/// The advice for `consumer` in `idem retention advise --json [extra...]`.
fn advice_for(db: &TestDb, table: &str, consumer: &str, extra: &[&str]) -> Value {
    let mut args = vec!["retention", "advise", "--json"];
    args.extend_from_slice(extra);
    let advice = json(&idem(db, table, &args));
    (advice.as_array().unwrap().iter())
        .find(|a| a["consumer"] == consumer)
        .unwrap_or_else(|| panic!("no {consumer} in {advice}"))
        .clone()
}

/// A copy that came 30 days after its message was processed, under a retention of 7 days: the
/// retention recommended covers those 30 days, and once the consumer runs with it, the advice
/// is no longer that it is too short.
async fn retention_advise_covers_the_oldest_late_copy_and_settles_once_applied(backend: Backend) {
    let db = TestDb::connect(backend).await;
    let (inbox, table) = inbox(&db).await;
    let effects = db.effects_table().await;
    let consumer = unique("monthly");
    let handler = Recorder::new(&db, &effects, &consumer);
    expired_records(&db, &table, &consumer, &["k"], 30, 7).await;
    let meta = Metadata::default();
    inbox
        .process(&handler, Msg::new("k", "1"), &meta)
        .await
        .unwrap();
    inbox.cleaner().run_once().await.unwrap();

    let before = advice_for(&db, &table, &consumer, &[]);
    assert_eq!(before["verdict"], "too-short", "{before}");
    let thirty_days = 30.0 * 86_400.0;
    let late_age = before["late_max_age_s"].as_f64().unwrap_or(0.0);
    assert!(
        (thirty_days - 60.0..thirty_days + 60.0).contains(&late_age),
        "{before}"
    );
    let recommended = before["recommended_s"].as_f64().unwrap();
    assert!(recommended >= thirty_days, "{before}");

    // The operator applies it: the consumer's processes run with it from now on.
    let applied = Inbox::builder(db.db.clone())
        .table(table.as_str())
        .retention(
            RetentionPolicy::default()
                .with_consumer(&consumer, Duration::from_secs(recommended as u64)),
        )
        .build()
        .await
        .unwrap();
    applied
        .process(&handler, Msg::new("next", "1"), &meta)
        .await
        .unwrap();
    applied.cleaner().run_once().await.unwrap();
    let after = advice_for(&db, &table, &consumer, &[]);
    assert_eq!(after["retention_s"], recommended, "{after}");
    assert_ne!(after["verdict"], "too-short", "{after}");
    assert_eq!(after["late"], 1, "{after}");
}

/// `--since 7d` leaves out what the processes saw before those seven days.
async fn retention_advise_since_reads_only_the_window(backend: Backend) {
    let db = TestDb::connect(backend).await;
    let (inbox, table) = inbox(&db).await;
    let effects = db.effects_table().await;
    let consumer = unique("windowed");
    let handler = Recorder::new(&db, &effects, &consumer);
    expired_records(&db, &table, &consumer, &["k"], 8, 7).await;
    let meta = Metadata::default();
    inbox
        .process(&handler, Msg::new("k", "1"), &meta)
        .await
        .unwrap();
    inbox.cleaner().run_once().await.unwrap();
    // What was seen goes ten days back.
    db.exec(&format!(
        "UPDATE {table}_dup_daily SET day_ms = day_ms - {}, since_ms = since_ms - {}, \
         updated_ms = updated_ms - {} WHERE consumer = '{consumer}'",
        10 * DAY_MS,
        10 * DAY_MS,
        10 * DAY_MS
    ))
    .await;

    let all = advice_for(&db, &table, &consumer, &[]);
    assert_eq!(
        (all["late"].clone(), all["verdict"].clone()),
        (1.into(), "too-short".into())
    );
    let recent = advice_for(&db, &table, &consumer, &["--since", "7d"]);
    assert_eq!(recent["late"], 0, "{recent}");
    assert_ne!(recent["verdict"], "too-short", "{recent}");
}

/// Three orders charged twice, their records deleted by the cleaner, caught by a digest of
/// three keys: reported as late copies, the retention too short.
async fn retention_advise_reports_late_copies_a_nearly_empty_digest_caught(backend: Backend) {
    let db = TestDb::connect(backend).await;
    let (inbox, table) = inbox(&db).await;
    let effects = db.effects_table().await;
    let consumer = unique("charged");
    let handler = Recorder::new(&db, &effects, &consumer);
    let orders = ["o-1", "o-2", "o-3"];
    expired_records(&db, &table, &consumer, &orders, 8, 7).await;
    assert_eq!(inbox.cleaner().run_once().await.unwrap().deleted, 3);
    let meta = Metadata::default();
    for order in orders {
        let outcome = inbox.process(&handler, Msg::new(order, "1"), &meta).await;
        assert!(!outcome.unwrap().is_duplicate(), "charged again");
    }
    inbox.cleaner().run_once().await.unwrap();

    let advice = advice_for(&db, &table, &consumer, &[]);
    assert_eq!(advice["late"], 3, "{advice}");
    assert_eq!(advice["late_from_digest"], 3, "{advice}");
    assert!(
        advice["expected_false_alarms"].as_f64().unwrap() < 1e-3,
        "{advice}"
    );
    assert_eq!(advice["verdict"], "too-short", "{advice}");
    // At least eight days old, as the digest tells: the recommendation covers them.
    assert!(
        advice["recommended_s"].as_f64().unwrap() >= 8.0 * 86_400.0,
        "{advice}"
    );
}

/// `retention advise` with credentials that can only read the inbox and its companions (a
/// read-only SQLite file): it writes nothing, not even a probe, and tells what it read.
async fn retention_advise_reads_with_credentials_that_cannot_write(backend: Backend) {
    let db = TestDb::connect(backend).await;
    let (inbox, table) = inbox(&db).await;
    let effects = db.effects_table().await;
    let consumer = unique("readonly");
    let handler = Recorder::new(&db, &effects, &consumer);
    expired_records(&db, &table, &consumer, &["k"], 8, 7).await;
    let meta = Metadata::default();
    inbox
        .process(&handler, Msg::new("k", "1"), &meta)
        .await
        .unwrap();
    inbox.cleaner().run_once().await.unwrap();

    let reader = Reader::grant(&db, &[&table]).await;
    let output = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["retention", "advise", "--json"])
        .env("DATABASE_URL", &reader.url)
        .env("IDEM_INBOX_TABLE", &table)
        .stdin(Stdio::null())
        .output()
        .expect("idem runs");
    reader.revoke(&db).await;
    let advice = json(&output);
    let advice = (advice.as_array().unwrap().iter())
        .find(|a| a["consumer"] == consumer.as_str())
        .unwrap_or_else(|| panic!("no {consumer} in {advice}"))
        .clone();
    assert_eq!(
        (advice["late"].clone(), advice["verdict"].clone()),
        (1.into(), "too-short".into())
    );
}
