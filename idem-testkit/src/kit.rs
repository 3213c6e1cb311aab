//! The kit: its settings, and a run from the setup to the report.

use std::fmt;
use std::time::Duration;

use idem_runtime::outbox::Outbox;
use idem_runtime::sea_orm::{ConnectionTrait, DatabaseConnection};
use idem_runtime::{Handler, Inbox, Metadata};
use serde::de::DeserializeOwned;

use crate::delivery::{ending, is_two_phase, key_label};
use crate::downstream::{Downstream, Route};
use crate::effects::Effects;
use crate::error::{Error, Result};
use crate::report::{Finding, Report};
use crate::rng::seed_from_environment;
use crate::run::{Run, Setting};
use crate::schedule::{Schedule, Shape};

/// What a transport gives message `i`.
type MetadataOf<M> = Box<dyn Fn(usize, &M) -> Metadata>;

/// How many two-phase claims of one key the kit's inbox allows: more than any schedule makes.
const KIT_MAX_ATTEMPTS: u32 = 1_000;

/// Runs a handler through idem while crashing workers at every boundary, redelivering,
/// racing copies, letting leases run out and crashing the outbox relay, on the application's
/// own database; then counts each message's effects. See the [crate docs](crate).
pub struct FaultKit<M> {
    db: DatabaseConnection,
    generate: Box<dyn Fn(usize) -> M>,
    effects: Effects<M>,
    metadata: MetadataOf<M>,
    messages: usize,
    steps: Option<usize>,
    seed: Option<u64>,
    lease: Duration,
    inbox_table: String,
    outbox_table: String,
    downstream: Option<Box<dyn Route>>,
}

impl<M> FaultKit<M> {
    /// The name of the inbox table the kit makes and empties, unless told another.
    pub const DEFAULT_INBOX_TABLE: &'static str = "idem_testkit_inbox";
    /// The name of the outbox table the kit makes and empties, unless told another.
    pub const DEFAULT_OUTBOX_TABLE: &'static str = "idem_testkit_outbox";

    /// A kit on `db` (the application's database, where its handlers write) delivering the
    /// messages `generate` makes (message `i` for index `i`; the same message each time it is
    /// called with `i`, since every copy of a message is made by calling it again), whose
    /// effects `effects` counts.
    pub fn new(
        db: DatabaseConnection,
        generate: impl Fn(usize) -> M + 'static,
        effects: Effects<M>,
    ) -> Self {
        Self {
            db,
            generate: Box::new(generate),
            effects,
            // A producer's message id, the same for every copy of a message.
            metadata: Box::new(|index, _| Metadata {
                message_id: Some(format!("message-{index}")),
                ..Metadata::default()
            }),
            // Enough messages for copies of several to interleave; few enough to read a trace.
            messages: 6,
            steps: None,
            seed: None,
            // Long enough that a schedule's next steps run within it on a loaded machine,
            // short enough that letting it run out costs a run little.
            lease: Duration::from_secs(2),
            inbox_table: Self::DEFAULT_INBOX_TABLE.to_owned(),
            outbox_table: Self::DEFAULT_OUTBOX_TABLE.to_owned(),
            downstream: None,
        }
    }

    /// How many distinct messages a run delivers (default 6): indexes `0..count`.
    pub fn messages(mut self, count: usize) -> Self {
        self.messages = count;
        self
    }

    /// How many steps a run draws at random (default three per message); the steps that
    /// crash at every boundary come on top.
    pub fn steps(mut self, count: usize) -> Self {
        self.steps = Some(count);
        self
    }

    /// The seed of the schedule: the seed a report names replays its run. Without one, the
    /// seed is `IDEM_TESTKIT_SEED` when it is set, a fresh one otherwise.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// The lease of two-phase claims during a run (default 2 s): a crashed worker's claim is
    /// taken over once it has run out. Schedules replay exactly when each step takes well
    /// under it.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// The tables the kit's inbox and outbox live in (default
    /// [`DEFAULT_INBOX_TABLE`](Self::DEFAULT_INBOX_TABLE) and
    /// [`DEFAULT_OUTBOX_TABLE`](Self::DEFAULT_OUTBOX_TABLE)). The kit creates them and empties
    /// them at the start of each run: name no table the application keeps.
    pub fn tables(mut self, inbox: impl Into<String>, outbox: impl Into<String>) -> Self {
        self.inbox_table = inbox.into();
        self.outbox_table = outbox.into();
        self
    }

    /// The metadata a transport gives message `i` (default: the message id `message-<i>`).
    /// The kit adds what a broker adds to a redelivery: `redelivered`, and the
    /// `x-delivery-count` header.
    pub fn metadata(mut self, metadata: impl Fn(usize, &M) -> Metadata + 'static) -> Self {
        self.metadata = Box::new(metadata);
        self
    }

    /// A handler downstream of the outbox: the relay's steps publish what the handler under
    /// test stages, and what goes to the downstream's exchange is delivered to it, with
    /// crashes of its own; each published message must have one effect there.
    pub fn downstream<H>(mut self, downstream: Downstream<H>) -> Self
    where
        H: Handler + 'static,
        H::Message: DeserializeOwned,
    {
        self.downstream = Some(Box::new(downstream));
        self
    }

