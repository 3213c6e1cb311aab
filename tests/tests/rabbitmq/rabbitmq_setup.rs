//! A RabbitMQ consumer set up against what it is given: an operator's existing queues beside
//! ones it declares, a queue of another type than stated, a virtual host whose default queue
//! type is quorum, a swapped codec, wrong credentials (never shown), a pool too small for the
//! cleaner. What cannot work is refused or warned about at start. The real broker on
//! 127.0.0.1:5672 and the real PostgreSQL (SQLite for one test); each test makes its own queues
//! and tables.
//!
//! Run: `cargo test -p idem-tests --test rabbitmq rabbitmq_setup::` with RabbitMQ and PostgreSQL up (see
//! README).

use std::sync::Arc;
use std::time::Duration;

use idem_rabbitmq::{Consumer, PublishOptions, QueueTopology, headers};
use idem_runtime::{Handler, Inbox};
use idem_tests::rabbit::{amqp_url, consumer_builder, consumer_builder_at, rabbitmqctl};
use idem_tests::{Backend, Fixture, Layout, Msg, Recorder, TestBroker, inbox_and_effects, unique};

const WAIT: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn existing_topology_and_a_second_binding_in_one_consumer() {
    let t = Fixture::new().await;
    // The application's own topology: a queue whose dead-letter exchange is named its way.
    let own = t.broker.track(
        QueueTopology::classic(unique("idem_own"))
            .dead_letter(unique("idem_own_dlx"), unique("idem_own_dlq")),
    );
    t.broker.declare(&own).await;
    let (own_queue, own_dlq) = (own.queue().to_owned(), own.dead_letter_queue().to_owned());
    let (declared_by_idem, idem_queue) = (t.topology.clone(), t.queue.as_str());

    // idem does not declare an existing topology: a queue that is not there fails the start.
    let missing = t
        .consumer()
        .bind(
            QueueTopology::existing(unique("idem_absent"), "amq.fanout"),
            t.recorder("a"),
        )
        .start()
        .await
        .unwrap_err();
    assert!(missing.to_string().contains("basic.consume"), "{missing}");

    // Nor one whose dead-letter exchange is not there: the copies would have nowhere to go.
    let no_dlx = t
        .consumer()
        .bind(
            QueueTopology::existing(&own_queue, unique("idem_no_such_dlx")),
            t.recorder("a"),
        )
        .start()
        .await
        .unwrap_err();
    assert!(
        no_dlx.to_string().contains("dead-letter exchange"),
        "{no_dlx}"
    );

    let consumer = t
        .consumer()
        .bind(
            QueueTopology::existing(&own_queue, own.dead_letter_exchange()),
            t.recorder("own"),
        )
        .bind(declared_by_idem, t.recorder("declared"))
        .start()
        .await
        .unwrap();
    t.broker
        .send(&own_queue, &Msg::new("o-1", "x"), PublishOptions::default())
        .await;
    t.broker
        .send(idem_queue, &Msg::new("o-1", "x"), PublishOptions::default())
        .await;
    t.broker
        .send_bytes(&own_queue, b"{", PublishOptions::default())
        .await;
    t.broker
        .eventually("both queues consumed", WAIT, || async {
            let stats = consumer.stats();
            stats.acked == 2 && stats.dead_lettered == 1
        })
        .await;
    assert_eq!(t.effects("consumer = 'own'").await, 1);
    assert_eq!(t.effects("consumer = 'declared'").await, 1);
    let letters = t.broker.drain(&own_dlq).await;
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].reason(), "undecodable");
    consumer.shutdown().await;
}

