//! Entity mode on each backend: the invoice's primary key (its order id) marks the order as
//! charged, with no inbox record; duplicates, a reused key, a handler that forgets its marker,
//! a failure after the marker, and 64 copies racing in four processes.
//!
//! Run: `cargo test -p idem-tests --test database entity::` with PostgreSQL and MariaDB up (see README).

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use idem_runtime::admin::InboxAdmin;
use idem_runtime::entity::{Created, Marker};
use idem_runtime::fingerprint::Fingerprint;
use idem_runtime::transport::Settle;
use idem_runtime::{Context, Error, Handler, Inbox, InboxBuilder, Metadata, Outcome, idempotent};
use idem_tests::db::insert_effect;
use idem_tests::proxy::behind_proxy;
use idem_tests::{Backend, TestDb, inbox_key, on_each_backend, unique};
use sea_orm::{ActiveValue::Set, ConnectionTrait, DbErr, Schema};
use serde::Serialize;

on_each_backend!(
    a_duplicate_finds_the_entity_and_writes_nothing,
    a_reused_key_with_other_content_is_dead_lettered,
    a_handler_that_creates_no_marker_commits_nothing,
    a_failure_after_the_marker_leaves_nothing_and_the_retry_charges,
    a_second_marker_in_a_run_is_refused,
    sixty_four_copies_in_four_processes_make_one_entity,
);

/// Faults of the database servers'.
mod servers {
    use super::*;
    on_each_backend!([postgres, mysql]:
        a_database_lost_after_the_marker_is_an_outage_and_charges_once,
        a_copy_waits_at_most_the_claim_wait_for_the_first,
    );
}

/// One server's own: PostgreSQL's failed statement aborts the whole transaction; MariaDB's
/// default collation takes keys differing in case for one.
mod server {
    use super::*;
    on_each_backend!([postgres]: a_handler_carrying_on_after_an_aborted_transaction_commits_nothing);
    on_each_backend!([mysql]: keys_a_collation_merges_are_refused_not_taken_for_duplicates);
}

/// The invoices the handler creates: the order id is the primary key, the marker.
mod invoice {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "idem_test_entity_invoices")]
    pub(crate) struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub order_id: String,
        pub customer: String,
        pub amount_cents: i64,
        /// The fingerprint of the order the invoice was made from, in hex.
        pub fingerprint: Option<String>,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub(crate) enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

impl Marker for invoice::Model {
    fn fingerprint(&self) -> Option<Fingerprint> {
        self.fingerprint.as_deref().and_then(Fingerprint::from_hex)
    }
}

#[derive(Debug, Clone, Serialize)]
struct Order {
    order_id: String,
    customer: String,
    amount_cents: i64,
    /// `forget`: the handler creates no invoice; `fail`: it fails after creating it;
    /// `swallow`: a statement fails after it, whose error the handler ignores; `twice`: it
    /// creates the invoice twice; `slow`: it takes 3 s after its writes.
    script: String,
}

impl Order {
    fn new(order_id: &str, amount_cents: i64) -> Self {
        Self {
            order_id: order_id.to_owned(),
            customer: "ada".to_owned(),
            amount_cents,
            script: String::new(),
        }
    }

    fn scripted(mut self, script: &str) -> Self {
        self.script = script.to_owned();
        self
    }
}

/// Charges an order: creates its invoice, then writes one effect row (rolled back with a
/// duplicate's run), and returns the invoice's amount.
#[derive(Debug)]
struct Billing {
    effects: String,
}

