//! The kit's own tests, shared by `sqlite.rs` and `servers.rs`: handlers with planted
//! mistakes, each of which the kit must report with a seed that replays the report, and
//! correct handlers, which it must pass.

#![allow(dead_code, unreachable_pub)]

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use idem_runtime::fingerprint::{Fingerprint, FingerprintError};
use idem_runtime::sea_orm::sea_query::{Alias, Query};
use idem_runtime::sea_orm::{ConnectionTrait, DbErr};
use idem_runtime::{Context, Handler, KeyError, MessageKey, Metadata, Mode, OutboxMessage};
use idem_testkit::{DELIVERY_COUNT_HEADER, Downstream, Effects, FaultKit, Report};
use idem_tests::{Backend, TestDb};
use serde::{Deserialize, Serialize};

/// An order to charge.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Order {
    pub id: String,
    pub amount_cents: i64,
}

/// Message `i` of every run.
pub fn order(index: usize) -> Order {
    Order {
        id: format!("o-{index}"),
        amount_cents: 1_000 + index as i64,
    }
}

/// What billing announces once it charged an order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Charged {
    pub order_id: String,
}

/// The exchange billing's `Charged` events go to.
pub const EVENTS: &str = "billing.events";

/// A stub of a payment provider: it counts the charges of each order, and has no idea of
/// duplicates.
#[derive(Debug, Default)]
pub struct PaymentProvider {
    charges: Mutex<HashMap<String, u64>>,
}

impl PaymentProvider {
    pub fn charge(&self, order_id: &str) {
        *self
            .charges
            .lock()
            .unwrap()
            .entry(order_id.to_owned())
            .or_default() += 1;
    }

    pub fn charges_of(&self, order_id: &str) -> u64 {
        self.charges
            .lock()
            .unwrap()
            .get(order_id)
            .copied()
            .unwrap_or(0)
    }
}

/// A stub of a notification provider that deduplicates by `Idempotency-Key`: a customer is
/// notified once per distinct key.
#[derive(Debug, Default)]
pub struct NotificationProvider {
    keys: Mutex<HashMap<String, BTreeSet<String>>>,
    calls: AtomicU64,
}

impl NotificationProvider {
    pub fn notify(&self, idempotency_key: String, order_id: &str) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let mut keys = self.keys.lock().unwrap();
        keys.entry(order_id.to_owned())
            .or_default()
            .insert(idempotency_key);
    }

    /// The notifications `order_id`'s customer received.
    pub fn notifications_of(&self, order_id: &str) -> u64 {
        let keys = self.keys.lock().unwrap();
        keys.get(order_id).map_or(0, |keys| keys.len() as u64)
    }

    /// A key of the caller's own, different on every call: what a handler that does not pass
    /// its downstream key sends.
    pub fn fresh_key(&self) -> String {
        format!("call-{}", self.calls.load(Ordering::Relaxed))
    }
}

/// The mistakes planted in [`Charge`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mistake {
    /// None: the handler writes through its transaction only.
    None,
    /// It calls the payment provider inside its transaction.
    ExternalCallInTransaction,
    /// Its key includes the delivery count, which a redelivery changes.
    KeyFromDeliveryCount,
    /// It commits its transaction itself, before idem does, and begins another.
    CommitsItsOwnTransaction,
}

/// Billing's charge, transactional: an invoice row per order, through the transaction; with
/// `stage`, a `Charged` event staged in the outbox too.
#[derive(Debug)]
pub struct Charge {
    pub table: String,
    pub provider: Arc<PaymentProvider>,
    pub mistake: Mistake,
    pub stage: bool,
}

impl Handler for Charge {
    type Message = Order;
    type Output = i64;
    type Error = DbErr;

    fn consumer(&self) -> &str {
        "billing.charge"
    }

    fn key(&self, order: &Order, metadata: &Metadata) -> Result<MessageKey, KeyError> {
        if self.mistake == Mistake::KeyFromDeliveryCount {
            let count = metadata.header(DELIVERY_COUNT_HEADER).unwrap_or("0");
            return MessageKey::new(format!("{}/{count}", order.id));
        }
        MessageKey::new(order.id.as_str())
    }

