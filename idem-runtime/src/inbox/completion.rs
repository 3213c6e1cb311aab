//! Completing a two-phase claim once its handler has run: the side effect has happened, so
//! the claim is completed while it is still this worker's, however long the database takes
//! to come back within the lease.

use std::time::Duration;

use sea_orm::{DatabaseConnection, DbErr};
use tokio::time::Instant;

use super::claim::ClaimRequest;
use crate::context::ClaimWatch;
use crate::delivery::Backoff;
use crate::store::dialect::{Failure, classify, refuses_value};
use crate::store::{Status, Store};

/// How many times a completion the database refuses for a reason of its own (a statement
/// timeout, a trigger's exception) is tried.
const REFUSED_ATTEMPTS: u32 = 4;

/// The waits between tries.
const BACKOFF: Backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));

/// Completes the claim `token` holds on `request.key` with `output`. A failure that may pass
/// (the database unreachable or contended) is tried again for as long as the claim is held
/// (`watch`, whose renewal must go on meanwhile), and at most a `lease` long: a claim left in
/// progress makes a redelivery wait out the lease and repeat the side effect. A refusal of the
/// database's own is tried [`REFUSED_ATTEMPTS`] times, a refused value once. A completion that
/// a try made but whose reply was lost counts as made. Returns whether the claim was completed
/// (`false`: it was no longer this worker's).
pub(super) async fn complete_while_held(
    store: &Store,
    db: &DatabaseConnection,
    (request, token): (ClaimRequest<'_>, i64),
    output: Option<&str>,
    watch: &ClaimWatch,
    lease: Duration,
) -> Result<bool, DbErr> {
    let started = Instant::now();
    let mut attempt = 1;
    loop {
        let tried = store
            .complete(db, request.key, token, output, request.retention)
            .await;
        let error = match tried {
            // An earlier try may have completed it, its reply lost.
            Ok(false) if attempt > 1 => match store.find(db, request.key).await {
                Ok(row) => {
                    return Ok(row.is_some_and(|row| {
                        row.claim_token == token
                            && Status::parse(&row.status) == Some(Status::Completed)
                    }));
                }
                Err(error) => error,
            },
            Ok(completed) => return Ok(completed),
            Err(error) if refuses_value(&error) => return Err(error),
            Err(error) => error,
        };
        let refused = classify(&error) == Failure::Refused;
        let given_up = watch.is_lost() || started.elapsed() >= lease;
        if given_up || (refused && attempt >= REFUSED_ATTEMPTS) {
            return Err(error);
        }
        tracing::warn!(%error, attempt, "completing the claim failed; retrying");
        tokio::select! {
            () = tokio::time::sleep(BACKOFF.after(attempt)) => {}
            () = watch.lost() => {}
        }
        attempt += 1;
    }
}