impl Billing {
    #[idempotent(key = order.order_id, consumer = "billing.entity", mode = entity, fingerprint = (order.customer, order.amount_cents))]
    async fn invoice(&self, cx: &Context<'_>, order: Order) -> Result<i64, DbErr> {
        let tx = cx.transaction().expect("entity mode runs in a transaction");
        let mut amount = order.amount_cents;
        if order.script != "forget" {
            let invoice = invoice::ActiveModel {
                order_id: Set(order.order_id.clone()),
                customer: Set(order.customer.clone()),
                amount_cents: Set(order.amount_cents),
                fingerprint: Set(cx.fingerprint().map(|f| f.to_hex())),
            };
            let created = cx.create(invoice.clone()).await?;
            if order.script == "twice" {
                let _second = cx.create(invoice).await?;
            }
            if let Created::Existing(stored) = created {
                // Written after the duplicate was found: rolled back with its run.
                amount = stored.amount_cents;
                insert_effect(
                    tx,
                    &self.effects,
                    "billing.entity",
                    &order.order_id,
                    "again",
                )
                .await?;
                return Ok(amount);
            }
        }
        insert_effect(
            tx,
            &self.effects,
            "billing.entity",
            &order.order_id,
            "charged",
        )
        .await?;
        if order.script == "swallow" {
            let failed = tx.execute_unprepared("SELECT * FROM no_such_table").await;
            assert!(failed.is_err(), "the statement fails");
        }
        if order.script == "fail" {
            return Err(DbErr::Custom("the payment provider is down".to_owned()));
        }
        if order.script == "slow" {
            tokio::time::sleep(Duration::from_secs(3)).await;
        }
        Ok(amount)
    }
}

/// The database, an inbox (whose table entity mode leaves alone), the invoices table and the
/// handler.
async fn setup(backend: Backend) -> (TestDb, Inbox, Arc<Billing>) {
    setup_on(TestDb::connect(backend).await, |inbox| inbox).await
}

/// Like [`setup`], on `db`, the inbox configured by `configure`.
async fn setup_on(
    db: TestDb,
    configure: impl FnOnce(InboxBuilder) -> InboxBuilder,
) -> (TestDb, Inbox, Arc<Billing>) {
    let inbox = configure(Inbox::builder(db.db.clone()).table(db.table("inbox")))
        .build()
        .await
        .expect("inbox builds");
    create_invoices(&db.db).await;
    let effects = db.effects_table().await;
    (db, inbox, Arc::new(Billing { effects }))
}

/// Charges `order` in a task of its own.
fn spawn_charge(
    inbox: &Inbox,
    billing: &Arc<Billing>,
    order: Order,
) -> tokio::task::JoinHandle<Result<Outcome<i64>, Error>> {
    let (inbox, handler) = (inbox.clone(), billing.invoice_handler());
    tokio::spawn(async move { charge(&inbox, &handler, order).await })
}