    fn fingerprint(
        &self,
        order: &Order,
        metadata: &Metadata,
    ) -> Result<Option<Fingerprint>, FingerprintError> {
        metadata.content_fingerprint(order).map(Some)
    }

    async fn handle(&self, cx: &Context<'_>, order: Order) -> Result<i64, DbErr> {
        let tx = cx.transaction().expect("a transactional handler");
        if self.mistake == Mistake::ExternalCallInTransaction {
            self.provider.charge(&order.id);
        }
        let insert = Query::insert()
            .into_table(Alias::new(self.table.as_str()))
            .columns(["order_id", "amount_cents"])
            .values_panic([order.id.clone().into(), order.amount_cents.into()])
            .to_owned();
        tx.execute(&insert).await?;
        if self.stage {
            let event = Charged {
                order_id: order.id.clone(),
            };
            let message = OutboxMessage::json(EVENTS, "order.charged", &event)
                .map_err(|error| DbErr::Custom(error.to_string()))?;
            cx.stage(message)
                .await
                .map_err(|error| DbErr::Custom(error.to_string()))?;
        }
        if self.mistake == Mistake::CommitsItsOwnTransaction {
            // What it wrote so far is committed; the rest runs in a transaction of its own.
            tx.execute_unprepared("COMMIT").await?;
            tx.execute_unprepared("BEGIN").await?;
        }
        Ok(order.amount_cents)
    }
}

/// Notifications, two-phase: calls the notification provider once per `Charged` event, with
/// its downstream key as the provider's idempotency key, or (`passes_key` false: the planted
/// mistake) with a key of its own each time.
#[derive(Debug)]
pub struct Notify {
    pub provider: Arc<NotificationProvider>,
    pub passes_key: bool,
}

impl Handler for Notify {
    type Message = Charged;
    type Output = ();
    type Error = std::io::Error;

    fn consumer(&self) -> &str {
        "notifications.charged"
    }

    fn key(&self, event: &Charged, _: &Metadata) -> Result<MessageKey, KeyError> {
        MessageKey::new(event.order_id.as_str())
    }

    fn fingerprint(
        &self,
        event: &Charged,
        metadata: &Metadata,
    ) -> Result<Option<Fingerprint>, FingerprintError> {
        metadata.content_fingerprint(event).map(Some)
    }

    fn mode(&self) -> Mode {
        Mode::two_phase()
    }

    async fn handle(&self, cx: &Context<'_>, event: Charged) -> Result<(), std::io::Error> {
        let key = if self.passes_key {
            cx.downstream_key()
        } else {
            self.provider.fresh_key()
        };
        self.provider.notify(key, &event.order_id);
        Ok(())
    }
}

/// Shipping, declared naturally idempotent (no record kept) when it is not: it inserts a
/// shipment per `Charged` event, however often the event comes.
#[derive(Debug)]
pub struct Ship {
    pub table: String,
}

impl Handler for Ship {
    type Message = Charged;
    type Output = ();
    type Error = DbErr;

    fn consumer(&self) -> &str {
        "shipping.charged"
    }

    fn key(&self, event: &Charged, _: &Metadata) -> Result<MessageKey, KeyError> {
        MessageKey::new(event.order_id.as_str())
    }

    fn fingerprint(
        &self,
        _: &Charged,
        _: &Metadata,
    ) -> Result<Option<Fingerprint>, FingerprintError> {
        Ok(None)
    }

    fn mode(&self) -> Mode {
        Mode::Natural
    }

    async fn handle(&self, cx: &Context<'_>, event: Charged) -> Result<(), DbErr> {
        let insert = Query::insert()
            .into_table(Alias::new(self.table.as_str()))
            .columns(["order_id", "amount_cents"])
            .values_panic([event.order_id.into(), 0.into()])
            .to_owned();
        cx.transaction()
            .expect("a transaction")
            .execute(&insert)
            .await?;
        Ok(())
    }
}

/// A run of billing's charge (correct, staging `Charged`) with shipping downstream.
pub async fn charge_and_ship_run(db: &TestDb, seed: u64) -> Report {
    let charges = charges_table(db).await;
    let shipments = charges_table(db).await;
    let handler = Charge {
        table: charges.clone(),
        provider: Arc::default(),
        mistake: Mistake::None,
        stage: true,
    };
    let shipped = Effects::rows(shipments.clone(), "order_id", |event: &Charged| {
        event.order_id.clone()
    });
    let effects = Effects::rows(charges, "order_id", |order: &Order| order.id.clone());
    kit(db, effects, order, seed)
        .downstream(Downstream::new(EVENTS, Ship { table: shipments }, shipped))
        .run(&handler)
        .await
        .unwrap()
}

