//! Lease renewal for two-phase handlers: while the handler runs, its claim's lease is extended
//! every third of the lease, fenced on the claim token; when the claim is lost, the handler's
//! [`Context`](crate::Context) says so.

use std::time::Duration;

use sea_orm::{DatabaseConnection, DbErr};
use tokio::time::Instant;

use super::claim::ClaimRequest;
use crate::context::ClaimWatch;
use crate::store::Store;

/// What a renewal needs to know about the claim it keeps.
#[derive(Debug, Clone, Copy)]
pub(super) struct Held<'a> {
    pub(super) request: ClaimRequest<'a>,
    pub(super) token: i64,
    pub(super) lease: Duration,
    /// Taken before the claim was sent: the database's lease started no earlier.
    pub(super) claim_sent: Instant,
}

/// Renews the claim every third of its lease until it is lost, then marks `watch` and returns.
/// Never returns while the claim is held: run it beside the handler and stop polling it when
/// the handler is done.
pub(super) async fn renew_until_lost(
    store: &Store,
    db: &DatabaseConnection,
    held: Held<'_>,
    watch: &ClaimWatch,
) {
    let Held {
        request,
        token,
        lease,
        claim_sent,
    } = held;
    let renew = || store.renew(db, request.key, token, lease, request.retention);
    keep_lease(renew, lease, claim_sent, watch).await;
}

/// Why a claim could not be confirmed before its handler started.
#[derive(Debug)]
pub(super) enum Unconfirmed {
    /// Another worker took the claim over.
    TakenOver,
    /// The renewal failed.
    Failed(DbErr),
    /// The renewal took longer than the lease.
    TimedOut,
}

/// Confirms that a claim is still this worker's before its handler starts. A claim that
/// answered with less than a third of its lease left (a slow database, a stalled connection)
/// may soon be, or already be, another worker's: it is renewed first, fenced on its token, so
/// that no handler starts on a claim it may share. Returns the instant the lease now counts
/// from (`claim_sent` when it had time left), or why the claim is not confirmed.
pub(super) async fn confirm_held<F, R>(
    renew: F,
    lease: Duration,
    claim_sent: Instant,
) -> Result<Instant, Unconfirmed>
where
    F: FnOnce() -> R,
    R: Future<Output = Result<bool, DbErr>>,
{
    let sent = Instant::now();
    if sent < claim_sent + lease - lease / 3 {
        return Ok(claim_sent);
    }
    let waited = sent - claim_sent;
    let unconfirmed = match tokio::time::timeout(lease, renew()).await {
        Ok(Ok(true)) => return Ok(sent),
        Ok(Ok(false)) => Unconfirmed::TakenOver,
        Ok(Err(error)) => Unconfirmed::Failed(error),
        Err(_) => Unconfirmed::TimedOut,
    };
    tracing::warn!(
        ?waited,
        ?lease,
        why = ?unconfirmed,
        "the claim answered with less than a third of its lease left and could not be \
         confirmed; its handler is not run (is the lease shorter than the database's answers?)"
    );
    Err(unconfirmed)
}

