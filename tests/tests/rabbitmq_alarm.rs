//! A broker resource alarm while a message is dead-lettered: the broker blocks connections that
//! publish, so the consumer publishes its copies on a connection of their own, and the acks of the
//! messages it processes meanwhile still reach the broker.
//!
//! It raises a memory alarm on the whole broker (`rabbitmqctl set_vm_memory_high_watermark`), which
//! blocks every publisher: it is the only test in this binary, and cargo runs test binaries one at
//! a time (nextest runs it alone: `.config/nextest.toml`). Run: `cargo test -p idem-tests --test
//! rabbitmq_alarm`.

use std::time::Duration;

use idem_rabbitmq::{Consumer, PublishOptions};
use idem_runtime::Inbox;
use idem_tests::rabbit::amqp_url;
use idem_tests::{Backend, Msg, Recorder, TestBroker, TestDb, unique};

fn rabbitmqctl(args: &[&str]) -> String {
    let output = std::process::Command::new("rabbitmqctl")
        .arg("-q")
        .args(args)
        .output()
        .expect("rabbitmqctl runs");
    assert!(output.status.success(), "rabbitmqctl {args:?} failed");
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// A memory alarm, cleared when dropped (the watermark restored), even if the test fails.
struct MemoryAlarm {
    watermark: String,
}

impl MemoryAlarm {
    fn raise() -> Self {
        let watermark = rabbitmqctl(&["eval", "vm_memory_monitor:get_vm_memory_high_watermark()."]);
        rabbitmqctl(&["set_vm_memory_high_watermark", "0.0000001"]);
        MemoryAlarm { watermark }
    }
}

impl Drop for MemoryAlarm {
    fn drop(&mut self) {
        rabbitmqctl(&["set_vm_memory_high_watermark", &self.watermark]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acks_reach_the_broker_while_a_dead_letter_copy_is_blocked_by_an_alarm() {
    let broker = TestBroker::connect().await;
    let db = TestDb::connect(Backend::Postgres).await;
    let inbox = Inbox::builder(db.db.clone())
        .table(db.table("inbox"))
        .build()
        .await
        .unwrap();
    let effects = db.effects_table().await;
    let topology = broker.classic_queue();
    let (queue, dlq) = (
        topology.queue().to_owned(),
        topology.dead_letter_queue().to_owned(),
    );
    // Declares the queues; publishing is done before the alarm, which blocks publishers.
    let consumer = Consumer::builder(amqp_url(), inbox.clone())
        .connection_name(unique("idem-alarm"))
        .bind(topology.clone(), Recorder::new(&db, &effects, "billing"))
        .start()
        .await
        .unwrap();
    consumer.shutdown().await;
    // Undecodable: dead-lettered at once. Valid, but its handler takes a while: it is acked
    // after the dead-letter copy was published.
    broker
        .send_bytes(
            &queue,
            b"{not json",
            PublishOptions::default().message_id("m-bad"),
        )
        .await;
    broker
        .send(&queue, &Msg::new("o-1", "x"), PublishOptions::default())
        .await;

    let alarm = MemoryAlarm::raise();
    let handler = Recorder::new(&db, &effects, "billing").slow(Duration::from_millis(500));
    let consumer = Consumer::builder(amqp_url(), inbox.clone())
        .connection_name(unique("idem-alarm"))
        .bind(topology, handler)
        .start()
        .await
        .unwrap();
    broker
        .eventually(
            "o-1 acked during the alarm",
            Duration::from_secs(20),
            || async { consumer.stats().acked == 1 },
        )
        .await;
    assert_eq!(db.count(&effects, "1=1").await, 1);
    assert_eq!(
        consumer.stats().dead_lettered,
        0,
        "the copy waits for the alarm"
    );

    drop(alarm);
    broker
        .eventually(
            "dead-lettered once the alarm is cleared",
            Duration::from_secs(60),
            || async { consumer.stats().dead_lettered == 1 },
        )
        .await;
    let letters = broker.drain(&dlq).await;
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].reason(), "undecodable");
    assert_eq!(broker.depth(&queue).await, 0);
    consumer.shutdown().await;
}
