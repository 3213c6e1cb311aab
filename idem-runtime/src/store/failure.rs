//! What a database error means for the message being processed, as every backend's room
//! classifies its driver's errors.

/// What a database error means for the message being processed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
// Without a driver compiled in, only the driver-independent kinds can occur.
#[cfg_attr(
    not(any(feature = "sqlite", feature = "postgres", feature = "mysql")),
    allow(dead_code)
)]
pub(crate) enum Failure {
    /// The database could not be reached: no connection, a connection lost, no pooled
    /// connection free in time, the server shutting down.
    Unreachable,
    /// A deadlock or a serialization failure: the database rolled the transaction back, and
    /// trying it again can succeed.
    Deadlock,
    /// A lock was not granted in time (a lock wait timeout, a busy SQLite file).
    LockTimeout,
    /// The transaction had already failed: PostgreSQL ignores every statement after a failed one.
    Aborted,
    /// The database refused the statement itself.
    Refused,
}
