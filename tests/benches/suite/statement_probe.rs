//! Statements counted on the same work, cut the same way: one batch of 100 orders (90 fresh,
//! 10 already processed) through idem's default batch, its batch checked after each handler,
//! its slice handler and the hand-written batches, and 10 fresh orders one by one through
//! idem's per-message path and the hand-written one. The rounds' counts
//! (`statement_report.rs`) also depend on how each consumer cut its batches (idem runs two at
//! once, the hand-written code one) and include idem's background work (its cleaner, its
//! telemetry); these count one call each, exactly.

use idem_runtime::transport::{BatchChecks, BatchItem, Processing};
use idem_runtime::{Inbox, MessageKey, Metadata, Outcome};
use idem_tests::TestDb;
use idem_tests::bench::hand::{BusinessInserts, HandInbox, HandMessage, fingerprint};
use idem_tests::bench::{Charge, Order, create_charges};
use serde_json::json;

use crate::Suite;
use crate::args::BackendArg;
use crate::statements::{Counts, StatementCounter};

/// Orders in the probe's batch.
const BATCH: usize = 100;
/// Of which processed before the batch: its duplicates.
const KNOWN: usize = 10;
/// Orders processed one by one.
const ONE_BY_ONE: usize = 10;

/// One comparison: idem's statements and the hand-written code's on the same work, and how
/// many more idem may send.
pub(crate) struct Probed {
    work: &'static str,
    idem: Counts,
    hand: Counts,
    allowed: u64,
}

/// Runs every comparison on `db`, counted by `counter`.
pub(crate) async fn probe(db: &TestDb, counter: &StatementCounter) -> Vec<Probed> {
    let orders: Vec<Order> = (0..BATCH)
        .map(|i| Order {
            id: format!("probe-{i}"),
            amount: i as i64,
        })
        .collect();
    let mut probed = Vec::new();
    for (work, checks) in [
        ("batch of 100, 10 known (default)", BatchChecks::default()),
        (
            "batch, checked after each handler",
            BatchChecks::EachMessage,
        ),
    ] {
        let (inbox, charge, hand) = sides(db).await;
        warm(&inbox, &charge, &hand, db, &orders[..KNOWN]).await;
        let before = counter.start(db).await;
        let results = inbox
            .process_batch_with(&charge, items(&orders), checks)
            .await;
        let idem = counter.since(db, before).await;
        assert_processed(&results);
        let hand = count_hand(db, counter, &hand, &orders, BusinessInserts::PerMessage).await;
        let allowed = if checks == BatchChecks::EachMessage {
            // One round trip per handler, by design.
            u64::MAX
        } else {
            0
        };
        probed.push(Probed {
            work,
            idem,
            hand,
            allowed,
        });
    }
    let (inbox, charge, hand) = sides(db).await;
    warm(&inbox, &charge, &hand, db, &orders[..KNOWN]).await;
    let before = counter.start(db).await;
    let results = inbox.process_slices(&charge, items(&orders)).await;
    let idem = counter.since(db, before).await;
    assert_processed(&results);
    let hand = count_hand(db, counter, &hand, &orders, BusinessInserts::MultiRow).await;
    probed.push(Probed {
        work: "slice of 100, 10 known / hand multi-row",
        idem,
        hand,
        allowed: 1,
    });
    let (inbox, charge, hand) = sides(db).await;
    let before = counter.start(db).await;
    for order in &orders[..ONE_BY_ONE] {
        let processed = inbox
            .process(&charge, order.clone(), &Metadata::default())
            .await;
        assert!(
            matches!(processed, Ok(Outcome::Processed(_))),
            "{processed:?}"
        );
    }
    let idem = counter.since(db, before).await;
    let before = counter.start(db).await;
    for order in &orders[..ONE_BY_ONE] {
        hand.process(&db.db, hand_message(order))
            .await
            .expect("processed by hand");
    }
    let hand = counter.since(db, before).await;
    probed.push(Probed {
        work: "10 orders one by one",
        idem,
        hand,
        allowed: 0,
    });
    probed
}

