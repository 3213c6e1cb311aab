//! Lease renewal for two-phase handlers: while the handler runs, its claim's lease is extended
//! every third of the lease, fenced on the claim token; when the claim is lost, the handler's
//! [`Context`](crate::Context) says so.

use std::time::Duration;

use sea_orm::DatabaseConnection;
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
///
/// The claim is lost when a renewal finds it no longer this worker's (taken over), or when no
/// renewal has succeeded within a lease of the last one that did. Each lease is counted from an
/// instant taken *before* its statement was sent, so this worker gives its claim up no later
/// than the database lets another worker take it over.
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
        let renewal = store.renew(db, request.key, token, lease, request.retention);
        match tokio::time::timeout_at(held_until, renewal).await {
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
