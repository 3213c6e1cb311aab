//! A broker resource alarm while a message is dead-lettered: the broker blocks connections that
//! publish, so the consumer publishes its copies on a connection of their own, and the acks of the
//! messages it processes meanwhile still reach the broker.
//!
//! It raises a memory alarm on the whole broker (`rabbitmqctl set_vm_memory_high_watermark`), which
//! blocks every publisher: it is the only test in this binary, and cargo runs test binaries one at
//! a time (nextest runs it alone: `.config/nextest.toml`). Run: `cargo test -p idem-tests --test
//! rabbitmq_alarm`.

use std::time::Duration;

use idem_rabbitmq::PublishOptions;
use idem_tests::rabbit::{consumer_builder, rabbitmqctl};
use idem_tests::{Backend, Msg, Recorder, TestBroker, clean_up, inbox_and_effects, unique};

/// A memory alarm, cleared when dropped (the watermark restored), even if the test fails.
struct MemoryAlarm {
    watermark: String,
}

impl MemoryAlarm {
    async fn raise() -> Self {
        let watermark =
            rabbitmqctl(&["eval", "vm_memory_monitor:get_vm_memory_high_watermark()."]).await;
        rabbitmqctl(&["set_vm_memory_high_watermark", "0.0000001"]).await;
        MemoryAlarm { watermark }
    }
}

impl Drop for MemoryAlarm {
    fn drop(&mut self) {
        let watermark = std::mem::take(&mut self.watermark);
        clean_up(async move {
            rabbitmqctl(&["set_vm_memory_high_watermark", &watermark]).await;
        });
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acks_reach_the_broker_while_a_dead_letter_copy_is_blocked_by_an_alarm() {
    let broker = TestBroker::connect().await;
    let (db, inbox, effects) = inbox_and_effects(Backend::Postgres).await;
    let topology = broker.classic_queue();
    let (queue, dlq) = (
        topology.queue().to_owned(),
        topology.dead_letter_queue().to_owned(),
    );
    // Publishing is done before the alarm, which blocks publishers.
    broker.declare(&topology).await;
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

    let alarm = MemoryAlarm::raise().await;
    let handler = Recorder::new(&db, &effects, "billing").slow(Duration::from_millis(500));
    let consumer = consumer_builder(&inbox, &unique("idem-alarm"))
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
