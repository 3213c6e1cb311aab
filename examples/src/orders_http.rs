//! The orders service over HTTP (`orders --http ADDR`): its database, inbox and outbox, the
//! relay publishing what it stages, and the HTTP server; with `--demo`, a billing service
//! started beside it and the demo's clients.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use idem_rabbitmq::lapin::ExchangeKind;
use idem_rabbitmq::lapin::options::QueueDeclareOptions;
use idem_rabbitmq::lapin::types::FieldTable;
use idem_rabbitmq::{AmqpUrl, Relay};
use idem_runtime::Inbox;
use idem_runtime::outbox::Outbox;
use idem_runtime::sea_orm::DatabaseConnection;

use crate::cli::{BrokerArgs, connect_database};
use crate::demo::BoxError;
use crate::http_demo::{self, Watched};
use crate::stub::Stub;
use crate::{billing, placing};

/// What `orders --http` was told.
#[derive(Debug, Clone, Copy)]
pub struct Settings<'a> {
    /// Where to serve `POST /orders`.
    pub addr: SocketAddr,
    /// The service's database.
    pub database_url: &'a str,
    /// The broker and the exchange events go to.
    pub broker: &'a BrokerArgs,
    /// With a count, run the demo with that many orders, then stop.
    pub demo: Option<usize>,
    /// The demo's report as JSON.
    pub json: bool,
    /// The database of the billing service the demo starts.
    pub billing_database_url: &'a str,
}

/// Runs the service until Ctrl-C or SIGTERM, or, with a demo, until the demo ends.
///
/// # Errors
///
/// The database, the broker or the address could not be reached, or the demo failed.
pub async fn run(settings: Settings<'_>) -> Result<(), BoxError> {
    let db = connect_database(settings.database_url).await?;
    placing::create_table(&db).await?;
    let outbox = Outbox::builder(db.clone()).build().await?;
    let inbox = Inbox::builder(db.clone())
        .outbox(outbox.clone())
        .build()
        .await?;
    let broker = settings.broker.url()?;
    declare_exchange(settings.broker, &broker).await?;
    let relay = Relay::builder(broker.clone(), outbox.clone())
        .connection_name("orders relay")
        .start()
        .await?;
    let listener = tokio::net::TcpListener::bind(settings.addr).await?;
    let addr = listener.local_addr()?;
    let router = placing::router(inbox, &settings.broker.exchange)?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        let shutdown = async {
            let _ = stopped.await;
        };
        axum::serve(listener, router)
            .with_graceful_shutdown(shutdown)
            .await
    });
    tracing::info!(%addr, database = %idem_rabbitmq::amqp::redact_url(settings.database_url), "orders is serving POST /orders");
    let result = match settings.demo {
        Some(count) => demo(settings, &broker, addr, &db, &outbox, count).await,
        None => {
            crate::cli::wait_for_signal().await;
            Ok(())
        }
    };
    let _ = stop.send(());
    server.await??;
    stop_relay(relay).await;
    result
}

/// Declares the exchange the events go to, waiting for the broker as long as `--broker-wait-ms`.
async fn declare_exchange(args: &BrokerArgs, broker: &AmqpUrl) -> Result<(), BoxError> {
    let publisher = crate::broker::reach(broker, Some(args.broker_wait)).await?;
    let declared = publisher
        .declare_exchange(&args.exchange, ExchangeKind::Topic)
        .await;
    publisher.close().await;
    Ok(declared?)
}

async fn stop_relay(relay: Relay) {
    let relayed = relay.shutdown().await;
    tracing::info!(events_published = relayed.published, "relay stopped");
}

/// Starts billing beside the service, runs the demo, and stops billing.
async fn demo(
    settings: Settings<'_>,
    broker: &AmqpUrl,
    addr: SocketAddr,
    db: &DatabaseConnection,
    outbox: &Outbox,
    count: usize,
) -> Result<(), BoxError> {
    let stub = Stub::start("127.0.0.1:0").await?;
    let billing_db = connect_database(settings.billing_database_url).await?;
    billing::create_tables(&billing_db).await?;
    let mut billing = start_billing(settings, &stub)?;
    let result = async {
        wait_for_billing(broker, &mut billing).await?;
        let watched = Watched {
            addr,
            outbox,
            orders_db: db,
            billing_db: &billing_db,
            stub: &stub,
        };
        http_demo::run(watched, count, settings.json).await
    }
    .await;
    stop_billing(billing);
    result
}

/// The billing binary beside this one, consuming the orders this service's relay publishes and
/// notifying through `stub`.
fn start_billing(settings: Settings<'_>, stub: &Stub) -> Result<Child, BoxError> {
    let path = sibling("billing")?;
    let child = Command::new(&path)
        .args(["--provider-url", &stub.notify_url()])
        .args(["--database-url", settings.billing_database_url])
        .args(["--exchange", &settings.broker.exchange])
        .args(["--amqp-url", &settings.broker.amqp_url])
        .spawn()
        .map_err(|error| format!("cannot start {}: {error}", path.display()))?;
    Ok(child)
}

fn sibling(name: &str) -> Result<PathBuf, BoxError> {
    let exe = std::env::current_exe()?;
    let dir = exe.parent().ok_or("the binary has no directory")?;
    Ok(dir.join(format!("{name}{}", std::env::consts::EXE_SUFFIX)))
}

/// Waits until billing consumes its queue (`BILLING_QUEUE`, as billing reads it), so that no
/// order published before is unroutable.
async fn wait_for_billing(broker: &AmqpUrl, billing: &mut Child) -> Result<(), BoxError> {
    let queue = std::env::var("BILLING_QUEUE").unwrap_or_else(|_| billing::QUEUE.to_owned());
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = billing.try_wait()? {
            return Err(format!("billing exited before it consumed: {status}").into());
        }
        if consumers(broker, &queue).await.unwrap_or(0) > 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("billing did not consume {queue} within a minute").into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// How many consumers `queue` has; an error when it does not exist yet.
async fn consumers(broker: &AmqpUrl, queue: &str) -> Result<u32, BoxError> {
    let connection = idem_rabbitmq::amqp::connect(broker, "orders demo").await?;
    let passive = QueueDeclareOptions {
        passive: true,
        ..QueueDeclareOptions::default()
    };
    let declared = match connection.create_channel().await {
        Ok(channel) => channel
            .queue_declare(queue.into(), passive, FieldTable::default())
            .await
            .map(|queue| queue.consumer_count()),
        Err(error) => Err(error),
    };
    let _ = idem_rabbitmq::amqp::close_within(&connection, "counted", Duration::from_secs(5)).await;
    Ok(declared?)
}

/// Stops billing as a service manager would (SIGTERM), and waits for it.
fn stop_billing(mut billing: Child) {
    let terminated = Command::new("kill")
        .args(["-TERM", &billing.id().to_string()])
        .status();
    if !terminated.is_ok_and(|status| status.success()) {
        let _ = billing.kill();
    }
    let _ = billing.wait();
}