/// The renewal loop, whatever sends the renewals: `renew` extends the lease by `lease` from
/// the database's now, `Ok(false)` when the claim is no longer this worker's.
///
/// The claim is lost when a renewal finds it no longer this worker's (taken over), or when no
/// renewal has succeeded within a lease of the last one that did. Each lease is counted from an
/// instant taken *before* its statement was sent (the first from `claim_sent`, taken before the
/// claim was), so this worker gives its claim up no later than the database lets another worker
/// take it over.
pub(crate) async fn keep_lease<F, R>(
    mut renew: F,
    lease: Duration,
    claim_sent: Instant,
    watch: &ClaimWatch,
) where
    F: FnMut() -> R,
    R: Future<Output = Result<bool, DbErr>>,
{
    let period = lease / 3;
    let mut held_until = claim_sent + lease;
    let mut next = claim_sent + period;
    loop {
        tokio::time::sleep_until(next.min(held_until)).await;
        let sent = Instant::now();
        if sent >= held_until {
            tracing::warn!(
                "the claim's lease ran out before it could be renewed; the claim is lost"
            );
            break;
        }
        match tokio::time::timeout_at(held_until, renew()).await {
            Ok(Ok(true)) => {
                held_until = sent + lease;
                next = sent + period;
            }
            Ok(Ok(false)) => {
                tracing::warn!("the claim was taken over by another worker; the claim is lost");
                break;
            }
            Ok(Err(error)) => {
                tracing::warn!(%error, "renewing the claim's lease failed; retrying");
                next = sent + (period / 3).max(MIN_RETRY);
            }
            Err(_) => {
                tracing::warn!(
                    "renewing the claim's lease took longer than the lease; the claim is lost"
                );
                break;
            }
        }
    }
    watch.set_lost();
}

/// The shortest pause before a failed renewal is tried again.
const MIN_RETRY: Duration = Duration::from_millis(10);

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[tokio::test]
    async fn a_waiter_wakes_on_loss_and_a_late_waiter_returns_at_once() {
        let watch = Arc::new(ClaimWatch::default());
        assert!(!watch.is_lost());
        let waiter = {
            let watch = Arc::clone(&watch);
            tokio::spawn(async move { watch.lost().await })
        };
        tokio::task::yield_now().await;
        watch.set_lost();
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("the waiter wakes")
            .unwrap();
        assert!(watch.is_lost());
        tokio::time::timeout(Duration::from_secs(5), watch.lost())
            .await
            .expect("a loss already seen resolves at once");
    }
}

/// The renewal loop against a simulated database and a rival worker, over seeded latencies,
/// broken connections and statements that hang (see `idem_sim`).
#[cfg(test)]
mod simulation {
    use std::cell::RefCell;
    use std::rc::Rc;

    use super::*;
    use idem_sim::{self as sim, Rng, Trace};

    /// How the simulated environment behaves.
    #[derive(Debug, Clone, Copy)]
    struct Faults {
        /// One statement in this many meets a broken connection.
        error_one_in: Option<u64>,
        /// One statement in this many hangs for two leases.
        hang_one_in: Option<u64>,
        /// The longest way to or from the database: the lease divided by this.
        latency_div: u32,
        /// Planted bug: the claim's instant taken after its answer, not before it was sent.
        instant_after_claim: bool,
        /// The defect the simulation found: a claim that answered after its lease ran out
        /// started its handler unconfirmed.
        no_confirmation: bool,
    }

    const FAULTY: Faults = Faults {
        error_one_in: Some(6),
        hang_one_in: Some(15),
        latency_div: 2,
        instant_after_claim: false,
        no_confirmation: false,
    };

    /// Answers within a third of the lease, never fails.
    const HEALTHY: Faults = Faults {
        error_one_in: None,
        hang_one_in: None,
        latency_div: 6,
        instant_after_claim: false,
        no_confirmation: false,
    };

    /// The database's side of the claim, the environment's generator and the run's trace.
    struct Env {
        rng: Rng,
        trace: Trace,
        faults: Faults,
        lease: Duration,
        /// When the claim's lease runs out, by the database's clock.
        lease_until: Instant,
        /// Whether the worker's token holds the claim: from its claim until a rival takes it.
        worker_holds: bool,
        taken_over_at: Option<Instant>,
    }

    type Shared = Rc<RefCell<Env>>;

    /// The time one way to or from the database.
    fn latency(env: &Shared) -> Duration {
        let mut env = env.borrow_mut();
        let (lease, faults) = (env.lease, env.faults);
        if env.rng.one_in(faults.hang_one_in) {
            env.trace.note("a statement hangs");
            return lease * 2;
        }
        env.rng.up_to(lease / faults.latency_div)
    }

