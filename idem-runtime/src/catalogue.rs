//! Scratch: every statement the store and the outbox send, per dialect, on a mock database.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use sea_orm::{DatabaseConnection, DbBackend, MockDatabase, MockExecResult, Value};

use crate::key::{ConsumerName, InboxKey, MessageKey};
use crate::outbox::{HeldSubject, Outbox, OutboxMessage, RunClaim};
use crate::store::dialect::Dialect;
use crate::store::table::TableName;
use crate::store::{BatchClaim, ClaimValues, LiveClaim, Store};

type Row = BTreeMap<String, Value>;

fn row(values: Vec<Value>) -> Row {
    (values.into_iter().enumerate())
        .map(|(i, v)| (format!("c{i:02}"), v))
        .collect()
}

fn mock(backend: DbBackend, queries: Vec<Vec<Row>>) -> DatabaseConnection {
    let mut all = queries;
    all.extend((0..40).map(|_| Vec::new()));
    MockDatabase::new(backend)
        .append_exec_results((0..40).map(|_| MockExecResult {
            last_insert_id: 0,
            rows_affected: 1,
        }))
        .append_query_results(all)
        .into_connection()
}

struct Log(String);

impl Log {
    fn take(&mut self, title: &str, db: &DatabaseConnection, result: impl std::fmt::Debug) {
        self.take_as(title, db, result, true);
    }

    fn take_as(
        &mut self,
        title: &str,
        db: &DatabaseConnection,
        result: impl std::fmt::Debug,
        values: bool,
    ) {
        let mut result = format!("{result:?}");
        result.truncate(160);
        let _ = writeln!(self.0, "### {title} -> {result}");
        for tx in db.clone().into_transaction_log() {
            for s in tx.statements() {
                let _ = writeln!(self.0, "{}", s.sql);
                if values {
                    let _ = writeln!(self.0, "    {:?}", s.values);
                }
            }
        }
    }
}

fn dialects() -> Vec<(&'static str, Dialect)> {
    vec![
        ("postgres", Dialect::new(DbBackend::Postgres)),
        ("mariadb", Dialect::new(DbBackend::MySql)),
        ("mysql", Dialect::new(DbBackend::MySql).mysql_proper()),
        ("sqlite", Dialect::new(DbBackend::Sqlite)),
    ]
}

fn text(s: &str, dialect: Dialect) -> Value {
    if dialect.backend() == DbBackend::MySql {
        Value::from(s.as_bytes().to_vec())
    } else {
        Value::from(s.to_owned())
    }
}