/// A fresh table of charges on `db`.
pub async fn charges_table(db: &TestDb) -> String {
    let table = db.table("charges");
    db.exec(&format!(
        "CREATE TABLE {table} (order_id VARCHAR(64) NOT NULL, amount_cents BIGINT NOT NULL)"
    ))
    .await;
    table
}

/// A kit on `db`'s fresh tables, with the seed `seed`.
fn kit<M: 'static>(
    db: &TestDb,
    effects: Effects<M>,
    generate: fn(usize) -> M,
    seed: u64,
) -> FaultKit<M> {
    FaultKit::new(db.db.clone(), generate, effects)
        .tables(db.table("kit_inbox"), db.table("kit_outbox"))
        .seed(seed)
}

/// A run of billing's charge with `mistake` planted, on fresh tables: its effects are the
/// provider's charges when the mistake is the provider's, the invoice rows otherwise.
pub async fn charge_run(db: &TestDb, mistake: Mistake, seed: u64) -> Report {
    charge_run_with(db, mistake, seed, |kit| kit).await
}

/// [`charge_run`], the kit set by `set`.
pub async fn charge_run_with(
    db: &TestDb,
    mistake: Mistake,
    seed: u64,
    set: impl FnOnce(FaultKit<Order>) -> FaultKit<Order>,
) -> Report {
    let table = charges_table(db).await;
    let provider = Arc::new(PaymentProvider::default());
    let effects = match mistake {
        Mistake::ExternalCallInTransaction => {
            let provider = Arc::clone(&provider);
            Effects::counted(move |order: &Order| provider.charges_of(&order.id))
        }
        _ => Effects::rows(table.clone(), "order_id", |order: &Order| order.id.clone()),
    };
    let handler = Charge {
        table,
        provider,
        mistake,
        stage: false,
    };
    set(kit(db, effects, order, seed))
        .run(&handler)
        .await
        .unwrap()
}

/// A run of billing's charge (correct, staging `Charged`) with notifications downstream,
/// passing its key or not; and the notification provider.
pub async fn charge_and_notify_run(
    db: &TestDb,
    passes_key: bool,
    seed: u64,
) -> (Report, Arc<NotificationProvider>) {
    let table = charges_table(db).await;
    let handler = Charge {
        table: table.clone(),
        provider: Arc::default(),
        mistake: Mistake::None,
        stage: true,
    };
    let provider = Arc::new(NotificationProvider::default());
    let notified = {
        let provider = Arc::clone(&provider);
        Effects::counted(move |event: &Charged| provider.notifications_of(&event.order_id))
    };
    let notify = Notify {
        provider: Arc::clone(&provider),
        passes_key,
    };
    let effects = Effects::rows(table, "order_id", |order: &Order| order.id.clone());
    let report = kit(db, effects, order, seed)
        .downstream(Downstream::new(EVENTS, notify, notified))
        .run(&handler)
        .await
        .unwrap();
    (report, provider)
}

/// Asserts that `report` found the planted mistake: some message with more than one effect,
/// none with fewer, each finding and the seed in its text.
pub fn assert_charged_twice(report: &Report) {
    // What a developer sees: `--nocapture` shows it.
    println!("{report}");
    assert!(!report.findings.is_empty(), "nothing found:\n{report}");
    assert!(
        report.findings.iter().all(|finding| finding.effects > 1),
        "{report}"
    );
    let text = report.to_string();
    assert!(text.contains(&format!("(seed {})", report.seed)), "{text}");
    for finding in &report.findings {
        assert!(text.contains(&finding.to_string()), "{text}");
    }
    let panicked = std::panic::catch_unwind(|| report.assert_effectively_once())
        .expect_err("a report with findings fails the assertion");
    let message = panicked
        .downcast_ref::<String>()
        .expect("a formatted panic");
    assert!(message.contains("expected 1"), "{message}");
}

