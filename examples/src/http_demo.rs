//! The orders service's HTTP demo (`orders --http ADDR --demo N`): a billing service is started
//! as a process of its own, then N orders are placed over HTTP by clients that retry as real
//! ones do: concurrently, after giving up on an answer, after a 409 or a 503. Each order must
//! end as one order row, one `OrderPlaced` published, one invoice and one notification; the
//! report counts them and the run fails if any is off.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::header::AUTHORIZATION;
use idem_http::Principal;
use idem_runtime::admin::ConsumerName;
use idem_runtime::admin::InboxKey;
use idem_runtime::outbox::Outbox;
use idem_runtime::outbox::derived_id;
use idem_runtime::sea_orm::{ConnectionTrait, DatabaseConnection, Statement};
use serde::Serialize;
use tokio::sync::Mutex;

use crate::demo::{BoxError, WAIT};
use crate::http_client::{self, Answer};
use crate::orders::OrderPlaced;
use crate::stub::Stub;
use crate::{billing, notifications, placing};

/// How many requests place each order at once, besides the one its client gives up on.
pub const CONCURRENT_COPIES: usize = 3;

/// What a demo run watches.
#[derive(Debug, Clone, Copy)]
pub struct Watched<'a> {
    /// The orders service's address.
    pub addr: SocketAddr,
    /// Its outbox, whose table tells which events were published.
    pub outbox: &'a Outbox,
    /// Its database, with the orders.
    pub orders_db: &'a DatabaseConnection,
    /// The billing service's database, with the invoices.
    pub billing_db: &'a DatabaseConnection,
    /// The provider the billing process's notifications call.
    pub stub: &'a Stub,
}

/// What the clients got back, over every order.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Answers {
    /// Requests sent, the given-up ones included.
    pub requests: u64,
    /// Requests whose answer the client gave up waiting for (the connection closed under it).
    pub gave_up: u64,
    /// 201 answers that ran the order.
    pub created: u64,
    /// 201 answers replaying the stored one.
    pub replayed: u64,
    /// 409 answers: the order was being placed by another request with its key.
    pub conflicts: u64,
    /// 503 answers: nothing stored, retried.
    pub unavailable: u64,
    /// Any other answer, or a failed connection (retried).
    pub other: u64,
    /// 201 answers whose body was not the order placed.
    pub wrong_body: u64,
}

/// A run's report.
#[derive(Debug, Serialize)]
pub struct Report {
    /// The run's id, the prefix of its order ids.
    pub run: String,
    /// Orders placed, one key each.
    pub orders: u64,
    /// What the clients got back.
    pub answers: Answers,
    /// Rows in the orders table for the run.
    pub orders_placed: i64,
    /// `OrderPlaced` events the relay published, by the ids derived from the keys.
    pub events_published: u64,
    /// Invoices billing wrote for the run.
    pub invoices: i64,
    /// Orders notified (the provider saw their key).
    pub notified: u64,
    /// Notification calls, retries included (the provider's own idempotency keeps them one).
    pub notification_calls: u64,
    /// How long the run took, in milliseconds.
    pub elapsed_ms: u64,
}