/// Creates the invoices table if it is missing; several tests and processes share it (their
/// order ids are their own). Concurrent creations on PostgreSQL may fail: tried again.
async fn create_invoices(db: &impl ConnectionTrait) {
    let backend = db.get_database_backend();
    let create = Schema::new(backend)
        .create_table_from_entity(invoice::Entity)
        .if_not_exists()
        .to_owned();
    for attempt in 1.. {
        match db.execute(&create).await {
            Ok(_) => return,
            Err(error) if attempt < 5 => {
                eprintln!("creating the invoices table: {error}; trying again");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(error) => panic!("the invoices table: {error}"),
        }
    }
}

async fn charge<H: Handler<Message = Order, Output = i64>>(
    inbox: &Inbox,
    handler: &H,
    order: Order,
) -> Result<Outcome<i64>, Error> {
    inbox.process(handler, order, &Metadata::default()).await
}

fn assert_dead_lettered(error: &Error, code: &str) {
    match error.settle() {
        Settle::DeadLetter(reason) => assert_eq!(reason.code, code),
        other => panic!("{error} settles as {other:?}"),
    }
}

/// Charges `order`, which must settle without an error.
async fn charged<H: Handler<Message = Order, Output = i64>>(
    inbox: &Inbox,
    handler: &H,
    order: Order,
) -> Outcome<i64> {
    charge(inbox, handler, order).await.unwrap()
}

async fn invoices(db: &TestDb, order_id: &str) -> i64 {
    db.count(
        "idem_test_entity_invoices",
        &format!("order_id = '{order_id}'"),
    )
    .await
}

async fn a_duplicate_finds_the_entity_and_writes_nothing(backend: Backend) {
    let (db, inbox, billing) = setup(backend).await;
    let handler = billing.invoice_handler();
    let order_id = unique("order");
    assert_eq!(
        charged(&inbox, &handler, Order::new(&order_id, 1250)).await,
        Outcome::Processed(1250)
    );
    for _ in 0..2 {
        assert_eq!(
            charged(&inbox, &handler, Order::new(&order_id, 1250)).await,
            Outcome::Duplicate(1250)
        );
    }
    assert_eq!(invoices(&db, &order_id).await, 1);
    assert_eq!(db.count(&billing.effects, "1=1").await, 1, "one effect");
    let record = inbox.lookup(&inbox_key("billing.entity", &order_id)).await;
    assert!(record.unwrap().is_none(), "no inbox record in entity mode");
}

async fn a_reused_key_with_other_content_is_dead_lettered(backend: Backend) {
    let (db, inbox, billing) = setup(backend).await;
    let handler = billing.invoice_handler();
    let order_id = unique("order");
    assert_eq!(
        charged(&inbox, &handler, Order::new(&order_id, 1250)).await,
        Outcome::Processed(1250)
    );
    let error = charge(&inbox, &handler, Order::new(&order_id, 9900))
        .await
        .unwrap_err();
    assert!(
        matches!(error, Error::FingerprintMismatch { .. }),
        "{error:?}"
    );
    assert_dead_lettered(&error, "fingerprint-mismatch");
    assert_eq!(invoices(&db, &order_id).await, 1);
    let amount = db
        .count(
            "idem_test_entity_invoices",
            &format!("order_id = '{order_id}' AND amount_cents = 1250"),
        )
        .await;
    assert_eq!(amount, 1, "the stored invoice is untouched");
    assert_eq!(db.count(&billing.effects, "1=1").await, 1);
}

async fn a_handler_that_creates_no_marker_commits_nothing(backend: Backend) {
    let (db, inbox, billing) = setup(backend).await;
    let handler = billing.invoice_handler();
    let order_id = unique("order");
    let order = Order::new(&order_id, 1250).scripted("forget");
    let error = charge(&inbox, &handler, order).await.unwrap_err();
    assert!(matches!(error, Error::MarkerMissing { .. }), "{error:?}");
    assert_dead_lettered(&error, "marker-missing");
    assert_eq!(
        db.count(&billing.effects, "1=1").await,
        0,
        "nothing committed"
    );
}

async fn a_failure_after_the_marker_leaves_nothing_and_the_retry_charges(backend: Backend) {
    let (db, inbox, billing) = setup(backend).await;
    let handler = billing.invoice_handler();
    let order_id = unique("order");
    let failing = Order::new(&order_id, 1250).scripted("fail");
    let error = charge(&inbox, &handler, failing).await.unwrap_err();
    assert_eq!(error.settle(), Settle::Requeue, "{error:?}");
    assert_eq!(invoices(&db, &order_id).await, 0, "the invoice rolled back");
    assert_eq!(db.count(&billing.effects, "1=1").await, 0);
    assert_eq!(
        charged(&inbox, &handler, Order::new(&order_id, 1250)).await,
        Outcome::Processed(1250)
    );
    assert_eq!(invoices(&db, &order_id).await, 1);
    assert_eq!(db.count(&billing.effects, "1=1").await, 1);
}

async fn a_handler_carrying_on_after_an_aborted_transaction_commits_nothing(backend: Backend) {
    let (db, inbox, billing) = setup(backend).await;
    let handler = billing.invoice_handler();
    let order_id = unique("order");
    let swallowing = Order::new(&order_id, 1250).scripted("swallow");
    let error = charge(&inbox, &handler, swallowing).await.unwrap_err();
    assert!(
        matches!(error, Error::TransactionAborted { .. }),
        "{error:?}"
    );
    assert_eq!(error.settle(), Settle::Requeue);
    assert_eq!(invoices(&db, &order_id).await, 0);
    assert_eq!(db.count(&billing.effects, "1=1").await, 0);
}

async fn a_database_lost_after_the_marker_is_an_outage_and_charges_once(backend: Backend) {
    let (db, proxy) = behind_proxy(backend).await;
    let (db, inbox, billing) = setup_on(db, |inbox| inbox).await;
    let order_id = unique("order");
    let run = spawn_charge(
        &inbox,
        &billing,
        Order::new(&order_id, 1250).scripted("slow"),
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    proxy.cut().await;
    let error = run.await.unwrap().unwrap_err();
    assert!(error.is_store_unavailable(), "{error:?}");
    assert!(!error.counts_as_attempt());
    proxy.restore();
    let handler = billing.invoice_handler();
    let mut result = charge(&inbox, &handler, Order::new(&order_id, 1250)).await;
    for _ in 0..20 {
        if result.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        result = charge(&inbox, &handler, Order::new(&order_id, 1250)).await;
    }
    assert_eq!(result.unwrap(), Outcome::Processed(1250));
    assert_eq!(invoices(&db, &order_id).await, 1);
    assert_eq!(db.count(&billing.effects, "1=1").await, 1);
}

async fn a_copy_waits_at_most_the_claim_wait_for_the_first(backend: Backend) {
    let wait = Duration::from_millis(500);
    let db = TestDb::connect(backend).await;
    let (_db, inbox, billing) = setup_on(db, |inbox| inbox.claim_wait(wait)).await;
    let order_id = unique("order");
    // The first copy holds its new invoice for 3 s before its commit.
    let first = spawn_charge(
        &inbox,
        &billing,
        Order::new(&order_id, 1250).scripted("slow"),
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    let handler = billing.invoice_handler();
    let started = std::time::Instant::now();
    let error = charge(&inbox, &handler, Order::new(&order_id, 1250))
        .await
        .unwrap_err();
    let waited = started.elapsed();
    assert!(matches!(error, Error::Contention(_)), "{error:?}");
    assert!(!error.counts_as_attempt());
    // Unbounded, the copy would have waited for the first's commit and found a duplicate.
    // MariaDB's wait is in whole seconds: one at least.
    assert!(waited < Duration::from_millis(2500), "waited {waited:?}");
    assert_eq!(first.await.unwrap().unwrap(), Outcome::Processed(1250));
    let again = charge(&inbox, &handler, Order::new(&order_id, 1250)).await;
    assert_eq!(again.unwrap(), Outcome::Duplicate(1250));
}

async fn a_second_marker_in_a_run_is_refused(backend: Backend) {
    let (db, inbox, billing) = setup(backend).await;
    let handler = billing.invoice_handler();
    let order_id = unique("order");
    let twice = Order::new(&order_id, 1250).scripted("twice");
    let error = charge(&inbox, &handler, twice).await.unwrap_err();
    assert!(matches!(error, Error::MarkerRefused { .. }), "{error:?}");
    assert!(error.to_string().contains("once"), "{error}");
    assert_dead_lettered(&error, "marker-refused");
    assert_eq!(invoices(&db, &order_id).await, 0, "nothing committed");
}

async fn keys_a_collation_merges_are_refused_not_taken_for_duplicates(backend: Backend) {
    let (db, inbox, billing) = setup(backend).await;
    let handler = billing.invoice_handler();
    let order_id = unique("Order");
    let first = charge(&inbox, &handler, Order::new(&order_id, 1250)).await;
    assert_eq!(first.unwrap(), Outcome::Processed(1250));
    // Another order, whose id differs in case only: the column's collation merges them.
    let other = Order::new(&order_id.to_lowercase(), 1250);
    let error = charge(&inbox, &handler, other).await.unwrap_err();
    assert!(error.to_string().contains("collation"), "{error}");
    assert_dead_lettered(&error, "marker-refused");
    assert_eq!(
        db.count(&billing.effects, "1=1").await,
        1,
        "one charge, no duplicate"
    );
}

/// What the child processes are told, through their environment.
const CHILD_URL: &str = "IDEM_ENTITY_CHILD_URL";
const CHILD_BACKEND: &str = "IDEM_ENTITY_CHILD_BACKEND";
const CHILD_INBOX: &str = "IDEM_ENTITY_CHILD_INBOX";
const CHILD_EFFECTS: &str = "IDEM_ENTITY_CHILD_EFFECTS";
const CHILD_ORDER: &str = "IDEM_ENTITY_CHILD_ORDER";
const PROCESSES: usize = 4;
const TASKS_PER_PROCESS: usize = 16;

async fn sixty_four_copies_in_four_processes_make_one_entity(backend: Backend) {
    let (db, inbox, billing) = setup(backend).await;
    let order_id = unique("order");
    let children: Vec<_> = (0..PROCESSES)
        .map(|_| {
            tokio::process::Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    &idem_tests::test_named(module_path!(), "racing_copies_child"),
                    "--ignored",
                    "--nocapture",
                ])
                .env(CHILD_URL, db.url())
                .env(CHILD_BACKEND, format!("{backend:?}"))
                .env(CHILD_INBOX, inbox.table().to_string())
                .env(CHILD_EFFECTS, &billing.effects)
                .env(CHILD_ORDER, &order_id)
                .stdout(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .expect("a child process starts")
        })
        .collect();
    let (mut processed, mut duplicates) = (0, 0);
    for child in children {
        let output = tokio::time::timeout(Duration::from_secs(120), child.wait_with_output())
            .await
            .expect("the child finishes within two minutes")
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "a child failed: {stdout}");
        let line = stdout
            .lines()
            .find_map(|line| line.strip_prefix("outcomes: "))
            .unwrap_or_else(|| panic!("a child reported nothing: {stdout}"));
        let (p, d) = line.split_once(' ').unwrap();
        processed += p.parse::<usize>().unwrap();
        duplicates += d.parse::<usize>().unwrap();
    }
    assert_eq!(processed, 1, "one copy charged");
    assert_eq!(duplicates, PROCESSES * TASKS_PER_PROCESS - 1);
    assert_eq!(invoices(&db, &order_id).await, 1);
    assert_eq!(db.count(&billing.effects, "1=1").await, 1);
}

/// One of the racing processes: 16 tasks process the same order, each until it settles (a
/// requeue, as SQLite's busy database or a MySQL deadlock gives, is delivered again); prints
/// `outcomes: <processed> <duplicates>`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "a child process of sixty_four_copies_in_four_processes_make_one_entity"]
async fn racing_copies_child() {
    let var = |name| std::env::var(name).unwrap_or_else(|_| panic!("{name} is set"));
    let backend = Backend::of_child(&var(CHILD_BACKEND));
    let db = TestDb::connect_url(backend, var(CHILD_URL), 16).await;
    let inbox = Inbox::builder(db.db.clone())
        .table(var(CHILD_INBOX))
        .build()
        .await
        .expect("inbox builds");
    let billing = Arc::new(Billing {
        effects: var(CHILD_EFFECTS),
    });
    let order_id = var(CHILD_ORDER);
    let tasks: Vec<_> = (0..TASKS_PER_PROCESS)
        .map(|_| {
            let (inbox, handler, order) = (
                inbox.clone(),
                billing.invoice_handler(),
                Order::new(&order_id, 1250),
            );
            tokio::spawn(async move {
                loop {
                    match inbox
                        .process(&handler, order.clone(), &Metadata::default())
                        .await
                    {
                        Err(error) if error.settle() == Settle::Requeue => {
                            // Waiting for the first copy is contention, not a failed attempt.
                            assert!(!error.counts_as_attempt(), "{error}");
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                        settled => return settled.expect("a copy settles without an error"),
                    }
                }
            })
        })
        .collect();
    let (mut processed, mut duplicates) = (0, 0);
    for task in tasks {
        match task.await.unwrap() {
            Outcome::Processed(amount) => {
                assert_eq!(amount, 1250);
                processed += 1;
            }
            Outcome::Duplicate(amount) => {
                assert_eq!(amount, 1250);
                duplicates += 1;
            }
        }
    }
    println!("outcomes: {processed} {duplicates}");
}
