//! The inbox across deployments, on each backend: a message type that gains fields keeps its
//! redeliveries duplicates; replicas starting together all start; leases and retention set at
//! run time override the handler's; cleaners of same-named tables in two PostgreSQL schemas do
//! not share a lock.
//!
//! Run: `cargo test -p idem-tests --test database edges_deployment::` with PostgreSQL and MariaDB up (see
//! README).

use std::time::Duration;

use idem_runtime::admin::InboxAdmin;
use idem_runtime::fingerprint::Fingerprint;
use idem_runtime::outbox::Outbox;
use idem_runtime::sea_orm::{DatabaseTransaction, DbErr};
use idem_runtime::{Error, Inbox, InboxBuilder, Metadata, Outcome, RetentionPolicy, idempotent};
use idem_tests::{
    Backend, CutWorker, Msg, Recorder, TestDb, inbox_key, meta, on_each_backend, unique,
};
use idem_tests::{inbox_and_effects as setup, inbox_and_effects_with as setup_with};
use serde::{Deserialize, Serialize};

on_each_backend!(
    redeliveries_of_an_older_message_version_are_duplicates,
    replicas_starting_together_all_start,
    leases_and_retention_set_at_run_time_override_the_handlers,
);

#[derive(Debug, Serialize, Deserialize)]
struct OrderV1 {
    id: String,
    amount: i64,
}

/// The next version of [`OrderV1`]: two fields a serde user adds compatibly.
#[derive(Debug, Serialize, Deserialize)]
struct OrderV2 {
    id: String,
    amount: i64,
    #[serde(default)]
    priority: u8,
    #[serde(default)]
    note: Option<String>,
}

#[idempotent(key = order.id, consumer = "orders.evolving")]
async fn charge_v1(tx: &DatabaseTransaction, order: OrderV1) -> Result<i64, DbErr> {
    let _ = tx;
    Ok(order.amount)
}

#[idempotent(key = order.id, consumer = "orders.evolving")]
async fn charge_v2(tx: &DatabaseTransaction, order: OrderV2) -> Result<i64, DbErr> {
    let _ = tx;
    Ok(order.amount * 100 + i64::from(order.priority))
}

/// What a transport gives the inbox for `payload`: the payload's fingerprint.
fn received(payload: &[u8]) -> Metadata {
    Metadata {
        payload_fingerprint: Some(Fingerprint::of_json(payload).unwrap()),
        ..Metadata::default()
    }
}

async fn redeliveries_of_an_older_message_version_are_duplicates(backend: Backend) {
    let (_db, inbox, _effects) = setup(backend).await;
    let payload = br#"{"id":"o-1","amount":5}"#;
    let v1: OrderV1 = serde_json::from_slice(payload).unwrap();
    let first = inbox
        .process(&charge_v1_handler(), v1, &received(payload))
        .await
        .unwrap();
    assert_eq!(first, Outcome::Processed(5));

    // Deployed: version 2 of the type reads the same message with its defaults.
    let v2: OrderV2 = serde_json::from_slice(payload).unwrap();
    let again = inbox
        .process(&charge_v2_handler(), v2, &received(payload))
        .await
        .unwrap();
    assert_eq!(again, Outcome::Duplicate(5));

    // A newer producer that sends the new field as null still sends the same message...
    let explicit = br#"{"note":null,"amount":5,"id":"o-1"}"#;
    let v2: OrderV2 = serde_json::from_slice(explicit).unwrap();
    let same = inbox
        .process(&charge_v2_handler(), v2, &received(explicit))
        .await
        .unwrap();
    assert_eq!(same, Outcome::Duplicate(5));

    // ...but a value in it, or a changed amount, is other content.
    for changed in [
        &br#"{"id":"o-1","amount":5,"priority":3}"#[..],
        br#"{"id":"o-1","amount":6}"#,
    ] {
        let v2: OrderV2 = serde_json::from_slice(changed).unwrap();
        let error = inbox
            .process(&charge_v2_handler(), v2, &received(changed))
            .await
            .unwrap_err();
        assert!(
            matches!(error, Error::FingerprintMismatch { .. }),
            "{error:?}"
        );
    }
}

