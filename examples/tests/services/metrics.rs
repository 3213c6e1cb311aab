//! The billing service's Prometheus endpoint (`--metrics-addr`), scraped while it consumes
//! against the real RabbitMQ: idem's metrics with their labels, counting what the service did.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::TcpListener;
use std::time::{Duration, Instant};

use common::Billing;
use idem_examples::orders::{self, OrderPlaced, ROUTING_KEY};
use idem_examples::stub::Stub;
use idem_examples::{billing, notifications};
use idem_rabbitmq::PublishOptions;
use idem_tests::{TestBroker, rabbit, unique};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One scrape: each sample's value by its name and labels as the text format writes them
/// (`idem_messages_total{consumer="billing.charge",outcome="processed"}`).
#[derive(Debug)]
struct Scrape(BTreeMap<String, f64>, BTreeSet<String>);

impl Scrape {
    /// Scrapes `addr` over plain HTTP/1.1.
    async fn of(addr: &str) -> Result<Self, std::io::Error> {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        let request = format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await?;
        let (head, body) = response.split_once("\r\n\r\n").unwrap_or_default();
        assert!(head.starts_with("HTTP/1.1 200"), "scrape answered {head}");
        let samples = body
            .lines()
            .filter(|line| !line.starts_with('#') && !line.is_empty())
            .filter_map(|line| {
                let (series, value) = line.rsplit_once(' ')?;
                Some((series.to_owned(), value.parse().ok()?))
            })
            .collect();
        let described = body
            .lines()
            .filter_map(|line| line.strip_prefix("# HELP "))
            .filter_map(|help| help.split_whitespace().next())
            .map(str::to_owned)
            .collect();
        Ok(Self(samples, described))
    }

    /// The metric families of idem's samples that the scrape does not describe (no `# HELP`).
    fn undescribed(&self) -> Vec<String> {
        let family = |series: &str| {
            let name = series.split('{').next().unwrap_or(series);
            ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| name.strip_suffix(suffix))
                .filter(|base| self.1.contains(*base))
                .unwrap_or(name)
                .to_owned()
        };
        let mut missing: Vec<String> = (self.0.keys())
            .filter(|series| series.starts_with("idem_"))
            .map(|series| family(series))
            .filter(|name| !self.1.contains(name))
            .collect();
        missing.dedup();
        missing
    }

    /// The sample of `name` whose labels include every one of `labels`, if there is one.
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.0.iter().find_map(|(series, value)| {
            let rest = series.strip_prefix(name)?;
            let matches = (rest.is_empty() || rest.starts_with('{'))
                && labels
                    .iter()
                    .all(|(label, want)| rest.contains(&format!("{label}=\"{want}\"")));
            matches.then_some(*value)
        })
    }

    /// [`Scrape::value`], zero when the sample is absent.
    fn count(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.value(name, labels).unwrap_or(0.0)
    }
}

