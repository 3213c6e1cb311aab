//! An inbox record as operators see it.

use std::time::SystemTime;

use crate::clock::from_epoch_ms;
use crate::fingerprint::Fingerprint;
use crate::store::{Row, Status};

/// An inbox record, read with [`InboxAdmin::lookup`](crate::admin::InboxAdmin::lookup).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct InboxRecord {
    /// In progress (a two-phase claim) or completed.
    pub status: Status,
    /// The content fingerprint, when the handler checks content.
    pub fingerprint: Option<Fingerprint>,
    /// The handler's stored output as JSON (`None` for `()` and other `null` outputs).
    pub output: Option<String>,
    /// How many claims the key had: 1, plus one per takeover of an expired lease.
    pub attempts: u32,
    /// When the key was first claimed.
    pub created_at: SystemTime,
    /// When the current claim started.
    pub claimed_at: SystemTime,
    /// Until when an in-progress claim is held.
    pub lease_until: Option<SystemTime>,
    /// When the handler's work was recorded.
    pub completed_at: Option<SystemTime>,
    /// When the record stops counting and may be deleted.
    pub expires_at: SystemTime,
}

impl InboxRecord {
    /// The record a row holds; `None` when its status is not one idem writes.
    pub(super) fn from_row(row: Row) -> Option<Self> {
        Some(Self {
            status: Status::parse(&row.status)?,
            fingerprint: row.fingerprint.as_deref().and_then(Fingerprint::from_bytes),
            output: row.output,
            attempts: u32::try_from(row.attempts).unwrap_or(u32::MAX),
            created_at: from_epoch_ms(row.created_at),
            claimed_at: from_epoch_ms(row.claimed_at),
            lease_until: row.lease_until.map(from_epoch_ms),
            completed_at: row.completed_at.map(from_epoch_ms),
            expires_at: from_epoch_ms(row.expires_at),
        })
    }
}