/// A fresh idem inbox with its handler, and a fresh hand-written inbox, each with its own
/// business table.
async fn sides(db: &TestDb) -> (Inbox, Charge, HandInbox) {
    let inbox = Inbox::builder(db.db.clone())
        .table(db.table("probe_inbox"))
        .build()
        .await
        .expect("inbox");
    let charge = Charge {
        table: create_charges(db).await,
        key_from_message_id: false,
    };
    let hand = HandInbox::create(db, &create_charges(db).await).await;
    (inbox, charge, hand)
}

/// Processes `known` on both sides, uncounted: the batch's duplicates.
async fn warm(inbox: &Inbox, charge: &Charge, hand: &HandInbox, db: &TestDb, known: &[Order]) {
    assert_processed(&inbox.process_batch(charge, items(known)).await);
    let messages: Vec<HandMessage> = known.iter().map(hand_message).collect();
    (hand.process_batch(&db.db, &messages, BusinessInserts::PerMessage))
        .await
        .expect("processed by hand");
}

async fn count_hand(
    db: &TestDb,
    counter: &StatementCounter,
    hand: &HandInbox,
    orders: &[Order],
    business: BusinessInserts,
) -> Counts {
    let messages: Vec<HandMessage> = orders.iter().map(hand_message).collect();
    let before = counter.start(db).await;
    (hand.process_batch(&db.db, &messages, business))
        .await
        .expect("processed by hand");
    counter.since(db, before).await
}

fn items(orders: &[Order]) -> Vec<BatchItem<Order>> {
    orders
        .iter()
        .map(|order| BatchItem {
            key: MessageKey::new(order.id.as_str()),
            message: order.clone(),
            metadata: Metadata::default(),
        })
        .collect()
}

fn hand_message(order: &Order) -> HandMessage {
    let payload = serde_json::to_vec(order).expect("an order");
    HandMessage {
        key: order.id.clone(),
        fingerprint: fingerprint(&payload),
        order: order.clone(),
    }
}

fn assert_processed<T: std::fmt::Debug>(results: &[idem_runtime::Result<Outcome<T>>]) {
    for result in results {
        assert!(result.is_ok(), "{result:?}");
    }
}

/// Prints each backend's comparisons: statements (and round trips) of idem and of the
/// hand-written code on the same work, and whether idem sends no more than allowed.
pub(crate) fn print_probes(suite: &Suite, probes: &[(BackendArg, &str, Vec<Probed>)]) {
    if !suite.args.json {
        println!(
            "\nStatements on the same work, each side one call (idem vs hand-written; round \
             trips where counted; BEGIN and COMMIT left out where sqlx's log counts):"
        );
    }
    for (backend, source, probed) in probes {
        if !suite.args.json {
            println!("  {}: {source}", backend.name());
        }
        for p in probed {
            let met = p.idem.statements <= p.hand.statements.saturating_add(p.allowed);
            let verdict = match (p.allowed, met) {
                (u64::MAX, _) => "by design".to_owned(),
                (0, true) => "equal or fewer: met".to_owned(),
                (allowed, true) => format!("at most hand + {allowed}: met"),
                (_, false) => "NOT MET".to_owned(),
            };
            if suite.args.json {
                let line = json!({
                    "bench": "suite-statement-probe",
                    "backend": backend.name(),
                    "work": p.work,
                    "idem_statements": p.idem.statements,
                    "hand_statements": p.hand.statements,
                    "idem_round_trips": p.idem.round_trips,
                    "hand_round_trips": p.hand.round_trips,
                    "allowed_more": (p.allowed != u64::MAX).then_some(p.allowed),
                    "met": met,
                });
                println!("{line}");
            } else {
                let trips = |c: Counts| c.round_trips.map_or("-".to_owned(), |r| r.to_string());
                println!(
                    "{:<9} {:<42} {:>5} vs {:>5} (round trips {} vs {})  {verdict}",
                    backend.name(),
                    p.work,
                    p.idem.statements,
                    p.hand.statements,
                    trips(p.idem),
                    trips(p.hand),
                );
            }
        }
    }
}