async fn replicas_starting_together_all_start(backend: Backend) {
    let db = TestDb::connect(backend).await;
    let table = db.table("inbox");
    let outbox_table = db.table("outbox");
    for create_table in [true, false] {
        let mut starts = Vec::new();
        for _ in 0..8 {
            let pool = db.another_pool(2).await;
            let (table, outbox_table) = (table.clone(), outbox_table.clone());
            starts.push(tokio::spawn(async move {
                let outbox = Outbox::builder(pool.clone())
                    .table(outbox_table)
                    .create_table(create_table)
                    .build()
                    .await?;
                Inbox::builder(pool)
                    .table(table)
                    .create_table(create_table)
                    .outbox(outbox)
                    .build()
                    .await
                    .map(|_| ())
            }));
        }
        for start in starts {
            start.await.unwrap().unwrap_or_else(|error| {
                panic!("a replica failed to start (create_table({create_table})): {error:?}")
            });
        }
    }
}

/// Two inboxes with one table name in two PostgreSQL schemas clean at the same time.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_cleaners_of_same_named_tables_in_two_schemas_do_not_share_a_lock() {
    let admin = TestDb::connect(Backend::Postgres).await;
    let table = unique("inbox");
    let schemas = [unique("schema_a"), unique("schema_b")];
    let mut cleaners = Vec::new();
    let mut pools = Vec::new();
    for schema in &schemas {
        admin.exec(&format!("CREATE SCHEMA {schema}")).await;
        let url = format!(
            "{}?options=-c%20search_path%3D{schema}",
            Backend::Postgres.url("")
        );
        let db = TestDb::connect_url(Backend::Postgres, url, 4).await;
        let inbox = Inbox::builder(db.db.clone())
            .table(table.clone())
            .retention(
                RetentionPolicy::default()
                    .with_batch_size(10)
                    .with_pause_between_batches(Duration::from_millis(50)),
            )
            .build()
            .await
            .unwrap();
        db.exec(&format!(
            "INSERT INTO {table} (consumer, message_key, status, attempts, claim_token, \
             created_at, claimed_at, completed_at, expires_at) \
             SELECT 'c', 'k-' || n, 'completed', 1, 0, 1, 1, 1, 1 FROM generate_series(1, 100) n"
        ))
        .await;
        cleaners.push(inbox.cleaner());
        pools.push(db);
    }
    let first = {
        let cleaner = cleaners[0].clone();
        tokio::spawn(async move { cleaner.run_once().await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let second = cleaners[1].run_once().await.unwrap();
    let first = first.await.unwrap().unwrap();
    for schema in &schemas {
        admin.exec(&format!("DROP SCHEMA {schema} CASCADE")).await;
    }
    assert!(!first.skipped && !second.skipped, "{first:?} {second:?}");
    assert_eq!((first.deleted, second.deleted), (100, 100));
}

async fn leases_and_retention_set_at_run_time_override_the_handlers(backend: Backend) {
    let hour = Duration::from_secs(3600);
    let configure = |builder: InboxBuilder| {
        builder
            .lease("mailer", Duration::from_millis(300))
            .retention(RetentionPolicy::default().with_consumer("mailer", 2 * hour))
    };
    let (db, inbox, effects) = setup_with(backend, configure).await;
    // The handler says an hour for both; the configuration says otherwise. The stale worker's
    // renewals are cut once it has claimed (and renewed) the message, so its claim lasts one
    // configured lease past its last renewal.
    let stale_worker = CutWorker::new(&db, inbox.table().as_str(), configure).await;
    let mut stale = Recorder::new(&db, &effects, "mailer")
        .two_phase(hour)
        .slow(Duration::from_millis(900));
    stale.retention = Some(hour);
    let fresh = stale.clone().slow(Duration::ZERO).tagged("fresh");
    let msg = Msg::new("mail-1", "hello");
    let stale_run = {
        let (inbox, stale, msg) = (stale_worker.inbox.clone(), stale.clone(), msg.clone());
        tokio::spawn(async move { inbox.process(&stale, msg, &Metadata::default()).await })
    };
    tokio::time::sleep(Duration::from_millis(150)).await;
    stale_worker.cut().await;
    tokio::time::sleep(Duration::from_millis(450)).await;
    // Past the configured lease, not the handler's hour: taken over.
    let taken = inbox.process(&fresh, msg, &meta()).await.unwrap();
    assert_eq!(taken, Outcome::Processed("fresh:hello".into()));
    stale_worker.restore().await;
    assert!(matches!(
        stale_run.await.unwrap(),
        Err(Error::ClaimLost { .. })
    ));
    let record = inbox
        .lookup(&inbox_key("mailer", "mail-1"))
        .await
        .unwrap()
        .unwrap();
    let kept = record
        .expires_at
        .duration_since(record.completed_at.unwrap())
        .unwrap();
    assert!(
        kept > hour + Duration::from_secs(3000) && kept <= 2 * hour + Duration::from_secs(1),
        "kept for {kept:?}"
    );
}
