//! A handler crate that names only `idem`: the attribute's generated code reaches the runtime
//! through it, and a message processed twice has one effect.

use idem::sea_orm::{ConnectionTrait, Database, DatabaseTransaction, DbErr, Statement};
use idem::{Inbox, Metadata, Outcome, idempotent};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct OrderPlaced {
    id: String,
    amount: i64,
}

#[idempotent(key = order.id, consumer = "billing.charge")]
async fn charge(tx: &DatabaseTransaction, order: OrderPlaced) -> Result<i64, DbErr> {
    tx.execute_unprepared(&format!("INSERT INTO charges VALUES ('{}')", order.id))
        .await?;
    Ok(order.amount)
}

struct Mailer;

impl Mailer {
    #[idempotent(key = mail.id, consumer = "mail.send")]
    async fn send(&self, mail: OrderPlaced) -> Result<u32, std::io::Error> {
        Ok(mail.amount as u32)
    }
}

#[tokio::test]
async fn a_crate_that_depends_on_idem_alone_processes_each_message_once() {
    let db = Database::connect("sqlite::memory:").await.unwrap();
    db.execute_unprepared("CREATE TABLE charges (order_id TEXT)")
        .await
        .unwrap();
    let inbox = Inbox::builder(db.clone()).build().await.unwrap();
    let order = || OrderPlaced {
        id: "o-1".into(),
        amount: 42,
    };
    let meta = Metadata::default();

    let first = inbox
        .process(&charge_handler(), order(), &meta)
        .await
        .unwrap();
    let again = inbox
        .process(&charge_handler(), order(), &meta)
        .await
        .unwrap();
    assert_eq!(
        (first, again),
        (Outcome::Processed(42), Outcome::Duplicate(42))
    );

    let mailer = std::sync::Arc::new(Mailer);
    let sent = inbox
        .process(&mailer.send_handler(), order(), &meta)
        .await
        .unwrap();
    assert_eq!(sent, Outcome::Processed(42));

    let charges = db
        .query_one_raw(Statement::from_string(
            db.get_database_backend(),
            "SELECT COUNT(*) FROM charges",
        ))
        .await
        .unwrap()
        .unwrap()
        .try_get_by_index::<i64>(0)
        .unwrap();
    assert_eq!(charges, 1);
}

/// The features reach the adapters: RabbitMQ's consumer takes the same handler.
#[allow(dead_code)]
fn bound_to_a_queue(inbox: Inbox) -> idem::rabbitmq::ConsumerBuilder {
    idem::rabbitmq::Consumer::builder("amqp://127.0.0.1:5672/%2f", inbox).bind(
        idem::rabbitmq::QueueTopology::quorum("billing.orders"),
        charge_handler(),
    )
}