/// A loopback address no one listens on now.
fn free_address() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn billing_serves_its_metrics_to_prometheus() {
    let broker = TestBroker::connect().await;
    let name = unique("metrics");
    let exchange = format!("{name}.orders");
    let queue = format!("{name}.billing");
    let topology = broker.track(billing::topology_on(&queue, &exchange));
    broker.track_exchange(&exchange);
    broker.declare(&topology).await;
    let events = format!("{name}.events");
    broker.track_exchange(&events);
    let notified = broker.track(notifications::topology_on(&format!("{name}.notifications")));
    let url = idem_rabbitmq::AmqpUrl::new(rabbit::amqp_url());
    notifications::declare(&url, notified.queue(), &events)
        .await
        .unwrap();
    let provider = Stub::start("127.0.0.1:0").await.unwrap();
    let database = std::env::temp_dir().join(format!("{name}.db"));
    let database_url = format!("sqlite://{}?mode=rwc", database.display());
    let metrics_addr = free_address();

    let service = Billing::spawn(&[
        ("AMQP_URL", &rabbit::amqp_url()),
        ("DATABASE_URL", &database_url),
        ("ORDERS_EXCHANGE", &exchange),
        ("BILLING_QUEUE", &queue),
        ("BILLING_BATCH", "8"),
        ("BILLING_EVENTS_EXCHANGE", &events),
        ("NOTIFICATIONS_QUEUE", notified.queue()),
        ("NOTIFICATIONS_PROVIDER_URL", &provider.notify_url()),
        ("BILLING_METRICS_ADDR", &metrics_addr),
    ]);
    service.wait_consuming(Duration::from_secs(60));

    // Five orders, the first one twice, and a message that is not an order.
    let orders: Vec<_> = (0..5)
        .map(|i| OrderPlaced {
            order_id: format!("{name}-{i}"),
            customer: format!("customer-{i}"),
            amount_cents: 100 + i,
        })
        .collect();
    for order in orders.iter().chain(&orders[..1]) {
        orders::publish_to(&broker.publisher, &exchange, order)
            .await
            .unwrap();
    }
    let options = PublishOptions::default().message_id(format!("{name}-garbled"));
    (broker.publisher)
        .publish_bytes(&exchange, ROUTING_KEY, b"{\"order_id\": 12", options)
        .await
        .unwrap();

    let billing_queue = [("queue", queue.as_str())];
    let settled = |scrape: &Scrape, settle: &str| {
        scrape.count(
            "idem_rabbitmq_deliveries_total",
            &[("queue", queue.as_str()), ("settle", settle)],
        )
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let scrape = loop {
        let scrape = Scrape::of(&metrics_addr).await.unwrap();
        let notifications_done = scrape.count(
            "idem_processing_duration_seconds_count",
            &[
                ("consumer", notifications::CONSUMER),
                ("outcome", "processed"),
            ],
        ) >= 5.0;
        if settled(&scrape, "acked") == 5.0
            && settled(&scrape, "duplicate") == 1.0
            && settled(&scrape, "dead-lettered") == 1.0
            && notifications_done
        {
            break scrape;
        }
        assert!(
            Instant::now() < deadline,
            "the metrics never counted the run: {scrape:#?}\n{}",
            service.tail()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };

    assert_eq!(
        scrape.undescribed(),
        Vec::<String>::new(),
        "every metric has its # HELP"
    );
    let charge = [("consumer", billing::CONSUMER)];
    let processed = [("consumer", billing::CONSUMER), ("outcome", "processed")];
    assert_eq!(scrape.count("idem_messages_total", &processed), 5.0);
    assert_eq!(
        scrape.count(
            "idem_messages_total",
            &[("consumer", billing::CONSUMER), ("outcome", "duplicate")]
        ),
        1.0
    );
    assert_eq!(
        scrape.count("idem_duplicate_age_seconds_count", &charge),
        1.0
    );
    // Billing takes its orders in batches: each batch's size is recorded, and they add up to
    // the orders (the duplicate included; the undecodable one never reaches the inbox).
    assert!(scrape.count("idem_batch_size_count", &charge) >= 1.0);
    assert_eq!(scrape.count("idem_batch_size_sum", &charge), 6.0);
    assert!(
        scrape
            .value(
                "idem_batch_duration_seconds_bucket",
                &[("consumer", billing::CONSUMER), ("le", "+Inf")]
            )
            .is_some(),
        "batch durations are histograms with buckets"
    );
    assert_eq!(
        scrape.count(
            "idem_rabbitmq_dead_letters_total",
            &[("queue", queue.as_str()), ("reason", "undecodable")]
        ),
        1.0
    );
    assert_eq!(broker.depth(topology.dead_letter_queue()).await, 1);
    assert_eq!(
        scrape.value("idem_rabbitmq_connected", &billing_queue),
        Some(1.0)
    );
    assert_eq!(
        scrape.value("idem_rabbitmq_in_flight", &billing_queue),
        Some(0.0)
    );
    let outbox = [("table", "idem_outbox")];
    assert_eq!(
        scrape.value("idem_outbox_relay_connected", &outbox),
        Some(1.0)
    );
    assert!(scrape.value("idem_outbox_pending", &outbox).is_some());
    assert!(scrape.count("idem_outbox_published_total", &outbox) >= 5.0);
    let connection = format!("billing {queue}");
    assert_eq!(
        scrape.count(
            "idem_rabbitmq_connections_total",
            &[
                ("connection", connection.as_str()),
                ("node", &rabbit::amqp_addr())
            ]
        ),
        1.0
    );

    let stats = service.terminate();
    assert_eq!((stats.acked, stats.duplicates), (5, 1));
    let _ = std::fs::remove_file(&database);
}