async fn store_flows(log: &mut Log, name: &str, dialect: Dialect, prepared: bool) {
    let backend = dialect.backend();
    let title = |what: &str| format!("{name} {} {what}", if prepared { "prepared" } else { "bare" });
    let mut store = Store::new(dialect, TableName::default(), Duration::from_millis(1500));
    if prepared {
        let db = mock(backend, vec![vec![row(vec!["2s".into()])]]);
        let r = store.read_lock_timeout(&db).await;
        log.take(&title("read_lock_timeout"), &db, r);
        let db = mock(
            backend,
            vec![vec![
                row(vec!["idx".into(), "consumer".into(), 0i64.into()]),
                row(vec![
                    "PRIMARY".into(),
                    "consumer,message_key".into(),
                    0i64.into(),
                ]),
            ]],
        );
        let r = store.read_key_index(&db).await;
        log.take(&title("read_key_index"), &db, r);
        let db = mock(backend, vec![vec![row(vec![4_194_304i64.into()])]]);
        let r = store.read_packet_limit(&db).await;
        log.take(&title("read_packet_limit"), &db, r);
    }
    let consumer = ConsumerName::new("orders").unwrap();
    let key = InboxKey {
        consumer: consumer.clone(),
        message_key: MessageKey::new("m-1").unwrap(),
    };
    let print = [7u8; 32];
    let leased = ClaimValues {
        fingerprint: Some(&print),
        attempts: 1,
        claim_token: 7,
        created_at: None,
        lease: Some(Duration::from_secs(30)),
        retention: Duration::from_secs(3600),
    };
    let plain = ClaimValues {
        fingerprint: None,
        attempts: 2,
        claim_token: 8,
        created_at: Some(5),
        lease: None,
        retention: Duration::from_secs(60),
    };
    macro_rules! flow {
        ($what:expr, $queries:expr, |$db:ident| $call:expr) => {{
            let $db = mock(backend, $queries);
            let r = $call.await;
            log.take(&title($what), &$db, r);
        }};
    }
    flow!("insert_claim leased", vec![], |db| store
        .insert_claim(&db, &key, &leased));
    flow!("insert_claim plain", vec![], |db| store
        .insert_claim(&db, &key, &plain));
    flow!("end_claim_wait", vec![], |db| store.end_claim_wait(&db));
    flow!("transaction_id", vec![], |db| store.transaction_id(&db));
    flow!("find", vec![], |db| store.find(&db, &key));
    flow!("peek", vec![], |db| store.peek(&db, &key));
    flow!("take_over", vec![], |db| store
        .take_over(&db, &key, 6, &leased));
    flow!("complete some", vec![], |db| store.complete(
        &db,
        &key,
        7,
        Some("{}"),
        Duration::from_secs(3600)
    ));
    flow!("complete none", vec![], |db| store.complete(
        &db,
        &key,
        7,
        None,
        Duration::from_secs(3600)
    ));
    flow!("renew", vec![], |db| store.renew(
        &db,
        &key,
        7,
        Duration::from_secs(30),
        Duration::from_secs(3600)
    ));
    flow!("release", vec![], |db| store.release(&db, &key, 7));
    flow!("hand_on", vec![], |db| store.hand_on(&db, &key, 7));
    flow!("revoke refuse", vec![], |db| store
        .revoke(&db, &key, 7, 9, LiveClaim::Refuse));
    flow!("revoke override", vec![], |db| store
        .revoke(&db, &key, 7, 9, LiveClaim::Override));
    flow!("delete refuse", vec![], |db| store
        .delete(&db, &key, LiveClaim::Refuse));
    flow!("delete override", vec![], |db| store
        .delete(&db, &key, LiveClaim::Override));
    let keys: Vec<MessageKey> = ["k-1", "k-2", "k-3"]
        .iter()
        .map(|k| MessageKey::new(*k).unwrap())
        .collect();
    let prints = [crate::fingerprint::Fingerprint::of_bytes(b"x")];
    let claims: Vec<BatchClaim<'_>> = keys
        .iter()
        .enumerate()
        .map(|(i, key)| BatchClaim {
            key,
            fingerprint: (i != 1).then_some(&prints[0]),
        })
        .collect();
    let refs: Vec<&MessageKey> = keys.iter().collect();
    let hour = Duration::from_secs(3600);
    flow!("insert_claims 1", vec![], |db| store
        .insert_claims(&db, &consumer, &claims[..1], 7, hour));
    flow!("insert_claims 3", vec![], |db| store
        .insert_claims(&db, &consumer, &claims, 7, hour));
    flow!("find_many 1", vec![], |db| store
        .find_many(&db, &consumer, &refs[..1]));
    flow!("find_many 3", vec![], |db| store
        .find_many(&db, &consumer, &refs));
    let outputs = vec![
        (refs[0], Some("{\"a\":1}")),
        (refs[1], None),
        (refs[2], Some("\"b\"")),
    ];
    flow!("complete_many mixed tx", vec![], |db| store.complete_many(
        &db,
        &consumer,
        7,
        &outputs,
        hour,
        Some(42)
    ));
    flow!("complete_many mixed", vec![], |db| store.complete_many(
        &db,
        &consumer,
        7,
        &outputs,
        hour,
        None
    ));
    let nones: Vec<_> = refs.iter().map(|k| (*k, None)).collect();
    flow!("complete_many none", vec![], |db| store.complete_many(
        &db, &consumer, 7, &nones, hour, None
    ));
    flow!("complete_many one", vec![], |db| store.complete_many(
        &db,
        &consumer,
        7,
        &outputs[..1],
        hour,
        None
    ));
    flow!("release_many 1", vec![], |db| store
        .release_many(&db, &consumer, 7, &refs[..1]));
    flow!("release_many 3", vec![], |db| store
        .release_many(&db, &consumer, 7, &refs));
    flow!("now", vec![vec![row(vec![123i64.into()])]], |db| store
        .now(&db));
    let deleted = |c: &str, k: &str| {
        row(vec![
            text(c, dialect),
            text(k, dialect),
            "completed".into(),
            Some(5i64).into(),
        ])
    };
    flow!(
        "delete_expired",
        vec![vec![deleted("orders", "k-1"), deleted("billing", "k-2")]],
        |db| store.delete_expired(&db, 1000, 100)
    );
    let lock_row = if backend == DbBackend::Postgres {
        row(vec![true.into()])
    } else {
        row(vec![Some(1i64).into()])
    };
    flow!("try_lock_cleaner", vec![vec![lock_row]], |db| store
        .try_lock_cleaner(&db));
    flow!("unlock_cleaner", vec![], |db| store.unlock_cleaner(&db));
    flow!(
        "sqlite_file",
        vec![vec![row(vec![Some("/tmp/x.db".to_owned()).into()])]],
        |db| store.sqlite_file(&db)
    );
    flow!("stats some", vec![], |db| store.stats(&db, Some("orders")));
    flow!("stats none", vec![], |db| store.stats(&db, None));
    flow!("create_table", vec![], |db| store.create_table(&db));
    {
        let db = mock(backend, vec![]);
        let r = store.check_schema(&db).await;
        log.take_as(&title("check_schema"), &db, r.is_ok(), false);
    }
    flow!("check_columns", vec![], |db| store.check_columns(&db));
    let _ = writeln!(
        log.0,
        "### {name} quoting: {} {} {}",
        store.quoted_table(),
        crate::store::table::companion(backend, store.table(), "dup_daily"),
        TableName::default().quoted(backend)
    );
}