/// A stated queue type that the broker contradicts refuses the start, either way, and leaves no
/// connection behind; a stated type that matches, or none, starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_existing_queue_of_another_type_than_stated_refuses_to_start() {
    use idem_rabbitmq::QueueKind;

    let t = Fixture::builder().layout(Layout::QuorumQueue).build().await;
    let (quorum, quorum_dlx) = (&t.queue, &t.dlx);
    let classic = t.broker.dead_letter_by_key(true).await;
    let cases = [
        (quorum, quorum_dlx, QueueKind::Classic, "is a quorum queue"),
        (
            &classic.queue,
            &classic.dlx,
            QueueKind::Quorum,
            "is a classic queue",
        ),
    ];
    for (queue, dlx, stated, expected) in cases {
        let name = unique("idem-kind");
        let refused = consumer_builder(&t.inbox, &name)
            .bind(
                QueueTopology::existing(queue, dlx).queue_kind(stated),
                t.recorder("c"),
            )
            .start()
            .await
            .unwrap_err();
        assert!(
            matches!(
                refused.settings(),
                [idem_rabbitmq::SettingError::QueueKindMismatch { .. }]
            ) && refused.to_string().contains(expected),
            "{refused}"
        );
        t.broker
            .eventually("no connection left", WAIT, || async {
                !rabbitmqctl(&["list_connections", "client_properties"])
                    .await
                    .contains(&name)
            })
            .await;
    }
    for (queue, dlx, kind) in [
        (quorum, quorum_dlx, Some(QueueKind::Quorum)),
        (&classic.queue, &classic.dlx, Some(QueueKind::Classic)),
        (quorum, quorum_dlx, None),
    ] {
        let mut topology = QueueTopology::existing(queue, dlx);
        if let Some(kind) = kind {
            topology = topology.queue_kind(kind);
        }
        let consumer = t.start_on(topology, t.recorder("c")).await;
        consumer.shutdown().await;
    }
}

/// A classic topology on a virtual host whose default queue type is quorum: its queue is
/// classic, as the consumer takes it to be (a quorum queue it took for classic would count the
/// requeues it means not to count, and dead-letter by the broker's limit without a reason), and
/// a classic queue an earlier version declared without its type is still consumed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_classic_topology_is_classic_on_a_virtual_host_that_defaults_to_quorum() {
    let vhost = unique("idem_vhost_quorum");
    rabbitmqctl(&["add_vhost", &vhost, "--default-queue-type", "quorum"]).await;
    rabbitmqctl(&["set_permissions", "-p", &vhost, "guest", ".*", ".*", ".*"]).await;
    let base = amqp_url();
    let (server, _) = base.rsplit_once('/').expect("a virtual host in the URL");
    let url = format!("{server}/{vhost}");
    let (db, inbox, effects) = inbox_and_effects(Backend::Postgres).await;
    let queue = unique("idem_q");
    let start = || {
        start_on(
            &url,
            &inbox,
            QueueTopology::classic(&queue),
            Recorder::new(&db, &effects, "c"),
        )
    };
    let first = start().await.expect("consumer starts");
    let types = rabbitmqctl(&["list_queues", "-p", &vhost, "name", "type"]).await;
    first.shutdown().await;
    // Started again, it declares the same queue.
    let again = start().await;
    let again_ok = again.is_ok();
    if let Ok(consumer) = again {
        consumer.shutdown().await;
    }
    rabbitmqctl(&["delete_vhost", &vhost]).await;
    // On the default virtual host, a classic queue as an earlier version declared it: with its
    // dead-letter exchange, without its type.
    let broker = TestBroker::connect().await;
    let earlier = broker.track(QueueTopology::classic(unique("idem_q")));
    let dlx = earlier.dead_letter_exchange().to_owned();
    broker
        .declare_queue(earlier.queue(), &[("x-dead-letter-exchange", dlx.as_str())])
        .await;
    let consumed = start_on(
        &amqp_url(),
        &inbox,
        earlier,
        Recorder::new(&db, &effects, "c"),
    )
    .await;
    let line = types
        .lines()
        .find(|line| line.split_whitespace().next() == Some(queue.as_str()))
        .unwrap_or_else(|| panic!("{queue} not listed: {types}"));
    assert!(line.ends_with("classic"), "{line}");
    assert!(again_ok, "a second start fails");
    consumed
        .expect("a queue declared without its type is consumed")
        .shutdown()
        .await;
}

