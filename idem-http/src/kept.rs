//! What a response says of its keeping: the headers of a replay and of the key's retention, and
//! the mark of a response (or an error) that is not kept.

/// The header a replayed response carries (`true`), as payment APIs name it.
pub const REPLAYED_HEADER: &str = "idempotent-replayed";

/// The header publishing how long a completed request's key is kept, in seconds.
pub const RETENTION_HEADER: &str = "idempotency-key-retention";

/// In a response's extensions: send the response but store nothing, leaving the key free (a
/// request the service found invalid before doing anything).
///
/// As a layered service's error (boxed, such as `.map_err(|_| NotStored)` on a load shedder's
/// `Overloaded`): the service did not run the request, so the key is freed and the client gets
/// 503. Any other error of a service once called is kept as a 500, since its effects may stand.
#[derive(Debug, Clone, Copy, Default, thiserror::Error)]
#[error("the service did not run the request")]
pub struct NotStored;