    /// Runs `handler` through the schedule of the kit's seed and counts every message's
    /// effects.
    ///
    /// # Errors
    ///
    /// The kit's inbox or outbox cannot be built, a message has effects before the run, or
    /// the database fails outside the handler. What the handler does is the report's.
    pub async fn run<H: Handler<Message = M>>(&self, handler: &H) -> Result<Report> {
        if self.messages == 0 {
            return Err(Error::NoMessages);
        }
        let seed = self.seed.unwrap_or_else(seed_from_environment);
        let (inbox, outbox) = self.prepare(handler).await?;
        let shape = Shape {
            messages: self.messages,
            steps: self.steps.unwrap_or(3 * self.messages),
            two_phase: is_two_phase(handler),
            downstream: self.downstream.as_ref().map(|route| route.two_phase()),
        };
        let schedule = Schedule::draw(seed, shape);
        let setting = Setting {
            inbox: &inbox,
            outbox: &outbox,
            handler,
            generate: &*self.generate,
            metadata: &*self.metadata,
            downstream: self.downstream.as_deref(),
            lease: self.lease,
            two_phase: shape.two_phase,
        };
        let mut run = Run::new(setting, self.messages);
        run.take(&schedule).await?;
        let mut findings = self.upstream_findings(handler, &run).await?;
        findings.extend(self.downstream_findings(&run).await?);
        Ok(Report {
            seed,
            schedule,
            findings,
            trace: run.trace,
        })
    }

    /// Builds the kit's outbox and inbox, empties them, and checks that no message has
    /// effects yet.
    async fn prepare<H: Handler<Message = M>>(&self, handler: &H) -> Result<(Inbox, Outbox)> {
        let outbox = Outbox::builder(self.db.clone())
            .table(self.outbox_table.as_str())
            .build()
            .await
            .map_err(Error::Setup)?;
        let mut builder = Inbox::builder(self.db.clone())
            .table(self.inbox_table.as_str())
            // The kit crashes workers on purpose: a message whose two-phase claims it crashed
            // five times is not one that needs an operator.
            .max_attempts(KIT_MAX_ATTEMPTS)
            .outbox(outbox.clone());
        let consumers = std::iter::once((handler.consumer(), is_two_phase(handler)))
            .chain((self.downstream.iter()).map(|route| (route.consumer(), route.two_phase())));
        for (consumer, two_phase) in consumers {
            if two_phase {
                builder = builder.lease(consumer, self.lease);
            }
        }
        let inbox = builder.build().await.map_err(Error::Setup)?;
        for table in [inbox.table().as_str(), outbox.table().as_str()] {
            self.db
                .execute_unprepared(&format!("DELETE FROM {table}"))
                .await?;
        }
        for index in 0..self.messages {
            let effects = self
                .effects
                .count(&self.db, &(self.generate)(index))
                .await?;
            if effects != 0 {
                return Err(Error::EffectsBeforeRun {
                    message: index,
                    effects,
                });
            }
        }
        Ok((inbox, outbox))
    }

    /// The generated messages whose effects were not counted once.
    async fn upstream_findings<H: Handler<Message = M>>(
        &self,
        handler: &H,
        run: &Run<'_, H>,
    ) -> Result<Vec<Finding>> {
        let mut findings = Vec::new();
        for (index, standing) in run.standings.iter().enumerate() {
            let message = (self.generate)(index);
            let effects = self.effects.count(&self.db, &message).await?;
            if effects == 1 {
                continue;
            }
            let metadata = (self.metadata)(index, &message);
            let ended = ending(standing.last.as_ref());
            findings.push(Finding {
                consumer: handler.consumer().to_owned(),
                message: format!("#{index}"),
                key: key_label(handler, &message, &metadata),
                effects,
                expected: 1,
                ended,
            });
        }
        Ok(findings)
    }

    /// The published messages whose effects downstream were not counted once.
    async fn downstream_findings<H: Handler<Message = M>>(
        &self,
        run: &Run<'_, H>,
    ) -> Result<Vec<Finding>> {
        let Some(route) = self.downstream.as_deref() else {
            return Ok(Vec::new());
        };
        let mut findings = Vec::new();
        for published in run.broker.routed() {
            let (effects, key) = route.count(&self.db, published).await?;
            if effects == 1 {
                continue;
            }
            let ended = ending(run.downstream_last.get(&published.message_id));
            findings.push(Finding {
                consumer: route.consumer().to_owned(),
                message: format!("message id {}", published.message_id),
                key,
                effects,
                expected: 1,
                ended,
            });
        }
        Ok(findings)
    }
}

impl<M> fmt::Debug for FaultKit<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultKit")
            .field("messages", &self.messages)
            .field("steps", &self.steps)
            .field("seed", &self.seed)
            .field("lease", &self.lease)
            .field("inbox_table", &self.inbox_table)
            .field("outbox_table", &self.outbox_table)
            .field("effects", &self.effects)
            .field(
                "downstream",
                &self.downstream.as_ref().map(|d| d.consumer()),
            )
            .finish_non_exhaustive()
    }
}