/// Places `count` orders through `watched.addr`, waits until each went through billing and
/// notifications, prints the report (as JSON with `json`) and checks it.
///
/// # Errors
///
/// A database failed, the run did not finish within [`WAIT`], or an order was placed, published,
/// invoiced or notified other than once.
pub async fn run(watched: Watched<'_>, count: usize, json: bool) -> Result<(), BoxError> {
    let begun = Instant::now();
    let run = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    let orders: Vec<(String, OrderPlaced)> = (0..count)
        .map(|i| {
            let order = OrderPlaced {
                order_id: format!("{run}-{i:05}"),
                customer: format!("customer-{}", i % 7),
                amount_cents: 1_000 + i as i64,
            };
            (uuid::Uuid::new_v4().to_string(), order)
        })
        .collect();
    let answers = Arc::new(Mutex::new(Answers::default()));
    let mut clients = Vec::new();
    for (key, order) in &orders {
        let (key, order, answers) = (key.clone(), order.clone(), Arc::clone(&answers));
        let addr = watched.addr;
        clients.push(tokio::spawn(async move {
            place(addr, &key, &order, &answers).await
        }));
    }
    for client in clients {
        client.await??;
    }
    let event_ids = orders
        .iter()
        .map(|(key, order)| event_id(key, &order.customer))
        .collect::<Result<Vec<_>, _>>()?;
    let notification_keys: Vec<String> = (orders.iter())
        .filter_map(|(_, order)| notifications::idempotency_key(&order.order_id))
        .collect();
    let report = loop {
        let report = Report {
            run: run.clone(),
            orders: count as u64,
            answers: answers.lock().await.clone(),
            orders_placed: count_orders(watched.orders_db, &run).await?,
            events_published: billing::count_events_sent(watched.outbox, &event_ids).await?,
            invoices: billing::count_invoices(watched.billing_db, &run).await?,
            notified: watched.stub.calls_with(&notification_keys).distinct_keys,
            notification_calls: watched.stub.calls_with(&notification_keys).calls,
            elapsed_ms: begun.elapsed().as_millis() as u64,
        };
        if report.is_through() || begun.elapsed() > WAIT {
            break report;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    if json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        report.print();
    }
    report.check()
}

/// Places `order` with `key` as a client that retries would: a first request it gives up on
/// at once, then [`CONCURRENT_COPIES`] at the same time, each retried until it gets a 201.
async fn place(
    addr: SocketAddr,
    key: &str,
    order: &OrderPlaced,
    answers: &Mutex<Answers>,
) -> Result<(), BoxError> {
    let body = serde_json::to_vec(order)?;
    // The client's timeout runs out before the answer: the connection closes under the request.
    let client = (key, order.customer.as_str());
    let given_up = http_client::post(addr, "/orders", client, &body, Duration::ZERO).await;
    {
        let mut answers = answers.lock().await;
        answers.requests += 1;
        match given_up {
            Ok(None) => answers.gave_up += 1,
            Ok(Some(answer)) => answers.count(&answer, order),
            Err(_) => answers.other += 1,
        }
    }
    let copies = (0..CONCURRENT_COPIES).map(|_| until_created(addr, key, &body, order, answers));
    for placed in futures_util::future::join_all(copies).await {
        placed?;
    }
    Ok(())
}

/// Sends the order until it gets a 201, waiting a little after each 409, 503 or failure.
async fn until_created(
    addr: SocketAddr,
    key: &str,
    body: &[u8],
    order: &OrderPlaced,
    answers: &Mutex<Answers>,
) -> Result<(), BoxError> {
    let deadline = Instant::now() + WAIT;
    loop {
        let client = (key, order.customer.as_str());
        let sent = http_client::post(addr, "/orders", client, body, Duration::from_secs(30)).await;
        let mut counted = answers.lock().await;
        counted.requests += 1;
        match sent {
            Ok(Some(answer)) => {
                counted.count(&answer, order);
                if answer.status == 201 {
                    return Ok(());
                }
            }
            Ok(None) => counted.gave_up += 1,
            Err(_) => counted.other += 1,
        }
        drop(counted);
        if Instant::now() > deadline {
            return Err(format!("order {} was never created", order.order_id).into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

impl Answers {
    fn count(&mut self, answer: &Answer, order: &OrderPlaced) {
        match answer.status {
            201 => {
                if answer.replayed {
                    self.replayed += 1;
                } else {
                    self.created += 1;
                }
                let placed: Option<OrderPlaced> = serde_json::from_str(&answer.body).ok();
                if placed.as_ref() != Some(order) {
                    self.wrong_body += 1;
                }
            }
            409 => self.conflicts += 1,
            503 => self.unavailable += 1,
            _ => self.other += 1,
        }
    }
}

/// The id of the `OrderPlaced` event the request with `key` of the client whose token is
/// `token` stages.
fn event_id(key: &str, token: &str) -> Result<String, BoxError> {
    let request = axum::http::Request::post("/orders")
        .header(AUTHORIZATION, http_client::bearer(token))
        .body(())?;
    let principal = Principal::authorization().of(&request.into_parts().0);
    let origin = InboxKey {
        consumer: ConsumerName::new(placing::CONSUMER)?,
        message_key: idem_http::message_key(principal.as_deref(), key)?,
    };
    Ok(derived_id(&origin, 0))
}

async fn count_orders(db: &DatabaseConnection, run: &str) -> Result<i64, BoxError> {
    let sql = format!(
        "SELECT COUNT(*) FROM {} WHERE order_id LIKE '{run}-%'",
        placing::TABLE
    );
    let row = db
        .query_one_raw(Statement::from_string(db.get_database_backend(), sql))
        .await?;
    Ok(row.map_or(Ok(0), |row| row.try_get_by_index::<i64>(0))?)
}

impl Report {
    /// Every order went through every hop.
    fn is_through(&self) -> bool {
        let orders = self.orders as i64;
        self.orders_placed >= orders
            && self.events_published >= self.orders
            && self.invoices >= orders
            && self.notified >= self.orders
    }

    fn print(&self) {
        let a = &self.answers;
        println!(
            "orders demo {}: {} orders over {} requests ({} created, {} replayed, {} conflicts, \
             {} unavailable, {} given up, {} other): {} placed, {} events published, {} invoices, \
             {} notified ({} calls) in {} ms",
            self.run,
            self.orders,
            a.requests,
            a.created,
            a.replayed,
            a.conflicts,
            a.unavailable,
            a.gave_up,
            a.other,
            self.orders_placed,
            self.events_published,
            self.invoices,
            self.notified,
            self.notification_calls,
            self.elapsed_ms
        );
    }

    /// Each order once at every hop, each client answered with its order.
    fn check(&self) -> Result<(), BoxError> {
        let orders = self.orders as i64;
        let mut off: HashMap<&str, String> = HashMap::new();
        if self.orders_placed != orders {
            off.insert("orders placed", self.orders_placed.to_string());
        }
        if self.events_published != self.orders {
            off.insert("events published", self.events_published.to_string());
        }
        if self.invoices != orders {
            off.insert("invoices", self.invoices.to_string());
        }
        if self.notified != self.orders {
            off.insert("orders notified", self.notified.to_string());
        }
        if self.answers.created > self.orders {
            off.insert(
                "orders created by a request",
                self.answers.created.to_string(),
            );
        }
        if self.answers.wrong_body > 0 {
            off.insert(
                "answers with another order",
                self.answers.wrong_body.to_string(),
            );
        }
        if off.is_empty() {
            Ok(())
        } else {
            Err(format!("expected {orders} of each, got {off:?}").into())
        }
    }
}