fn version_rows(name: &str) -> Vec<Vec<Row>> {
    match name {
        "mariadb" => vec![vec![row(vec!["10.11.6-MariaDB".into()])]],
        "mysql" => vec![vec![row(vec!["8.0.36".into()])]],
        _ => vec![],
    }
}

async fn outbox(
    log: &mut Log,
    name: &str,
    dialect: Dialect,
    extra: Vec<Vec<Row>>,
    title: &str,
) -> (Outbox, DatabaseConnection) {
    let backend = dialect.backend();
    let mut queries = version_rows(name);
    if backend == DbBackend::Postgres {
        queries.push(vec![]);
    }
    queries.push(vec![row(vec![1i64.into()])]);
    queries.push(vec![]);
    queries.extend(extra);
    let db = mock(backend, queries);
    let outbox = Outbox::builder(db.clone())
        .retention(Duration::from_secs(86_400))
        .build()
        .await
        .expect("built");
    log.take(&format!("{name} outbox build ({title})"), &db, ());
    (outbox, db)
}

async fn outbox_flows(log: &mut Log, name: &str, dialect: Dialect) {
    macro_rules! flow {
        ($what:expr, $extra:expr, |$o:ident| $call:expr) => {{
            let ($o, db) = outbox(log, name, dialect, $extra, $what).await;
            let r = $call.await;
            log.take(&format!("{name} outbox {}", $what), &db, r);
        }};
    }
    let message = || {
        OutboxMessage::new("ex", "rk", b"payload".to_vec())
            .message_id("id-1")
            .header("h", "v")
    };
    flow!("stage", vec![], |o| o.stage(o.connection(), message()));
    flow!("stage run", vec![], |o| o
        .stage(o.connection(), message().in_run("r1")));
    let key = InboxKey {
        consumer: ConsumerName::new("orders").unwrap(),
        message_key: MessageKey::new("m-1").unwrap(),
    };
    for inbox in ["\"idem_inbox\"", "`idem_inbox`"] {
        let (o, db) = outbox(log, name, dialect, vec![], "run statements").await;
        let statements = o.statements_for_inbox(inbox);
        let _ = writeln!(log.0, "### {name} run statements {inbox}: {statements:?}");
        for announce in [true, false] {
            let claim = RunClaim {
                statements: Some(&statements),
                token: 7,
            };
            let r = o
                .stage_for_run(o.connection(), "id-2", &message(), announce, &key, Some(claim))
                .await;
            log.take(&format!("{name} stage_for_run {announce}"), &db, r);
        }
        let r = o
            .stage_for_run(o.connection(), "id-3", &message(), true, &key, None)
            .await;
        log.take(&format!("{name} stage_for_run unclaimed"), &db, r);
    }
    let bytes = |s: &str| text(s, dialect);
    let pending = |seq: i64, run: Option<&str>| {
        row(vec![
            seq.into(),
            bytes(&format!("id-{seq}")),
            "ex".into(),
            "rk".into(),
            None::<String>.into(),
            Some("{\"h\":\"v\"}".to_owned()).into(),
            b"payload".to_vec().into(),
            match run {
                Some(run) => bytes(run),
                None => {
                    if dialect.backend() == DbBackend::MySql {
                        None::<Vec<u8>>.into()
                    } else {
                        None::<String>.into()
                    }
                }
            },
            10i64.into(),
            20i64.into(),
        ])
    };
    let unsent = |run: &str, seq: i64, held: Option<i64>| {
        row(vec![bytes(run), seq.into(), held.into(), 20i64.into()])
    };
    for after in [None, Some(5)] {
        let extra = vec![
            vec![
                pending(1, Some("run:r1")),
                pending(2, None),
                pending(3, Some("run:r2")),
                pending(4, Some("run:r1")),
            ],
            vec![
                unsent("run:r1", 1, None),
                unsent("run:r1", 4, None),
                unsent("run:r2", 0, Some(40)),
                unsent("run:r2", 3, None),
            ],
        ];
        let (o, db) = outbox(log, name, dialect, extra, "take").await;
        let batch = o.take_pending_after(100, after).await.expect("taken");
        let _ = writeln!(
            log.0,
            "### taken: {:?} {} {:?}",
            batch.messages().iter().map(|m| m.seq).collect::<Vec<_>>(),
            batch.rows_taken(),
            batch.last_seq_taken()
        );
        let first = batch.messages()[0].clone();
        let second = batch.messages()[1].clone();
        let r1 = batch.hold(&first, Duration::from_secs(5)).await;
        let r2 = batch.hold(&second, Duration::from_millis(1)).await;
        let r3 = batch.hold_exchange("ex", Duration::from_secs(5)).await;
        let r4 = batch.mark_sent(&[1, 2, 3]).await;
        log.take(
            &format!("{name} outbox take {after:?}"),
            &db,
            (r1, r2, r3, r4),
        );
    }
    flow!("release_holds", vec![], |o| o.release_holds());
    flow!("delete_sent", vec![], |o| o.delete_sent(100));
    flow!(
        "stats",
        vec![vec![row(vec![
            3i64.into(),
            Some(5i64).into(),
            2i64.into(),
            1i64.into(),
            20i64.into()
        ])]],
        |o| o.stats()
    );
    flow!("pending", vec![], |o| o.pending());
    flow!("held_runs", vec![], |o| o.held_runs(10));
    flow!("pending_of run", vec![], |o| o
        .pending_of(&HeldSubject::Run("run:r1".into()), 10));
    flow!("pending_of message", vec![], |o| o
        .pending_of(&HeldSubject::Message("id-1".into()), 10));
    flow!("lift run", vec![], |o| o
        .lift_holds(&HeldSubject::Run("run:r1".into())));
    flow!("lift message", vec![], |o| o
        .lift_holds(&HeldSubject::Message("id-1".into())));
    // The upgrade of an earlier version's table.
    {
        let backend = dialect.backend();
        let mut queries = version_rows(name);
        if backend == DbBackend::Postgres {
            queries.push(vec![]);
        }
        let db = mock(backend, queries);
        let r = Outbox::builder(db.clone()).build().await.map(drop);
        log.take(&format!("{name} outbox upgrade"), &db, r);
    }
}