async fn start_on<H>(
    url: &str,
    inbox: &Inbox,
    topology: QueueTopology,
    handler: H,
) -> Result<Consumer, idem_rabbitmq::Error>
where
    H: Handler<Message = Msg> + 'static,
{
    consumer_builder_at(url, inbox, &unique("idem-test"))
        .bind(topology, handler)
        .start()
        .await
}

/// Messages as `id|body` text.
#[derive(Debug, Clone, Copy)]
struct PipeText;

impl idem_rabbitmq::Codec for PipeText {
    fn decode<M: serde::de::DeserializeOwned>(
        &self,
        content_type: Option<&str>,
        payload: &[u8],
    ) -> Result<M, idem_rabbitmq::DecodeError> {
        if content_type != Some("text/plain") {
            return Err(idem_rabbitmq::DecodeError::UnsupportedContentType(
                content_type.unwrap_or_default().to_owned(),
            ));
        }
        let text = std::str::from_utf8(payload)
            .map_err(|e| idem_rabbitmq::DecodeError::Malformed(e.to_string()))?;
        let (id, body) = text
            .split_once('|')
            .ok_or_else(|| idem_rabbitmq::DecodeError::Malformed("no `|`".into()))?;
        serde_json::from_value(serde_json::json!({ "id": id, "body": body }))
            .map_err(|e| idem_rabbitmq::DecodeError::Malformed(e.to_string()))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_swapped_codec_decodes_payloads() {
    let t = Fixture::new().await;
    let binding = t.binding(t.recorder("text")).with_codec(PipeText);
    let consumer = t.consumer().bind_with(binding).start().await.unwrap();
    let text = PublishOptions::default().content_type("text/plain");
    t.send_bytes(b"o-1|hello", text.clone()).await;
    t.send_bytes(b"o-1|hello", text.clone()).await;
    t.send_bytes(b"no separator", text).await;
    t.send(&Msg::new("o-2", "json"), PublishOptions::default())
        .await;
    t.broker
        .eventually("four settled", WAIT, || async {
            let stats = consumer.stats();
            stats.acked + stats.duplicates + stats.dead_lettered == 4
        })
        .await;
    let stats = consumer.stats();
    assert_eq!(
        (stats.acked, stats.duplicates, stats.dead_lettered),
        (1, 1, 2)
    );
    assert_eq!(t.effects("body = 'hello'").await, 1);
    let mut reasons: Vec<String> = t
        .dead_letters()
        .await
        .iter()
        .map(|letter| letter.headers[headers::DETAIL].clone())
        .collect();
    reasons.sort();
    assert!(
        reasons[0].contains("malformed payload: no `|`"),
        "{reasons:?}"
    );
    assert!(
        reasons[1].contains("unsupported content type \"application/json\""),
        "{reasons:?}"
    );
    consumer.shutdown().await;
}

/// Passwords with each reserved character, raw (the URL then cannot be read) and percent-encoded
/// (a wrong password for the broker): neither the consumer's error nor the publisher's shows any
/// part of them. (Raw passwords that the URL reads as a port, such as `4242/secret`, send lapin
/// to another host: the unit tests of `redact_url` cover them.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn wrong_credentials_fail_start_without_showing_the_password() {
    let (db, inbox, effects) = inbox_and_effects(Backend::Sqlite).await;
    let passwords = [
        "hunter2-secret",
        "hunter2/secret",
        "hunter2#secret",
        "hunter2?secret",
        "hunter2@secret",
        "hunter2%secret",
        "hunter2%2Fsecret%23%3F%40%25",
    ];
    for password in passwords {
        let url = format!("amqp://guest:{password}@127.0.0.1:5672/%2f");
        let error = Consumer::builder(url.as_str(), inbox.clone())
            .bind(
                QueueTopology::classic(unique("idem_q")),
                Recorder::new(&db, &effects, "c"),
            )
            .start()
            .await
            .unwrap_err();
        let published = idem_rabbitmq::Publisher::connect(url.as_str())
            .await
            .unwrap_err();
        for shown in [
            format!("{error} {error:?}"),
            format!("{published} {published:?}"),
        ] {
            for part in ["hunter2", "secret"] {
                assert!(!shown.contains(part), "{password}: {shown}");
            }
            assert!(shown.contains("***@127.0.0.1"), "{password}: {shown}");
        }
    }
}

/// What a test's thread logs, in memory.
#[derive(Debug, Clone, Default)]
struct Logs(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Logs {
    type Writer = Logs;
    fn make_writer(&'a self) -> Logs {
        self.clone()
    }
}

impl Logs {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

/// A pool that leaves handlers no connection while the cleaner runs (on PostgreSQL the cleaner
/// holds two) is warned about at start; a pool with room, or a consumer that does not run the
/// cleaner, is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pool_too_small_for_the_cleaner_is_warned_about_at_start() {
    use tracing_subscriber::util::SubscriberInitExt;

    for (pool, cleaner, warned) in [(2, true, true), (3, true, false), (2, false, false)] {
        let t = Fixture::builder().pool(pool).build().await;
        let logs = Logs::default();
        let _capture = tracing_subscriber::fmt()
            .with_writer(logs.clone())
            .with_ansi(false)
            .with_max_level(tracing_subscriber::filter::LevelFilter::WARN)
            .finish()
            .set_default();
        let mut builder = t.consumer().bind(t.topology.clone(), t.recorder("c"));
        if !cleaner {
            builder = builder.without_cleaner();
        }
        let consumer = builder.start().await.unwrap();
        let text = logs.text();
        assert_eq!(
            text.contains("too small for its cleaner"),
            warned,
            "pool {pool}, cleaner {cleaner}: {text}"
        );
        consumer.shutdown().await;
    }
}

/// Every setting that cannot work is named at start, not the first one only: a user fixes them
/// in one round.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_invalid_setting_is_reported_at_once() {
    let t = Fixture::new().await;
    let refused = t
        .consumer()
        .prefetch(0)
        .max_in_flight(0)
        .bind_with(
            idem_rabbitmq::Binding::new(t.topology.clone(), t.recorder("a"))
                .batch(0, Duration::ZERO),
        )
        .start()
        .await
        .unwrap_err();
    let problems = refused.settings();
    assert_eq!(problems.len(), 3, "{refused}");
    for what in ["prefetch", "max_in_flight", "the batch size"] {
        assert!(
            problems.contains(&idem_rabbitmq::SettingError::Zero(what)),
            "{what} in {refused}"
        );
    }
}

/// The consumer reads the broker's version (3.10 here) and declares a quorum dead-letter queue
/// that a look at never brings a letter closer to being dropped: without a delivery limit on
/// RabbitMQ 3 (where -1 would mean 0), with -1 on RabbitMQ 4 (whose default is 20).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_quorum_dead_letter_queue_is_declared_without_a_delivery_limit() {
    let url = idem_rabbitmq::AmqpUrl::new(amqp_url());
    let version = idem_rabbitmq::amqp::server_version(&url, Duration::from_secs(5))
        .await
        .expect("the broker tells its version");
    let major: u32 = version.split('.').next().unwrap().parse().unwrap();
    let t = Fixture::builder().quorum().build().await;
    let running = t.start(t.recorder(&unique("dlq-limit"))).await;
    let arguments = idem_tests::rabbit::queue_arguments(t.topology.dead_letter_queue()).await;
    let limit = arguments
        .get("x-delivery-limit")
        .and_then(serde_json::Value::as_i64);
    if major >= 4 {
        assert_eq!(limit, Some(-1), "{version}: {arguments:?}");
    } else {
        assert_eq!(limit, None, "{version}: {arguments:?}");
    }
    running.shutdown().await;
}