    /// The renewal statement: extends the lease while the worker's token holds the claim.
    async fn renewal(env: Shared) -> Result<bool, DbErr> {
        tokio::time::sleep(latency(&env)).await;
        let answer = {
            let mut env = env.borrow_mut();
            let error_one_in = env.faults.error_one_in;
            if env.rng.one_in(error_one_in) {
                env.trace.note("renewal: the connection broke");
                Err(DbErr::Custom("the connection broke".into()))
            } else if env.worker_holds {
                env.lease_until = Instant::now() + env.lease;
                env.trace.note("renewal: the lease is extended");
                Ok(true)
            } else {
                env.trace.note("renewal: the claim is another worker's");
                Ok(false)
            }
        };
        tokio::time::sleep(latency(&env)).await;
        answer
    }

    /// When the worker believed it held the claim: from its handler's start to the loss of
    /// its claim, if it was lost before the handler ended.
    struct Belief {
        from: Instant,
        /// When the claim's lease ran out by the database's clock, seen as the handler started.
        lease_until: Instant,
        lost_at: Option<Instant>,
    }

    /// The worker, as the two-phase mode runs: claims, confirms the claim if it answered after
    /// its lease, then runs a handler beside the renewal loop and stops renewing when the
    /// handler ends. `None` when it gave the claim up before its handler.
    async fn worker(env: Shared) -> Option<Belief> {
        let claim_sent = Instant::now();
        tokio::time::sleep(latency(&env)).await;
        let handler_time = {
            let mut env = env.borrow_mut();
            env.lease_until = Instant::now() + env.lease;
            env.worker_holds = true;
            env.trace.note("claim: taken");
            let lease = env.lease;
            env.rng.up_to(lease * 20)
        };
        tokio::time::sleep(latency(&env)).await;
        let (lease, faults) = (env.borrow().lease, env.borrow().faults);
        let mut lease_from = if faults.instant_after_claim {
            Instant::now()
        } else {
            claim_sent
        };
        if !faults.no_confirmation {
            let confirmed = confirm_held(|| renewal(env.clone()), lease, lease_from).await;
            let Ok(confirmed) = confirmed else {
                env.borrow_mut()
                    .trace
                    .note("worker: gave the claim up unrun");
                return None;
            };
            lease_from = confirmed;
        }
        let from = Instant::now();
        let lease_until = env.borrow().lease_until;
        env.borrow_mut().trace.note("worker: the handler starts");
        let watch = ClaimWatch::default();
        let renewing = keep_lease(|| renewal(env.clone()), lease, lease_from, &watch);
        let handler = tokio::time::sleep(handler_time);
        tokio::pin!(renewing, handler);
        let mut lost_at = None;
        tokio::select! {
            biased;
            () = &mut renewing => {
                lost_at = Some(Instant::now());
                env.borrow_mut().trace.note("worker: the claim is lost");
                handler.await;
            }
            () = &mut handler => {}
        }
        env.borrow_mut().trace.note("worker: the handler ended");
        Some(Belief {
            from,
            lease_until,
            lost_at,
        })
    }

    /// A rival worker: tries to take the claim over now and then, as soon as the database lets
    /// it (its lease ran out by the database's clock).
    async fn rival(env: Shared) {
        loop {
            let pause = {
                let mut env = env.borrow_mut();
                let lease = env.lease;
                Duration::from_millis(1) + env.rng.up_to(lease / 4)
            };
            tokio::time::sleep(pause).await;
            let mut env = env.borrow_mut();
            if env.worker_holds && Instant::now() >= env.lease_until {
                env.worker_holds = false;
                env.taken_over_at = Some(Instant::now());
                env.trace.note("rival: took the claim over");
            }
        }
    }