/// Asserts that `replay` (the same seed, fresh tables) is `first` again: the same schedule and
/// the same findings.
pub fn assert_replayed(first: &Report, replay: &Report) {
    assert_eq!(first.seed, replay.seed);
    assert_eq!(first.schedule, replay.schedule);
    assert_eq!(
        first.findings, replay.findings,
        "first:\n{first}\nreplay:\n{replay}"
    );
}

/// The seed the planted mistakes are run with. Every schedule crashes after the handler on a
/// message's first delivery, so any seed finds the first three mistakes.
pub const SEED: u64 = 20_261_204;

pub async fn an_external_call_in_a_transactional_handler_charges_twice(backend: Backend) {
    let db = TestDb::connect(backend).await;
    let first = charge_run(&db, Mistake::ExternalCallInTransaction, SEED).await;
    assert_charged_twice(&first);
    let replay = charge_run(&db, Mistake::ExternalCallInTransaction, SEED).await;
    assert_replayed(&first, &replay);
    // The same handler without the call, on the same schedule: one effect each.
    charge_run(&db, Mistake::None, SEED)
        .await
        .assert_effectively_once();
}

pub async fn a_key_from_the_delivery_count_processes_a_redelivery_again(backend: Backend) {
    let db = TestDb::connect(backend).await;
    let first = charge_run(&db, Mistake::KeyFromDeliveryCount, SEED).await;
    assert_charged_twice(&first);
    // Each finding names the key of the first delivery, which carries no count.
    for finding in &first.findings {
        assert!(finding.key.ends_with("/0\""), "{finding}");
    }
    let replay = charge_run(&db, Mistake::KeyFromDeliveryCount, SEED).await;
    assert_replayed(&first, &replay);
}

pub async fn a_handler_committing_its_own_transaction_leaves_its_effects_twice(backend: Backend) {
    let db = TestDb::connect(backend).await;
    assert_charged_twice(&charge_run(&db, Mistake::CommitsItsOwnTransaction, SEED).await);
    // Copies racing a record such a handler committed half-way each take it over, as many as
    // the database lets through: how many depends on their interleaving, not on the seed. A
    // schedule of the crashes at each boundary alone, without random copies, replays exactly.
    let crashes_only = |kit: FaultKit<Order>| kit.steps(0);
    let first = charge_run_with(&db, Mistake::CommitsItsOwnTransaction, SEED, crashes_only).await;
    assert_charged_twice(&first);
    let replay = charge_run_with(&db, Mistake::CommitsItsOwnTransaction, SEED, crashes_only).await;
    assert_replayed(&first, &replay);
}

pub async fn a_two_phase_call_without_its_downstream_key_notifies_twice(backend: Backend) {
    let db = TestDb::connect(backend).await;
    let (first, _) = charge_and_notify_run(&db, false, SEED).await;
    assert_charged_twice(&first);
    assert!(
        (first.findings.iter()).all(|finding| finding.consumer == "notifications.charged"),
        "{first}"
    );
    let (replay, _) = charge_and_notify_run(&db, false, SEED).await;
    assert_replayed(&first, &replay);
}

pub async fn a_downstream_handler_keeping_no_record_ships_a_republished_event_twice(
    backend: Backend,
) {
    let db = TestDb::connect(backend).await;
    let first = charge_and_ship_run(&db, SEED).await;
    assert_charged_twice(&first);
    assert!(
        (first.findings.iter()).all(|finding| finding.consumer == "shipping.charged"),
        "{first}"
    );
    let replay = charge_and_ship_run(&db, SEED).await;
    assert_replayed(&first, &replay);
}

pub async fn correct_handlers_have_one_effect_per_message_on_many_seeds(backend: Backend) {
    let db = TestDb::connect(backend).await;
    for seed in [SEED, 1, 2, 3] {
        charge_run(&db, Mistake::None, seed)
            .await
            .assert_effectively_once();
        let (report, notifications) = charge_and_notify_run(&db, true, seed).await;
        report.assert_effectively_once();
        // Every order's event went out and was notified once: the downstream path was taken.
        for index in 0..6 {
            let order_id = order(index).id;
            assert_eq!(notifications.notifications_of(&order_id), 1, "{report}");
        }
    }
}
