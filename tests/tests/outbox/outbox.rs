//! The outbox on each backend: handlers stage in their transaction with ids that replay
//! identically, duplicates and rollbacks stage nothing, relays take pending messages in order
//! without sharing them (on SQLite, taking turns, while handlers go on committing), and sent rows
//! are cleaned up.
//!
//! Run: `cargo test -p idem-tests --test outbox outbox::` with PostgreSQL and MariaDB up (see README).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_runtime::admin::Forgotten;
use idem_runtime::admin::InboxAdmin;
use idem_runtime::admin::LiveClaim;
use idem_runtime::fingerprint::{Fingerprint, FingerprintError};
use idem_runtime::outbox::Relaying;
use idem_runtime::outbox::derived_id;
use idem_runtime::outbox::{Outbound, Outbox, StagingError};
use idem_runtime::sea_orm::{ConnectionTrait, DatabaseTransaction, DbErr, TransactionTrait};
use idem_runtime::transport::BatchChecks;
use idem_runtime::transport::Processing;
use idem_runtime::{
    ConfigError, Context, Error, Handler, Inbox, KeyError, MessageKey, Metadata, Mode,
    OutboxMessage, Outcome, idempotent, transport::BatchItem,
};
use idem_tests::{Backend, Msg, TestDb, inbox_key, meta, on_each_backend, unique};

on_each_backend!(
    a_handler_stages_with_derived_ids_and_a_duplicate_stages_nothing,
    a_rolled_back_handler_stages_nothing_in_either_mode,
    a_replay_after_the_record_is_gone_stages_the_same_ids_once,
    relays_take_pending_messages_in_order_and_never_share_them,
    code_outside_handlers_stages_in_its_own_transaction,
    sent_messages_are_deleted_after_their_retention,
    a_two_phase_takeover_derives_the_same_downstream_keys,
    an_idempotent_function_stages_through_its_outbound_parameter,
    a_held_run_leaves_out_no_run_that_differs_only_in_case,
    nothing_is_staged_once_the_handlers_transaction_is_lost,
);

/// The database servers, whose relays take messages side by side.
mod servers {
    use super::*;
    on_each_backend!([postgres, mysql]:
        messages_of_a_run_outside_handlers_keep_their_order_across_relays,
        a_run_waits_for_a_message_between_two_of_its_batch_that_another_relay_has,
    );
}

/// SQLite's own: one writer at a time.
mod embedded {
    use super::*;
    on_each_backend!([sqlite]:
        a_trusted_batch_blames_no_handler_for_an_earlier_ones_rollback,
        a_batch_in_hand_holds_up_no_handler_and_relays_take_turns,
    );
}

const CONSUMER: &str = "billing";

/// Writes its effect and stages two events; fails after staging when the body says `fail`.
#[derive(Debug, Clone)]
struct Invoicer {
    effects: String,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct InvoiceError(String);

impl From<DbErr> for InvoiceError {
    fn from(error: DbErr) -> Self {
        Self(error.to_string())
    }
}

impl From<StagingError> for InvoiceError {
    fn from(error: StagingError) -> Self {
        Self(error.to_string())
    }
}

impl Handler for Invoicer {
    type Message = Msg;
    type Output = Vec<String>;
    type Error = InvoiceError;

