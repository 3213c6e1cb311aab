//! A run: the schedule's steps taken one after the other against the real inbox, outbox and
//! handlers, then the drain, as a broker, a relay and crashing workers would take them.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use idem_runtime::outbox::Outbox;
use idem_runtime::sea_orm::DbErr;
use idem_runtime::{Handler, Inbox, Metadata};

use crate::delivery::{DRAIN_ATTEMPTS, Fate, deliver, delivery_metadata, pause_after};
use crate::downstream::Route;
use crate::relay::{Broker, RELAY_STEP_BATCH, relay, relay_everything};
use crate::schedule::{Boundary, Schedule, Step};

/// How much longer than a lease the kit waits for it to have run out: leases are measured by
/// the database's clock, and the claim was last written a little before the crash was seen.
const LEASE_MARGIN: Duration = Duration::from_millis(100);

/// How many rounds of relaying and delivering downstream the drain makes at most: a downstream
/// handler that stages messages for its own exchange makes more than one.
const DRAIN_ROUNDS: usize = 10;

/// What the run needs of the kit's settings.
pub(crate) struct Setting<'a, H: Handler> {
    pub(crate) inbox: &'a Inbox,
    pub(crate) outbox: &'a Outbox,
    pub(crate) handler: &'a H,
    pub(crate) generate: &'a dyn Fn(usize) -> H::Message,
    pub(crate) metadata: &'a dyn Fn(usize, &H::Message) -> Metadata,
    pub(crate) downstream: Option<&'a dyn Route>,
    pub(crate) lease: Duration,
    pub(crate) two_phase: bool,
}

/// Where a message stands with the kit's broker.
#[derive(Debug, Clone, Default)]
pub(crate) struct Standing {
    /// How many times it was delivered.
    pub(crate) deliveries: u32,
    /// What its last delivery gave; `None` before the first.
    pub(crate) last: Option<Fate>,
}

impl Standing {
    /// Whether the broker is done with it.
    pub(crate) fn settled(&self) -> bool {
        self.last.as_ref().is_some_and(Fate::settled)
    }
}

/// A run in progress.
pub(crate) struct Run<'a, H: Handler> {
    setting: Setting<'a, H>,
    /// The generated messages, by index.
    pub(crate) standings: Vec<Standing>,
    /// What the last delivery of each downstream message gave, by message id.
    pub(crate) downstream_last: HashMap<String, Fate>,
    pub(crate) broker: Broker,
    /// When the last crash left a two-phase claim in progress, until its lease runs out.
    claim_left_at: Option<Instant>,
    pub(crate) trace: Vec<String>,
}

impl<'a, H: Handler> Run<'a, H> {
    pub(crate) fn new(setting: Setting<'a, H>, messages: usize) -> Self {
        let exchange = setting.downstream.map(|route| route.exchange().to_owned());
        Self {
            setting,
            standings: vec![Standing::default(); messages],
            downstream_last: HashMap::new(),
            broker: Broker::bound_to(exchange),
            claim_left_at: None,
            trace: Vec::new(),
        }
    }

    /// Takes every step of `schedule`, then drains.
    pub(crate) async fn take(&mut self, schedule: &Schedule) -> Result<(), DbErr> {
        for (number, step) in schedule.steps.iter().enumerate() {
            let what = self.step(*step).await?;
            let line = format!("{:>3}. {}: {what}", number + 1, schedule.describe(step));
            self.trace.push(line);
        }
        self.drain().await
    }

    /// Takes one step; returns what it gave, in words.
    async fn step(&mut self, step: Step) -> Result<String, DbErr> {
        Ok(match step {
            Step::Deliver { message } => self.deliver(message, None).await.describe(),
            Step::Crash { message, at } => self.deliver(message, Some(at)).await.describe(),
            Step::Concurrent { message, copies } => self.concurrent(message, copies).await,
            Step::ExpireLeases => self.expire_leases().await,
            Step::Relay { crash } => {
                let outbox = self.setting.outbox;
                relay(outbox, &mut self.broker, crash, RELAY_STEP_BATCH).await?
            }
            Step::DeliverDownstream { crash } => match self.deliver_downstream(crash).await {
                Some(fate) => fate.describe(),
                None => "nothing published to deliver".to_owned(),
            },
        })
    }

    /// The metadata of the next delivery of message `index`, counting it.
    fn next_delivery(&mut self, index: usize) -> (H::Message, Metadata) {
        let message = (self.setting.generate)(index);
        let base = (self.setting.metadata)(index, &message);
        let standing = &mut self.standings[index];
        let metadata = delivery_metadata(&base, standing.deliveries);
        standing.deliveries += 1;
        (message, metadata)
    }