    /// One run: a lease of 0.3 to 3 s, a handler of up to 20 leases. Fails if the rival took
    /// the claim over before the worker knew its claim lost, or, `healthy`, if the claim was
    /// lost at all.
    async fn run(mut rng: Rng, faults: Faults, healthy: bool) -> Result<String, String> {
        let lease = Duration::from_millis(300 + rng.below(2_700));
        let env = Rc::new(RefCell::new(Env {
            rng,
            trace: Trace::new(),
            faults,
            lease,
            lease_until: Instant::now(),
            worker_holds: false,
            taken_over_at: None,
        }));
        let belief = tokio::select! {
            biased;
            belief = worker(env.clone()) => belief,
            () = rival(env.clone()) => unreachable!("the rival never stops"),
        };
        let env = env.borrow();
        let ms = |at: Instant| env.trace.ms(at);
        let lost_at = belief.as_ref().and_then(|belief| belief.lost_at);
        let broken = match (env.taken_over_at, &belief) {
            (_, Some(belief)) if belief.lease_until <= belief.from => Some(format!(
                "the handler started at {} ms on a claim whose lease ran out at {} ms by the \
                 database's clock",
                ms(belief.from),
                ms(belief.lease_until)
            )),
            (Some(taken), Some(belief)) if belief.from <= taken => match belief.lost_at {
                None => Some(format!(
                    "a rival took the claim over at {} ms while the worker ran its handler; the \
                     worker never knew it lost",
                    ms(taken)
                )),
                Some(lost) if lost > taken => Some(format!(
                    "a rival took the claim over at {} ms while the worker ran its handler; the \
                     worker knew it lost only at {} ms",
                    ms(taken),
                    ms(lost)
                )),
                Some(_) => None,
            },
            (_, None) if healthy => Some("the worker gave a healthy claim up".to_owned()),
            _ if healthy && lost_at.is_some() => Some(format!(
                "the claim was lost at {} ms though every renewal answered in time",
                ms(lost_at.expect("matched"))
            )),
            _ => None,
        };
        match broken {
            Some(broken) => Err(format!("{broken}\n{}", env.trace.events())),
            None => Ok(format!(
                "{}{}{}",
                if env.taken_over_at.is_some() {
                    "taken over;"
                } else {
                    ""
                },
                if lost_at.is_some() { "lost;" } else { "" },
                if belief.is_none() {
                    "given up unrun;"
                } else {
                    ""
                },
            )),
        }
    }

    #[test]
    fn a_worker_knows_its_claim_lost_before_a_rival_can_take_it() {
        let reports = sim::check("lease renewal, faulty", 250, |rng| run(rng, FAULTY, false));
        if sim::replaying() {
            return;
        }
        // The runs met what the property is about: claims lost, taken over, given up unrun.
        for met in ["taken over", "lost", "given up unrun"] {
            assert!(reports.iter().any(|r| r.contains(met)), "no run was {met}");
        }
    }

    #[test]
    fn a_claim_whose_renewals_answer_in_time_is_never_lost() {
        sim::check("lease renewal, healthy", 200, |rng| run(rng, HEALTHY, true));
    }

    /// Finds a seed that breaks the property with `planted`, and replays it event for event.
    fn caught(planted: Faults) {
        let found = sim::first_failing(400, |rng| run(rng, planted, false));
        let (seed, error) = found.expect("the planted bug is found");
        assert!(
            error.contains("a rival took the claim over") || error.contains("lease ran out"),
            "{error}"
        );
        let replayed = sim::run_seed(seed, |rng| run(rng, planted, false));
        assert_eq!(replayed, Err(error), "the seed replays event for event");
    }

    #[test]
    fn a_lease_counted_from_the_claims_answer_is_caught_and_its_seed_replays() {
        caught(Faults {
            instant_after_claim: true,
            ..FAULTY
        });
    }

    #[test]
    fn a_handler_started_on_a_claim_that_answered_after_its_lease_is_caught() {
        caught(Faults {
            no_confirmation: true,
            ..FAULTY
        });
    }
}
