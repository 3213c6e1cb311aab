//! Batch mode: many messages of one transactional consumer in one transaction, each message
//! settled as it would be on its own.
//!
//! The path of a batch, file by file:
//! - `fates.rs`: the items sorted into first copies of each key (in key order), later copies,
//!   and the results known before any statement; at the end, each fate turned into a result;
//! - `attempt.rs`: the batch's transaction, tried until it commits or is lost;
//! - `claims.rs`: a try begins with one statement claiming every key, and one reading the
//!   known ones;
//! - `guard.rs`: the fresh messages' handlers run under a savepoint each, or unguarded with the
//!   transaction checked;
//! - `slice.rs`: or a slice handler runs them all in one call, culprits found by halving;
//! - `finish.rs`: one statement completes the processed messages, one commit;
//! - `lost.rs`: why a try ended without committing, and what each message gets then.
//!
//! Records that need more than a read (expired, or held by a two-phase claim), and later
//! copies of a key whose first copy was left for later, are processed on their own after the
//! commit, by the per-message path.

mod attempt;
mod claims;
mod fates;
mod finish;
mod guard;
mod item;
mod lost;
mod run;
mod slice;

pub use item::{BatchChecks, BatchItem, MAX_BATCH};
