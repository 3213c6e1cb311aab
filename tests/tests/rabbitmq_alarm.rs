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
use idem_tests::rabbit::rabbitmqctl;
use idem_tests::{Fixture, Msg, clean_up};

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
    // Publishing is done before the alarm, which blocks publishers.
    let t = Fixture::builder().declared().build().await;
    // Undecodable: dead-lettered at once. Valid, but its handler takes a while: it is acked
    // after the dead-letter copy was published.
    t.send_bytes(b"{not json", PublishOptions::default().message_id("m-bad"))
        .await;
    t.send(&Msg::new("o-1", "x"), PublishOptions::default())
        .await;

    let alarm = MemoryAlarm::raise().await;
    let consumer = t
        .start(t.recorder("billing").slow(Duration::from_millis(500)))
        .await;
    t.broker
        .eventually(
            "o-1 acked during the alarm",
            Duration::from_secs(20),
            || async { consumer.stats().acked == 1 },
        )
        .await;
    assert_eq!(t.effects("1=1").await, 1);
    assert_eq!(
        consumer.stats().dead_lettered,
        0,
        "the copy waits for the alarm"
    );

    drop(alarm);
    t.broker
        .eventually(
            "dead-lettered once the alarm is cleared",
            Duration::from_secs(60),
            || async { consumer.stats().dead_lettered == 1 },
        )
        .await;
    let letters = t.dead_letters().await;
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].reason(), "undecodable");
    assert_eq!(t.depth().await, 0);
    consumer.shutdown().await;
}