    /// Delivers message `index` once, crashing at `crash`.
    async fn deliver(&mut self, index: usize, crash: Option<Boundary>) -> Fate {
        let (message, metadata) = self.next_delivery(index);
        let Setting {
            inbox,
            handler,
            two_phase,
            ..
        } = self.setting;
        let fate = deliver(inbox, handler, message, &metadata, crash).await;
        self.note_crash(&fate, two_phase);
        self.standings[index].last = Some(fate.clone());
        fate
    }

    /// Delivers `copies` copies of message `index` at once.
    async fn concurrent(&mut self, index: usize, copies: usize) -> String {
        let deliveries: Vec<_> = (0..copies).map(|_| self.next_delivery(index)).collect();
        let Setting { inbox, handler, .. } = self.setting;
        let fates = join_all(
            deliveries
                .into_iter()
                .map(|(message, metadata)| async move {
                    deliver(inbox, handler, message, &metadata, None).await
                }),
        )
        .await;
        let unsettled = fates.iter().find(|fate| !fate.settled());
        let last = unsettled.unwrap_or(&fates[0]).clone();
        self.standings[index].last = Some(last);
        let described: Vec<String> = fates.iter().map(Fate::describe).collect();
        described.join(", ")
    }

    /// Remembers a crash that left a two-phase claim in progress.
    fn note_crash(&mut self, fate: &Fate, two_phase: bool) {
        let left_claim = matches!(
            fate,
            Fate::Crashed(Boundary::BeforeHandler | Boundary::AfterHandler)
        );
        if two_phase && left_claim {
            self.claim_left_at = Some(Instant::now());
        }
    }

    /// Waits until the leases that crashed workers left have run out.
    async fn expire_leases(&mut self) -> String {
        match self.claim_left_at.take() {
            Some(crashed) => {
                let until = crashed + self.setting.lease + LEASE_MARGIN;
                tokio::time::sleep_until(until.into()).await;
                "the leases ran out".to_owned()
            }
            None => "no crashed claim held a lease".to_owned(),
        }
    }

    /// Delivers the message at the head of the kit's queue downstream, crashing at `crash`;
    /// `None` when the queue is empty.
    async fn deliver_downstream(&mut self, crash: Option<Boundary>) -> Option<Fate> {
        let route = self.setting.downstream?;
        let published = self.broker.next()?;
        let fate = route.deliver(self.setting.inbox, &published, crash).await;
        self.note_crash(&fate, route.two_phase());
        (self.downstream_last).insert(published.message_id.clone(), fate.clone());
        if !fate.settled() {
            self.broker.requeue(published);
        }
        Some(fate)
    }

    /// Delivers every message not yet acknowledged until it is, then relays and delivers
    /// downstream until nothing is left.
    async fn drain(&mut self) -> Result<(), DbErr> {
        for index in 0..self.standings.len() {
            let mut attempts = 0;
            while !self.standings[index].settled() && attempts < DRAIN_ATTEMPTS {
                attempts += 1;
                let fate = self.deliver(index, None).await;
                self.trace
                    .push(format!("drain: #{index}: {}", fate.describe()));
                if !fate.settled() {
                    tokio::time::sleep(pause_after(&fate, attempts)).await;
                }
            }
        }
        if self.setting.downstream.is_some() {
            for _ in 0..DRAIN_ROUNDS {
                let published = relay_everything(self.setting.outbox, &mut self.broker).await?;
                self.trace.push(format!("drain: relayed {published}"));
                if published == 0 && self.broker.is_empty() {
                    break;
                }
                self.drain_downstream().await;
            }
        }
        Ok(())
    }

    /// Delivers everything in the kit's queue downstream until each is acknowledged (or given
    /// up on).
    async fn drain_downstream(&mut self) {
        let Some(route) = self.setting.downstream else {
            return;
        };
        while let Some(published) = self.broker.next() {
            let mut attempts = 0;
            let mut copy = published;
            loop {
                attempts += 1;
                let fate = route.deliver(self.setting.inbox, &copy, None).await;
                let line = format!("drain: downstream {}: {}", copy.message_id, fate.describe());
                self.trace.push(line);
                let settled = fate.settled();
                (self.downstream_last).insert(copy.message_id.clone(), fate.clone());
                if settled || attempts >= DRAIN_ATTEMPTS {
                    break;
                }
                tokio::time::sleep(pause_after(&fate, attempts)).await;
                copy.deliveries += 1;
            }
        }
    }
}
