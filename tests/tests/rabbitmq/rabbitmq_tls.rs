//! TLS to the broker as production brokers use it: a listener whose certificate a private CA
//! signed (made by the tests), with and without client certificates, in front of the real
//! broker on 127.0.0.1:5672. Effects are counted in the real PostgreSQL, messages on the
//! broker's queues.
//!
//! Run: `cargo test -p idem-tests --test rabbitmq rabbitmq_tls::` with RabbitMQ and PostgreSQL up (see
//! README).

use std::time::Duration;

use idem_rabbitmq::{AmqpUrl, PublishOptions, Publisher, TlsSettings};
use idem_tests::rabbit::amqp_addr;
use idem_tests::tls::{Certificates, ClientAuth, TlsListener};
use idem_tests::{Fixture, Msg};

const WAIT: Duration = Duration::from_secs(30);

/// `listener`'s URL, trusting `certificates`' CA.
fn trusting(listener: &TlsListener, certificates: &Certificates) -> AmqpUrl {
    let tls = TlsSettings::new().ca_file(&certificates.ca_file).unwrap();
    AmqpUrl::new(listener.url()).tls(tls)
}

/// Publishes one message to the fixture's queue through `url`.
async fn publish_through(t: &Fixture, url: AmqpUrl) -> Result<(), idem_rabbitmq::Error> {
    let publisher = Publisher::builder(url).connect().await?;
    let published = publisher
        .publish(
            "",
            &t.queue,
            &Msg::new("o-tls", "x"),
            PublishOptions::default(),
        )
        .await;
    publisher.close().await;
    published.map(drop)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_broker_signed_by_a_private_ca_is_reached_with_its_ca_file() {
    let t = Fixture::new().await;
    let certificates = Certificates::make("billing");
    let listener = TlsListener::start(&amqp_addr(), &certificates, ClientAuth::None).await;
    let url = trusting(&listener, &certificates);

    let consumer = idem_rabbitmq::Consumer::builder(url.clone(), t.inbox.clone())
        .connection_name("idem-tls-consumer")
        .bind(t.topology.clone(), t.recorder("billing"))
        .start()
        .await
        .expect("a consumer over TLS");
    for key in 0..5 {
        t.send(
            &Msg::new(format!("o-{key}"), "x"),
            PublishOptions::default(),
        )
        .await;
    }
    t.broker
        .eventually("every order processed over TLS", WAIT, || async {
            consumer.stats().acked == 5
        })
        .await;
    consumer.shutdown().await;
    assert_eq!(t.effects("1=1").await, 5);

    publish_through(&t, url).await.expect("published over TLS");
    assert_eq!(t.depth().await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_broker_whose_certificate_no_trusted_ca_signed_is_refused_with_a_clear_error() {
    let t = Fixture::builder().declared().build().await;
    let certificates = Certificates::make("billing");
    let stranger = Certificates::make("stranger");
    let listener = TlsListener::start(&amqp_addr(), &certificates, ClientAuth::None).await;

    for url in [
        trusting(&listener, &stranger),
        AmqpUrl::new(listener.url()).tls(TlsSettings::new()),
    ] {
        let error = publish_through(&t, url).await.unwrap_err().to_string();
        assert!(
            error.contains("certificate") && error.contains("127.0.0.1"),
            "names the certificate and the broker: {error}"
        );
        assert!(!error.contains("guest:guest"), "password shown: {error}");
    }
    assert_eq!(t.depth().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_broker_that_authenticates_clients_by_certificate_takes_the_clients_certificate() {
    let t = Fixture::builder().declared().build().await;
    let certificates = Certificates::make("billing");
    let listener = TlsListener::start(&amqp_addr(), &certificates, ClientAuth::Required).await;

    let refused = publish_through(&t, trusting(&listener, &certificates)).await;
    assert!(refused.is_err(), "connected without a client certificate");
    assert_eq!(t.depth().await, 0);

    let tls = TlsSettings::new()
        .ca_file(&certificates.ca_file)
        .unwrap()
        .client_certificate(&certificates.client_certificate, &certificates.client_key)
        .unwrap();
    publish_through(&t, AmqpUrl::new(listener.url()).tls(tls))
        .await
        .expect("published with a client certificate");
    assert_eq!(t.depth().await, 1);
}