    fn consumer(&self) -> &str {
        CONSUMER
    }
    fn key(&self, msg: &Msg, _: &Metadata) -> Result<MessageKey, KeyError> {
        MessageKey::new(msg.id.as_str())
    }
    fn fingerprint(
        &self,
        msg: &Msg,
        meta: &Metadata,
    ) -> Result<Option<Fingerprint>, FingerprintError> {
        meta.content_fingerprint(msg).map(Some)
    }
    async fn handle(&self, cx: &Context<'_>, msg: Msg) -> Result<Vec<String>, InvoiceError> {
        let tx = cx.transaction().expect("transactional");
        idem_tests::db::insert_effect(tx, &self.effects, CONSUMER, &msg.id, &msg.body).await?;
        let mut ids = Vec::new();
        for event in ["invoice.issued", "invoice.mailed"] {
            let message = OutboxMessage::json("billing.events", event, &msg)
                .map_err(|e| InvoiceError(e.to_string()))?
                .header("order", msg.id.as_str());
            ids.push(cx.stage(message).await?);
        }
        if msg.body == "fail" {
            return Err(InvoiceError("failing after staging".into()));
        }
        Ok(ids)
    }
}

/// The run of this file's consumer's handler for `key`, as the outbox names it.
fn run_of(key: &str) -> String {
    format!("{}:{CONSUMER}/{key}", CONSUMER.len())
}

async fn setup(backend: Backend) -> (TestDb, Inbox, Outbox, String) {
    setup_with(backend, Duration::from_secs(3600)).await
}

async fn setup_with(backend: Backend, retention: Duration) -> (TestDb, Inbox, Outbox, String) {
    let db = TestDb::connect(backend).await;
    let (inbox, outbox) = inbox_and_outbox(&db, retention).await;
    let effects = db.effects_table().await;
    (db, inbox, outbox, effects)
}

/// An inbox on fresh tables of `db`, staging in an outbox that keeps sent messages `retention`.
async fn inbox_and_outbox(db: &TestDb, retention: Duration) -> (Inbox, Outbox) {
    let outbox = Outbox::builder(db.db.clone())
        .table(db.table("outbox"))
        .retention(retention)
        .build()
        .await
        .expect("outbox builds");
    let inbox = Inbox::builder(db.db.clone())
        .table(db.table("inbox"))
        .outbox(outbox.clone())
        .build()
        .await
        .expect("inbox builds");
    (inbox, outbox)
}

async fn pending_ids(outbox: &Outbox) -> Vec<String> {
    let batch = outbox.take_pending(1000).await.unwrap();
    let ids = batch
        .messages()
        .iter()
        .map(|m| m.message_id.clone())
        .collect();
    // Released at once, not on drop (a rollback the pool finishes later): the next take
    // would skip the rows still locked.
    batch.mark_sent(&[]).await.unwrap();
    ids
}

async fn a_handler_stages_with_derived_ids_and_a_duplicate_stages_nothing(backend: Backend) {
    let (db, inbox, outbox, effects) = setup(backend).await;
    let handler = Invoicer { effects };
    let first = inbox
        .process(&handler, Msg::new("o-1", "a"), &meta())
        .await
        .unwrap();
    let origin = inbox_key(CONSUMER, "o-1");
    let expected = vec![derived_id(&origin, 0), derived_id(&origin, 1)];
    assert_eq!(first, Outcome::Processed(expected.clone()));
    let again = inbox
        .process(&handler, Msg::new("o-1", "a"), &meta())
        .await
        .unwrap();
    assert_eq!(again, Outcome::Duplicate(expected.clone()));
    assert_eq!(pending_ids(&outbox).await, expected);
    let batch = outbox.take_pending(10).await.unwrap();
    let message = &batch.messages()[0];
    assert_eq!(message.exchange, "billing.events");
    assert_eq!(message.routing_key, "invoice.issued");
    assert_eq!(message.content_type.as_deref(), Some("application/json"));
    assert_eq!(
        message.headers.get("order").map(String::as_str),
        Some("o-1")
    );
    let payload: Msg = serde_json::from_slice(&message.payload).unwrap();
    assert_eq!(payload, Msg::new("o-1", "a"));
    batch.mark_sent(&[]).await.unwrap();
    assert_eq!(db.count(outbox.table().as_str(), "1=1").await, 2);
}

async fn a_rolled_back_handler_stages_nothing_in_either_mode(backend: Backend) {
    let (db, inbox, outbox, effects) = setup(backend).await;
    let handler = Invoicer { effects };
    let error = inbox
        .process(&handler, Msg::new("o-1", "fail"), &meta())
        .await
        .unwrap_err();
    assert_eq!(error.code(), "handler-error");
    assert_eq!(db.count(outbox.table().as_str(), "1=1").await, 0);

    // In a batch, the failing message's staged events roll back with its savepoint only.
    let item = |id: &str, body: &str| BatchItem {
        key: MessageKey::new(id),
        message: Msg::new(id, body),
        metadata: meta(),
    };
    let results = inbox
        .process_batch(
            &handler,
            vec![item("o-2", "a"), item("o-3", "fail"), item("o-4", "a")],
        )
        .await;
    assert!(results[1].is_err());
    let mut expected: Vec<String> = ["o-2", "o-4"]
        .iter()
        .flat_map(|key| {
            let origin = inbox_key(CONSUMER, key);
            [derived_id(&origin, 0), derived_id(&origin, 1)]
        })
        .collect();
    let mut pending = pending_ids(&outbox).await;
    expected.sort();
    pending.sort();
    assert_eq!(pending, expected);
}

async fn a_replay_after_the_record_is_gone_stages_the_same_ids_once(backend: Backend) {
    let (db, inbox, outbox, effects) = setup(backend).await;
    let handler = Invoicer { effects };
    let msg = Msg::new("o-1", "a");
    let first = inbox.process(&handler, msg.clone(), &meta()).await.unwrap();
    // The record expired, or an operator resubmitted the message from the dead-letter queue.
    assert_eq!(
        inbox
            .forget(&inbox_key(CONSUMER, "o-1"), LiveClaim::Override)
            .await
            .unwrap(),
        Forgotten::Deleted
    );
    let replay = inbox.process(&handler, msg, &meta()).await.unwrap();
    assert_eq!(replay, Outcome::Processed(first.into_inner()));
    assert_eq!(db.count(outbox.table().as_str(), "1=1").await, 2);
}

async fn relays_take_pending_messages_in_order_and_never_share_them(backend: Backend) {
    let (db, inbox, outbox, effects) = setup(backend).await;
    let handler = Invoicer { effects };
    for i in 0..5 {
        inbox
            .process(&handler, Msg::new(format!("o-{i}"), "a"), &meta())
            .await
            .unwrap();
    }
    let all = pending_ids(&outbox).await;
    assert_eq!(all.len(), 10);
    let origin = inbox_key(CONSUMER, "o-0");
    assert_eq!(all[..2], [derived_id(&origin, 0), derived_id(&origin, 1)]);
    if backend == Backend::Sqlite {
        // One process owns a SQLite file; its relay takes everything.
        return;
    }
    // A relay in another process takes three messages: the last one splits o-1's pair.
    let other = Outbox::builder(db.another_pool(2).await)
        .table(outbox.table().as_str())
        .build()
        .await
        .unwrap();
    let first = other.take_pending(3).await.unwrap();
    let firsts: Vec<String> = first
        .messages()
        .iter()
        .map(|m| m.message_id.clone())
        .collect();
    assert_eq!(firsts, all[..3]);
    // This relay skips what the other holds, and o-1's second message waits for its first.
    let second = outbox.take_pending(100).await.unwrap();
    let seconds: Vec<String> = second
        .messages()
        .iter()
        .map(|m| m.message_id.clone())
        .collect();
    assert_eq!(seconds, all[4..]);
    let seqs: Vec<i64> = second.messages().iter().map(|m| m.seq).collect();
    second.mark_sent(&seqs).await.unwrap();
    let seqs: Vec<i64> = first.messages().iter().map(|m| m.seq).collect();
    first.mark_sent(&seqs).await.unwrap();
    assert_eq!(pending_ids(&outbox).await, all[3..4]);
}

/// Messages staged outside handlers are one run across relays too: while another relay holds
/// the first of them, this one takes none of the later ones (it published them at once, ahead
/// of the first, should that one be held back).
async fn messages_of_a_run_outside_handlers_keep_their_order_across_relays(backend: Backend) {
    let (db, _inbox, outbox, _effects) = setup(backend).await;
    for routing_key in ["first", "second"] {
        let message = OutboxMessage::new("events", routing_key, b"{}".to_vec()).in_run("events");
        outbox.stage(&db.db, message).await.unwrap();
    }
    let other = Outbox::builder(db.another_pool(2).await)
        .table(outbox.table().as_str())
        .build()
        .await
        .unwrap();
    let first = other.take_pending(1).await.unwrap();
    assert_eq!(first.messages()[0].routing_key, "first");
    let second = outbox.take_pending(100).await.unwrap();
    assert!(second.messages().is_empty(), "{:?}", second.messages());
    second.mark_sent(&[]).await.unwrap();
    first.mark_sent(&[]).await.unwrap();
}

/// A relay that has a run's first and third messages, but not its second (another relay took
/// it, found the first unsent before it and left it out, still locked), publishes the first
/// only: the third waits for the second.
async fn a_run_waits_for_a_message_between_two_of_its_batch_that_another_relay_has(
    backend: Backend,
) {
    let (db, _inbox, outbox, _effects) = setup(backend).await;
    for routing_key in ["first", "second", "third"] {
        let message = OutboxMessage::new("events", routing_key, b"{}".to_vec()).in_run("events");
        outbox.stage(&db.db, message).await.unwrap();
    }
    let all = outbox.take_pending(100).await.unwrap();
    let seqs: Vec<i64> = all.messages().iter().map(|m| m.seq).collect();
    all.mark_sent(&[]).await.unwrap();
    let other = Outbox::builder(db.another_pool(2).await)
        .table(outbox.table().as_str())
        .build()
        .await
        .unwrap();
    let second = other.take_pending_after(1, Some(seqs[0])).await.unwrap();
    assert_eq!(second.rows_taken(), 1);
    assert!(second.messages().is_empty(), "{:?}", second.messages());
    let batch = outbox.take_pending(100).await.unwrap();
    let keys: Vec<&str> = (batch.messages().iter())
        .map(|m| m.routing_key.as_str())
        .collect();
    assert_eq!(keys, ["first"]);
    batch.mark_sent(&[seqs[0]]).await.unwrap();
    second.mark_sent(&[]).await.unwrap();
    let rest = outbox.take_pending(100).await.unwrap();
    let keys: Vec<&str> = (rest.messages().iter())
        .map(|m| m.routing_key.as_str())
        .collect();
    assert_eq!(keys, ["second", "third"]);
    rest.mark_sent(&[]).await.unwrap();
}

/// Runs are told apart by their bytes: holding back run `o-a` leaves out its messages only,
/// not those of `o-A` (MySQL/MariaDB's default collation takes the two for one).
async fn a_held_run_leaves_out_no_run_that_differs_only_in_case(backend: Backend) {
    let (_db, inbox, outbox, effects) = setup(backend).await;
    let handler = Invoicer { effects };
    for id in ["o-a", "o-A"] {
        inbox
            .process(&handler, Msg::new(id, "a"), &meta())
            .await
            .unwrap();
    }
    let all = outbox.take_pending(100).await.unwrap();
    let first = &all.messages()[0];
    assert_eq!(first.run, Some(run_of("o-a")));
    all.hold(first, Duration::from_secs(60)).await.unwrap();
    all.mark_sent(&[]).await.unwrap();
    let batch = outbox.take_pending(100).await.unwrap();
    let runs: Vec<Option<String>> = batch.messages().iter().map(|m| m.run.clone()).collect();
    let other = Some(run_of("o-A"));
    assert_eq!(runs, [other.clone(), other]);
    batch.mark_sent(&[]).await.unwrap();
}

async fn a_batch_in_hand_holds_up_no_handler_and_relays_take_turns(backend: Backend) {
    let (_db, inbox, outbox, effects) = setup(backend).await;
    let handler = Invoicer { effects };
    let metadata = meta();
    let process = |id: &'static str| inbox.process(&handler, Msg::new(id, "a"), &metadata);
    process("o-0").await.unwrap();
    let first = outbox.take_pending(100).await.unwrap();
    assert_eq!(first.messages().len(), 2);
    // While the relay publishes it, handlers commit: no write lock is held meanwhile.
    let committed = tokio::time::timeout(Duration::from_secs(2), process("o-1")).await;
    assert!(
        matches!(committed, Ok(Ok(_))),
        "a handler waited for the relay's batch: {committed:?}"
    );
    // Another relay of this outbox waits for its turn, then finds only what is left.
    let other = outbox.clone();
    let second = tokio::spawn(async move {
        let batch = other.take_pending(100).await.unwrap();
        let ids: Vec<String> = batch
            .messages()
            .iter()
            .map(|m| m.message_id.clone())
            .collect();
        ids
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!second.is_finished(), "two batches in hand at once");
    let seqs: Vec<i64> = first.messages().iter().map(|m| m.seq).collect();
    first.mark_sent(&seqs).await.unwrap();
    let origin = inbox_key(CONSUMER, "o-1");
    assert_eq!(
        second.await.unwrap(),
        [derived_id(&origin, 0), derived_id(&origin, 1)]
    );
}

async fn code_outside_handlers_stages_in_its_own_transaction(backend: Backend) {
    let (db, _inbox, outbox, _effects) = setup(backend).await;
    let message = || OutboxMessage::new("orders", "order.placed", b"{}".to_vec());
    let tx = db.db.begin().await.unwrap();
    outbox
        .stage(&tx, message().message_id("rolled-back"))
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    let tx = db.db.begin().await.unwrap();
    let id = outbox.stage(&tx, message()).await.unwrap();
    outbox
        .stage(&tx, message().message_id("given"))
        .await
        .unwrap();
    // The same id again stages nothing.
    outbox
        .stage(&tx, message().message_id("given"))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(pending_ids(&outbox).await, vec![id, "given".to_owned()]);
    let error = outbox
        .stage(&db.db, message().message_id(""))
        .await
        .unwrap_err();
    assert!(error.to_string().contains("empty"), "{error}");
}

async fn sent_messages_are_deleted_after_their_retention(backend: Backend) {
    let (db, inbox, outbox, effects) = setup_with(backend, Duration::from_millis(100)).await;
    let handler = Invoicer { effects };
    for i in 0..3 {
        inbox
            .process(&handler, Msg::new(format!("o-{i}"), "a"), &meta())
            .await
            .unwrap();
    }
    let batch = outbox.take_pending(4).await.unwrap();
    let seqs: Vec<i64> = batch.messages().iter().map(|m| m.seq).collect();
    batch.mark_sent(&seqs).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    inbox.cleaner().run_once().await.unwrap();
    // The four sent rows are gone; the two unsent stay, however old.
    assert_eq!(db.count(outbox.table().as_str(), "1=1").await, 2);
    assert_eq!(pending_ids(&outbox).await.len(), 2);

    // A service that stages without an inbox deletes its sent rows itself.
    let tx = db.db.begin().await.unwrap();
    let message = OutboxMessage::new("orders", "order.placed", b"{}".to_vec());
    outbox.stage(&tx, message).await.unwrap();
    tx.commit().await.unwrap();
    let batch = outbox.take_pending(4).await.unwrap();
    let seqs: Vec<i64> = batch.messages().iter().map(|m| m.seq).collect();
    batch.mark_sent(&seqs).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(outbox.delete_sent(100).await.unwrap(), 3);
    assert_eq!(db.count(outbox.table().as_str(), "1=1").await, 0);
}

/// A two-phase handler that asks for two downstream keys, recording them, and hangs on its
/// first run so that its lease runs out.
#[derive(Debug, Clone)]
struct Caller {
    keys: Arc<Mutex<Vec<Vec<String>>>>,
}

impl Handler for Caller {
    type Message = Msg;
    type Output = ();
    type Error = std::convert::Infallible;

    fn consumer(&self) -> &str {
        "notifications"
    }
    fn key(&self, msg: &Msg, _: &Metadata) -> Result<MessageKey, KeyError> {
        MessageKey::new(msg.id.as_str())
    }
    fn fingerprint(&self, _: &Msg, _: &Metadata) -> Result<Option<Fingerprint>, FingerprintError> {
        Ok(None)
    }
    fn mode(&self) -> Mode {
        Mode::TwoPhase {
            lease: Duration::from_millis(300),
        }
    }
    async fn handle(&self, cx: &Context<'_>, _: Msg) -> Result<(), Self::Error> {
        let keys = vec![cx.downstream_key(), cx.downstream_key()];
        let first = {
            let mut all = self.keys.lock().unwrap();
            all.push(keys);
            all.len() == 1
        };
        if first {
            std::future::pending::<()>().await;
        }
        Ok(())
    }
}

async fn a_two_phase_takeover_derives_the_same_downstream_keys(backend: Backend) {
    let (_db, inbox, _outbox, _effects) = setup(backend).await;
    let caller = Caller {
        keys: Arc::default(),
    };
    // The first worker crashes mid-call (its future is dropped) and its lease runs out.
    let metadata = meta();
    let called = async {
        while caller.keys.lock().unwrap().is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::select! {
        finished = inbox.process(&caller, Msg::new("o-1", "a"), &metadata) => {
            panic!("the first run should hang, it ended with {finished:?}")
        }
        () = called => {}
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    inbox
        .process(&caller, Msg::new("o-1", "a"), &meta())
        .await
        .unwrap();
    let keys = caller.keys.lock().unwrap().clone();
    let origin = inbox_key("notifications", "o-1");
    assert_eq!(keys.len(), 2);
    assert_eq!(keys[0], [derived_id(&origin, 0), derived_id(&origin, 1)]);
    assert_eq!(keys[1], keys[0]);
}

#[idempotent(key = order.id, consumer = "shipping")]
async fn ship(
    tx: &DatabaseTransaction,
    outbound: &Outbound<'_>,
    order: Msg,
) -> Result<String, DbErr> {
    let _ = tx;
    let event = OutboxMessage::json("shipping.events", "shipment.created", &order)
        .map_err(|error| DbErr::Custom(error.to_string()))?;
    Ok(outbound.stage(event).await?)
}

async fn an_idempotent_function_stages_through_its_outbound_parameter(backend: Backend) {
    let (_db, inbox, outbox, _effects) = setup(backend).await;
    let id = inbox
        .process(&ship_handler(), Msg::new("o-9", "a"), &meta())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(id, derived_id(&inbox_key("shipping", "o-9"), 0));
    assert_eq!(pending_ids(&outbox).await, vec![id]);
}

/// On MySQL/MariaDB the relay's statements name the indexes they go through (the optimizer took
/// others and read every row): an outbox table without one is refused at start-up, by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mysql_an_outbox_table_without_its_indexes_is_refused_by_name() {
    let db = TestDb::connect(Backend::MySql).await;
    let table = db.table("outbox");
    Outbox::builder(db.db.clone())
        .table(table.as_str())
        .build()
        .await
        .unwrap();
    db.exec(&format!("ALTER TABLE `{table}` DROP INDEX `{table}_runs`"))
        .await;
    let err = Outbox::builder(db.db.clone())
        .table(table.as_str())
        .create_table(false)
        .build()
        .await
        .unwrap_err();
    let shown = err.to_string();
    assert!(
        matches!(err, Error::Config(ConfigError::SchemaMismatch { .. })),
        "{err:?}"
    );
    assert!(shown.contains(&format!("{table}_runs")), "{shown}");
}

/// A MariaDB database whose default character set is latin1, as many managed servers still
/// have: text outside it (a header, a routing key, a handler run's origin) is staged and read
/// back whole, as the inbox's own table keeps such keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mysql_a_latin1_database_stages_any_text() {
    let server = TestDb::connect(Backend::MySql).await;
    let database = unique("zz_latin1");
    server
        .exec(&format!("CREATE DATABASE {database} CHARACTER SET latin1"))
        .await;
    let url = Backend::MySql.url("");
    let (server_url, _) = url.rsplit_once('/').expect("a database in the URL");
    let db = TestDb::connect_url(Backend::MySql, format!("{server_url}/{database}"), 4).await;
    let (inbox, outbox) = inbox_and_outbox(&db, Duration::from_secs(3600)).await;
    let staged = inbox
        .process(&Relabel, Msg::new("заказ-42", "x"), &meta())
        .await
        .unwrap()
        .into_inner();
    let batch = outbox.take_pending(10).await.unwrap();
    let messages = batch.messages();
    assert_eq!(messages.len(), 1);
    assert_eq!(messages[0].message_id, staged);
    assert_eq!(messages[0].routing_key, "заказ.принят");
    assert_eq!(
        messages[0].headers.get("order").map(String::as_str),
        Some("заказ-42")
    );
    assert_eq!(
        messages[0].run.as_deref(),
        Some(run_of("заказ-42").as_str())
    );
    drop(batch);
    drop(db);
    server.exec(&format!("DROP DATABASE {database}")).await;
}

/// Stages one event whose routing key and header are the message's own, in Cyrillic, and returns
/// the staging's error; when the body says `rollback`, only after ending its transaction with a
/// `ROLLBACK` it swallows (as MariaDB rolls the transaction back on a deadlock the handler
/// ignored), carrying on whatever the staging gave.
#[derive(Debug)]
struct Relabel;

impl Handler for Relabel {
    type Message = Msg;
    type Output = String;
    type Error = DbErr;

    fn consumer(&self) -> &str {
        CONSUMER
    }
    fn key(&self, msg: &Msg, _: &Metadata) -> Result<MessageKey, KeyError> {
        MessageKey::new(msg.id.as_str())
    }
    fn fingerprint(&self, _: &Msg, _: &Metadata) -> Result<Option<Fingerprint>, FingerprintError> {
        Ok(None)
    }
    async fn handle(&self, cx: &Context<'_>, msg: Msg) -> Result<String, DbErr> {
        let rolls_back = msg.body == "rollback";
        if rolls_back {
            let tx = cx.transaction().expect("transactional");
            let _swallowed = tx.execute_unprepared("ROLLBACK").await;
        }
        let event = OutboxMessage::new("orders", "заказ.принят", b"{}".to_vec())
            .header("order", msg.id.as_str());
        let staged = cx.stage(event).await;
        if rolls_back {
            return Ok(staged.unwrap_or_default());
        }
        Ok(staged?)
    }
}

/// In a batch trusted to leave its transaction whole, a handler that rolls it back makes the next
/// handler's staging fail: that message is not blamed (counted) for it, as it was; the batch runs
/// again, checked, which finds the culprit, and the other message is requeued uncounted with
/// nothing staged. SQLite.
async fn a_trusted_batch_blames_no_handler_for_an_earlier_ones_rollback(backend: Backend) {
    let (_db, inbox, outbox, _effects) = setup(backend).await;
    let item = |id: &str, body: &str| BatchItem {
        key: MessageKey::new(id),
        message: Msg::new(id, body),
        metadata: meta(),
    };
    let results = inbox
        .process_batch_with(
            &Relabel,
            vec![item("a", "rollback"), item("b", "stage")],
            BatchChecks::BeforeCommit,
        )
        .await;
    let culprit = results[0].as_ref().unwrap_err();
    assert!(culprit.counts_as_attempt(), "{culprit:?}");
    let other = results[1].as_ref().unwrap_err();
    assert!(
        matches!(other, Error::BatchRolledBack { .. }) && !other.counts_as_attempt(),
        "{other:?}"
    );
    assert!(pending_ids(&outbox).await.is_empty());
}

/// Statements after a rolled-back transaction commit on their own (a MySQL/MariaDB deadlock or a
/// SQLite error the handler ignored, here a `ROLLBACK` of its own, on every backend): an event
/// staged after the handler's transaction was lost must not be, or the relay would publish an
/// event of an effect that never committed.
async fn nothing_is_staged_once_the_handlers_transaction_is_lost(backend: Backend) {
    let (_db, inbox, outbox, _effects) = setup(backend).await;
    let result = inbox
        .process(&Relabel, Msg::new("lost-1", "rollback"), &meta())
        .await;
    assert!(
        matches!(result, Err(Error::TransactionAborted { .. })),
        "{result:?}"
    );
    assert!(pending_ids(&outbox).await.is_empty(), "an event was staged");
}
