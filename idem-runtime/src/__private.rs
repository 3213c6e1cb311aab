//! Items used by the code `#[idempotent]` generates. Not a public API: it changes without notice.
