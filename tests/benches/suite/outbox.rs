//! The outbox modes of issue 10: the downstream queue and outbox of a case, its relay during a
//! round, the wait for the round's events and their check.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use idem_rabbitmq::Relay;
use idem_rabbitmq::lapin::options::ConfirmSelectOptions;
use idem_rabbitmq::lapin::{Channel, Connection, ConnectionProperties};
use idem_runtime::outbox::Outbox;
use idem_tests::bench::hand_outbox::HandOutbox;
use idem_tests::bench::{Charged, orders};
use idem_tests::rabbit::amqp_url;
use idem_tests::{TestDb, unique};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::Suite;
use crate::args::Mode;
use crate::case::Case;

/// Events taken, published and marked sent per relay batch, on both sides: idem's default.
pub(crate) const RELAY_BATCH: u32 = 100;

/// Where a case's events go: the queue declared for them and the outbox that stages them.
pub(crate) struct Downstream {
    /// The queue the events are published to, through the default exchange.
    pub(crate) queue: String,
    pub(crate) outbox: Staging,
}

/// The outbox of one side.
pub(crate) enum Staging {
    Idem(Outbox),
    Hand(HandOutbox),
}

impl Downstream {
    /// The downstream queue and the outbox of `mode`, if it is an outbox mode.
    pub(crate) async fn create(suite: &Suite, db: &TestDb, mode: Mode) -> Option<Self> {
        let outbox = match mode {
            Mode::IdemOutbox => Staging::Idem(
                Outbox::builder(db.db.clone())
                    .table(db.table("outbox"))
                    .build()
                    .await
                    .expect("outbox"),
            ),
            Mode::HandOutbox => Staging::Hand(HandOutbox::create(db).await),
            _ => return None,
        };
        let queue = unique("idem_events");
        suite.broker.declare_queue(&queue, &[]).await;
        Some(Self { queue, outbox })
    }

    /// The outbox table.
    pub(crate) fn table(&self) -> String {
        match &self.outbox {
            Staging::Idem(outbox) => outbox.table().as_str().to_owned(),
            Staging::Hand(outbox) => outbox.table().to_owned(),
        }
    }
}

/// A relay running for a round.
pub(crate) enum Relaying {
    Idem(Relay),
    Hand(Box<HandRelaying>),
}

/// The hand-written relay, running: its connection, channel, stop signal and task.
pub(crate) struct HandRelaying {
    connection: Connection,
    channel: Channel,
    stop: watch::Sender<bool>,
    task: JoinHandle<Result<u64, String>>,
}

/// Starts the relay of `case`, if it has an outbox: connected to the broker directly (not
/// through the probe, which times the consumer), batches of [`RELAY_BATCH`].
pub(crate) async fn start_relay(db: &TestDb, case: &Case) -> Option<Relaying> {
    let downstream = case.downstream.as_ref()?;
    Some(match &downstream.outbox {
        Staging::Idem(outbox) => Relaying::Idem(
            Relay::builder(amqp_url(), outbox.clone())
                .connection_name("bench relay")
                .batch_size(RELAY_BATCH)
                .start()
                .await
                .expect("the relay starts"),
        ),
        Staging::Hand(outbox) => {
            let connection = Connection::connect(&amqp_url(), ConnectionProperties::default())
                .await
                .expect("connect");
            let channel = connection.create_channel().await.expect("channel");
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await
                .expect("confirms");
            let (stop, stopped) = watch::channel(false);
            let relay = outbox.clone().relay(
                db.db.clone(),
                channel.clone(),
                downstream.queue.clone(),
                RELAY_BATCH,
                stopped,
            );
            Relaying::Hand(Box::new(HandRelaying {
                connection,
                channel,
                stop,
                task: tokio::spawn(relay),
            }))
        }
    })
}

impl Relaying {
    /// Stops the relay once its batch in hand is marked sent; says what went wrong, if anything.
    pub(crate) async fn stop(self, case: &Case) -> Result<(), String> {
        match self {
            Relaying::Idem(relay) => {
                let stats = relay.shutdown().await;
                if stats.failed + stats.database_errors > 0 {
                    return Err(format!("{}: idem's relay {stats:?}", case.label()));
                }
            }
            Relaying::Hand(hand) => {
                let HandRelaying {
                    connection,
                    channel,
                    stop,
                    task,
                } = *hand;
                stop.send_replace(true);
                let relayed = task.await.map_err(|error| error.to_string());
                // The channel first, as the hand consumers do: lapin logs an error otherwise.
                let _ = channel.close(200, "round done".into()).await;
                let _ = connection.close(200, "round done".into()).await;
                relayed?.map_err(|error| format!("{}: the hand relay: {error}", case.label()))?;
            }
        }
        Ok(())
    }
}

/// Waits until `distinct` events are in the downstream queue of `case`; returns when it saw
/// them (`None` for a mode without events).
pub(crate) async fn arrivals(
    suite: &Suite,
    case: &Case,
    distinct: u64,
    start: Instant,
) -> Result<Option<Instant>, String> {
    let Some(downstream) = &case.downstream else {
        return Ok(None);
    };
    let deadline = Duration::from_secs(60) + Duration::from_millis(5 * distinct);
    loop {
        let depth = u64::from(suite.broker.depth(&downstream.queue).await);
        if depth >= distinct {
            return Ok(Some(Instant::now()));
        }
        if start.elapsed() > deadline {
            return Err(format!(
                "{}: {depth} of {distinct} events reached the downstream queue after {:.0?}",
                case.label(),
                start.elapsed()
            ));
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Checks that the events of the round's `n` messages published as round `published` are in
/// the downstream queue, one per distinct order (taking them out), and that the outbox has no
/// unsent row left.
pub(crate) async fn check_events(
    suite: &Suite,
    db: &TestDb,
    case: &Case,
    n: u64,
    published: u64,
) -> Result<(), String> {
    let Some(downstream) = &case.downstream else {
        return Ok(());
    };
    let label = case.label();
    let expected: BTreeSet<String> = orders(n as usize, published as usize)
        .into_iter()
        .map(|order| order.id)
        .collect();
    let mut got: BTreeMap<String, u64> = BTreeMap::new();
    for message in suite.broker.drain(&downstream.queue).await {
        let event: Charged = serde_json::from_slice(&message.body)
            .map_err(|error| format!("{label}: an event that is not JSON: {error}"))?;
        *got.entry(event.order_id).or_default() += 1;
    }
    let copies: u64 = got.values().map(|count| count - 1).sum();
    let missing = expected.iter().filter(|id| !got.contains_key(*id)).count();
    let strangers = got.keys().filter(|id| !expected.contains(*id)).count();
    if (copies, missing, strangers) != (0, 0, 0) {
        return Err(format!(
            "{label}: of {} distinct orders' events, {missing} missing, {copies} copies, \
             {strangers} for other orders",
            expected.len()
        ));
    }
    let unsent = db.count(&downstream.table(), "sent_at IS NULL").await;
    if unsent != 0 {
        return Err(format!("{label}: {unsent} outbox rows left unsent"));
    }
    Ok(())
}