fn ddl(log: &mut Log) {
    let table = TableName::new("inbox_t").unwrap();
    for backend in [DbBackend::Postgres, DbBackend::MySql, DbBackend::Sqlite] {
        let _ = writeln!(log.0, "### ddl {backend:?}");
        for sql in crate::schema::create_table_statements(backend, &table) {
            let _ = writeln!(log.0, "{sql}");
        }
        for sql in crate::schema::create_outbox_statements(backend, &table) {
            let _ = writeln!(log.0, "{sql}");
        }
        for sql in crate::schema::upgrade_outbox_statements(backend, &table) {
            let _ = writeln!(log.0, "{sql}");
        }
        #[cfg(feature = "migration")]
        {
            for sql in crate::store::table::drop_table_statements(backend, &table) {
                let _ = writeln!(log.0, "{sql}");
            }
            let _ = writeln!(
                log.0,
                "{}",
                crate::outbox::drop_outbox_statement(backend, &table)
            );
        }
    }
}

#[tokio::test]
async fn catalogue() {
    let mut log = Log(String::new());
    ddl(&mut log);
    for (name, dialect) in dialects() {
        for prepared in [false, true] {
            store_flows(&mut log, name, dialect, prepared).await;
        }
        outbox_flows(&mut log, name, dialect).await;
        let wait = Duration::from_millis(1500);
        let _ = writeln!(
            log.0,
            "### {name} dialect: {} | {} | {} | {} {} {} | {:?} | {:?} | {:?}",
            dialect.now_ms(),
            dialect.quote("x"),
            dialect.with_lock_wait("UPDATE t", wait),
            dialect.aborts_on_error(),
            dialect.tells_open_transaction(),
            dialect.has_insert_returning(),
            dialect.try_lock("cleaner", "t"),
            dialect.unlock("cleaner", "t"),
            dialect.schema_lock("t"),
        );
    }
    let out = std::env::var("IDEM_CATALOGUE_OUT").expect("an output file");
    std::fs::write(out, log.0).unwrap();
}
