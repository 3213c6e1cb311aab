//! Effectively-once message processing: the Idempotent Consumer (Inbox) pattern on sea-orm.
//!
//! Brokers deliver at least once: a producer retries, an acknowledgment is lost, a consumer
//! crashes after its write. idem keeps an inbox of processed message keys in the application's
//! own database and commits it atomically with the handler's effects, so processing a message
//! twice has the effect of processing it once.
//!
//! # How it works
//!
//! A [`Handler`] names its consumer, derives a [`MessageKey`] from each message and, by default,
//! a [`Fingerprint`] of its content. [`Inbox::process`] then:
//!
//! 1. claims the inbox key `(consumer, message key)` with one atomic conditional insert: the
//!    table's primary key, not application code, decides between concurrent copies;
//! 2. on a fresh claim, runs the handler and records its output, so a duplicate gets the same
//!    output back ([`Outcome::Duplicate`]) without running the handler;
//! 3. refuses a known key with different content ([`Error::FingerprintMismatch`]): a reused key
//!    is dead-lettered, never dropped and never processed.
//!
//! In [`Mode::Transactional`] (the default) the claim, the handler's writes (through
//! [`Context::transaction`]) and the output are one transaction: a crash anywhere before the
//! commit leaves nothing, and after it the redelivery finds the record. [`Mode::TwoPhase`] is for
//! effects that cannot join the transaction; see its documentation for what it guarantees.
//!
//! Every [`Error`] carries its [`Settle`](transport::Settle) decision — acknowledge, requeue or dead-letter — for
//! the transport adapter (`idem-rabbitmq`). Records expire after their retention
//! ([`RetentionPolicy`], 7 days by default, checked against the broker's
//! [`RedeliveryWindow`]); the [`Cleaner`](retention::Cleaner) deletes them in bounded batches.
//!
//! # Example
//!
//! ```
//! use idem_runtime::{Context, Fingerprint, FingerprintError, Handler, Inbox, KeyError,
//!                    MessageKey, Metadata, Outcome};
//! use sea_orm::sea_query::Query;
//! use sea_orm::{ConnectionTrait, Statement};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize)]
//! struct OrderPlaced { id: String, amount: i64 }
//!
//! struct Billing;
//!
//! impl Handler for Billing {
//!     type Message = OrderPlaced;
//!     type Output = i64;
//!     type Error = sea_orm::DbErr;
//!
//!     fn consumer(&self) -> &str { "billing" }
//!     fn key(&self, order: &OrderPlaced, _: &Metadata) -> Result<MessageKey, KeyError> {
//!         MessageKey::new(order.id.as_str())
//!     }
//!     fn fingerprint(&self, order: &OrderPlaced, meta: &Metadata)
//!         -> Result<Option<Fingerprint>, FingerprintError> {
//!         meta.content_fingerprint(order).map(Some)
//!     }
//!     async fn handle(&self, cx: &Context<'_>, order: OrderPlaced) -> Result<i64, sea_orm::DbErr> {
//!         let tx = cx.transaction().expect("transactional handler");
//!         // sea-query writes the statement for whichever backend `tx` is on.
//!         let insert = Query::insert()
//!             .into_table("charges")
//!             .columns(["order_id", "amount"])
//!             .values_panic([order.id.into(), order.amount.into()])
//!             .to_owned();
//!         tx.execute(&insert).await?;
//!         Ok(order.amount)
//!     }
//! }
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let db = sea_orm::Database::connect("sqlite::memory:").await?;
//! db.execute_unprepared("CREATE TABLE charges (order_id TEXT, amount INTEGER)").await?;
//! let inbox = Inbox::builder(db.clone()).build().await?;
//!
//! let order = || OrderPlaced { id: "o-1".into(), amount: 42 };
//! let meta = Metadata::default();
//! assert_eq!(inbox.process(&Billing, order(), &meta).await?, Outcome::Processed(42));
//! assert_eq!(inbox.process(&Billing, order(), &meta).await?, Outcome::Duplicate(42));
//!
//! let charges = db.query_one_raw(Statement::from_string(
//!     db.get_database_backend(), "SELECT COUNT(*) FROM charges",
//! )).await?.unwrap().try_get_by_index::<i64>(0)?;
//! assert_eq!(charges, 1);
//! # Ok(()) }
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo()).unwrap();
//! ```
//!
//! # What a transactional handler may do
//!
//! - Write its effects through the transaction it is given, and nothing else: they commit with
//!   the inbox record or not at all. Writes on another connection are not undone when the
//!   message is requeued (with SQLite's single-connection pool they would even wait forever).
//! - Run a statement that is expected to fail inside a savepoint (`tx.begin()`), and roll the
//!   savepoint back on failure. Carrying on after a failed statement in the transaction itself
//!   is refused with [`Error::TransactionAborted`] on PostgreSQL, which aborts the whole
//!   transaction at the first failure.
//! - Return the error of any other failed statement: the inbox records nothing, and tells an
//!   unreachable database ([`Error::StoreUnavailable`]) from the handler's own failure.
//! - Not commit or roll back the transaction itself: the inbox completes it.
//!
//! # Where to find what
//!
//! The crate's root holds what a handler's author uses: the handler traits, the inbox and its
//! errors, keys and fingerprints, and the outbox a handler stages into. The rest is grouped by
//! who needs it:
//!
//! - [`admin`]: for operators and their tools (the `idem` command): counts, lookups, claims
//!   ended, records forgotten, held runs lifted;
//! - [`transport`]: for adapters between a broker and the inbox (settle decisions, dead-letter
//!   reasons, the delivery policy, batch items);
//! - [`outbox`]: for relays that publish what handlers staged;
//! - [`retention`]: the cleaner that deletes expired records;
//! - [`schema`]: the tables' DDL, for migrations run by hand;
//! - [`metrics`]: every metric name the crate records, with its labels.
//!
//! # Guarantees
//!
//! Each line names the test that proves it (in `tests/tests/` and `examples/tests/`), against
//! SQLite, PostgreSQL and MariaDB unless it says otherwise.
//!
//! | fault | what holds | test |
//! |---|---|---|
//! | 32 copies of a message at once | one effect, one `Processed`, the rest `Duplicate` | `inbox::thirty_two_concurrent_copies_have_one_effect` |
//! | the handler fails or panics before the commit | nothing recorded, no effect; the redelivery runs it | `inbox::handler_error_before_commit_records_nothing`, `inbox::handler_panic_before_commit_records_nothing` |
//! | the handler carries on after a failed statement, or its transaction was rolled back under it | never reported `Processed`: `TransactionAborted`, requeued | `edges_transactions::*::a_handler_that_swallows_a_failed_statement_is_never_reported_processed`, `edges_transactions::*::a_transaction_the_handler_rolled_back_is_not_reported_processed` |
//! | a crash after the commit, before the acknowledgment | the redelivery is a duplicate (RabbitMQ, PostgreSQL) | `rabbitmq_duplicates::crash_after_commit_before_ack_is_redelivered_and_recognised`, `billing_demo::billing_service_charges_each_order_once_through_demo_crash_and_restart` |
//! | the database goes away during the handler | an outage (`StoreUnavailable`), not counted against the delivery limit; processed once it is back (PostgreSQL, MariaDB) | `edges_outage::servers::*::an_outage_inside_the_handler_is_an_outage` |
//! | the database is unreachable | requeued uncounted, processed once when it is back (RabbitMQ, PostgreSQL) | `rabbitmq_outage::database_unavailable_requeues_and_processes_once_it_is_back` |
//! | the database takes no writes (read-only, a failover's demoted primary) | an outage (`StoreUnavailable`), requeued uncounted (PostgreSQL) | `edges_outage::a_database_that_takes_no_writes_is_an_outage` |
//! | the completion is refused for a reason of the database's own (a statement timeout) | `Database`, requeued and counted; not dead-lettered as an output that cannot be stored (PostgreSQL) | `edges_transactions::a_completion_that_times_out_is_retried_not_dead_lettered` |
//! | a constraint checked at the commit refuses one message of a batch | that message fails alone; the others commit (PostgreSQL) | `batch::server::postgres::a_commit_a_deferred_constraint_refuses_fails_only_its_message` |
//! | a batch meets a database that takes no writes, or a pool with no free connection | each message gets the database's own error and is retried as it would be alone, never counted against its delivery limit | `batch_faults::*::a_batch_on_a_database_that_takes_no_writes_keeps_the_outage_kind`, `batch_faults::*::a_batch_whose_pool_has_no_free_connection_keeps_the_outage_kind`, `rabbitmq_batch::*::a_batching_consumer_never_counts_a_database_that_takes_no_writes` |
//! | a handler of a batch loses a database of its own (another database it reads is down) | that message is an outage, as alone; the others commit | `batch_faults::*::a_handler_that_loses_its_own_database_fails_alone`, `rabbitmq_batch::*::a_handler_whose_own_database_is_down_holds_up_no_other_delivery` |
//! | a handler's output is larger than MySQL/MariaDB's `max_allowed_packet` | `OutputNotStorable`, dead-lettered, per message and in a batch, whose other messages commit | `batch_faults::server::mysql::an_output_larger_than_a_packet_fails_alone`, `rabbitmq_batch::server::mysql::an_output_larger_than_a_packet_is_dead_lettered_alone` |
//! | a slice handler's call fails (an error, a panic, an output missing) | the failing messages are found by halving the slice and fail alone; the others commit once | `slices::*::a_mixed_slice_batch_settles_each_message_as_it_would_alone`, `slices::*::a_failing_message_is_found_by_halving`, `rabbitmq_batch::*::a_slicing_binding_settles_each_delivery_as_it_would_alone` |
//! | slices of two processes share keys | one effect per key | `slices::*::slices_from_two_processes_sharing_keys_have_one_effect_per_key` |
//! | a slice handler's own database is unreachable, or a lock is not granted in time | the whole slice fails in one call, each message requeued uncounted | `slices::*::an_outage_of_the_handlers_own_database_fails_its_slice_in_one_call` |
//! | a deadlock rolls a batch's transaction back under a slice (MariaDB) | its messages are requeued as contention, uncounted; nothing of the batch commits; the next delivery processes them | `slices::server::mysql::a_deadlock_under_a_slice_requeues_its_messages` |
//! | a trigger refuses a record's completion | `Database` (requeued, counted), per message and in a batch, on every backend | `batch_faults::*::a_trigger_refusing_an_output_is_classified_as_it_is_alone` |
//! | an expired record is held by a long transaction while the cleaner runs | the cleaner leaves it for a later run and deletes the rest at once (PostgreSQL, MariaDB) | `cleanup::servers::*::a_record_a_long_transaction_holds_is_left_and_the_rest_deleted` |
//! | a handler carries on after its transaction was rolled back (a MySQL/MariaDB deadlock or a SQLite error it ignored, its own `ROLLBACK`), and stages an event | nothing is staged (the insert checks that the transaction still holds the run's inbox claim); `TransactionAborted` | `outbox::*::nothing_is_staged_once_the_handlers_transaction_is_lost` |
//! | a staging outside a handler whose connection fails after its insert (PostgreSQL) | the error means nothing was staged; a keyed message retried is one message | `outbox_staging::servers::postgres::a_staging_that_reports_a_failure_committed_nothing`, `outbox_staging::*::a_keyed_staging_retried_is_one_message` |
//! | a handler's staging is refused and retried | the kept staging takes the position: a replay derives the same ids | `outbox_staging::*::a_staging_that_failed_uses_up_no_position` |
//! | a named run's message is not taken by the broker | the rest of its run waits; messages of no run and other runs go out | `outbox_staging::*::a_named_run_goes_out_in_order_and_a_held_message_holds_back_the_rest`, `outbox_staging::*::messages_outside_runs_hold_back_nothing` |
//! | a relay is killed (SIGKILL) in the middle of a 100 k backlog (PostgreSQL, MariaDB) | the next relay publishes the rest: every message, each id once after deduplication, each run in order | `outbox_backlog::*::a_relay_killed_mid_backlog_loses_nothing_and_keeps_runs_in_order` |
//! | processes of this version start at once on an outbox table of the earlier one | all start; the table is upgraded once; its pending messages go out | `outbox_staging::*::processes_starting_at_once_upgrade_an_earlier_versions_table` |
//! | entity mode: 64 copies of one message in four processes at once | one entity, one effect: one `Processed`, every other copy `Duplicate` | `entity::*::sixty_four_copies_in_four_processes_make_one_entity` |
//! | entity mode: a reused key with other content | `FingerprintMismatch`, dead-lettered; the stored entity untouched | `entity::*::a_reused_key_with_other_content_is_dead_lettered` |
//! | entity mode: the handler fails after creating its entity, or returns without creating one | the entity and every write roll back; the retry is processed; without a marker, `MarkerMissing`, dead-lettered | `entity::*::a_failure_after_the_marker_leaves_nothing_and_the_retry_charges`, `entity::*::a_handler_that_creates_no_marker_commits_nothing` |
//! | entity mode: the database is lost after the marker was created, before the commit | an outage, requeued uncounted; once it is back the order is charged once | `entity::servers::*::a_database_lost_after_the_marker_is_an_outage_and_charges_once` |
//! | entity mode: a key that a MySQL/MariaDB collation merges with a stored one (another case) | refused, not taken for a duplicate | `entity::server::mysql::keys_a_collation_merges_are_refused_not_taken_for_duplicates` |
//! | entity mode: the handler carries on after a failed statement aborted its transaction (PostgreSQL) | `TransactionAborted`, requeued; nothing is reported processed | `entity::server::postgres::a_handler_carrying_on_after_an_aborted_transaction_commits_nothing` |
//! | a naturally idempotent handler gets its events out of order, each twice | the newest state; every copy runs, no record kept; on RabbitMQ its errors settle with their reasons | `statuses::*::out_of_order_states_end_in_the_newest`, `statuses::a_natural_handler_keeps_the_delivery_policy_on_rabbitmq` (idem-examples) |
//! | a caller drops a run while its transaction begins (a consumer stopping, an HTTP client hanging up) | the connection goes back to the pool outside any transaction (PostgreSQL, every answer delayed 20 ms; SQLite) | `cancellation::postgres_a_run_cancelled_while_it_begins_leaves_no_transaction_open`, `cancellation::sqlite::a_run_cancelled_at_any_moment_leaves_its_connection_outside_any_transaction` |
//! | HTTP (idem-http): 32 concurrent retries of one `Idempotency-Key`, on the layer and on the transactional endpoint | one effect (and one staged event); every retry gets the stored response or 409 | `http::*::thirty_two_concurrent_retries_have_one_effect` |
//! | HTTP: clients hang up at every moment of their requests | each request runs to its end once; its retry gets its response; no pooled connection is lost | `http::*::clients_hanging_up_at_any_moment_leave_each_request_once` |
//! | HTTP: the database is cut while a transactional endpoint runs (PostgreSQL, MariaDB) | 503 with `Retry-After`, nothing stored; the retry places the order once | `http::servers::*::a_database_lost_mid_request_answers_503_and_the_retry_runs_once` |
//! | a copy arrives while a long transactional handler holds the key | it waits at most the claim wait, then is requeued uncounted | `edges_transactions::*::a_copy_waits_a_bounded_time_for_a_long_handler_then_is_requeued_uncounted` |
//! | a two-phase handler runs longer than its lease | the lease is renewed: other workers are told `InProgressElsewhere` all along, one effect, `Processed` | `edges_two_phase::*::a_two_phase_handler_that_outlives_its_lease_keeps_its_claim` |
//! | a two-phase worker cannot reach the database while its handler runs | its renewals fail; once its lease has run out it knows (`Context::claim_lost`, `Context::lost`), one other worker takes over (attempt 2), and its own completion is refused (PostgreSQL, MariaDB) | `edges_two_phase::servers::*::a_handler_whose_renewals_are_cut_sees_the_loss_and_one_worker_takes_over` |
//! | a two-phase lease runs out while its handler runs (its renewals fail) | one takeover; the stale worker cannot complete | `inbox::two_phase_lease_takeover_fences_the_stale_worker` |
//! | a two-phase worker whose lease ran out completes while another worker, which read the record before, takes it over (PostgreSQL) | the completion stands: the other worker gets `Duplicate`, the handler ran once | `edges_two_phase::a_takeover_never_reopens_a_record_completed_while_it_waited` |
//! | takeovers keep failing | `NeedsIntervention` after the maximum, dead-lettered | `inbox::two_phase_max_takeovers_needs_intervention` |
//! | a two-phase handler fails | the claim is released, the redelivery retries; a takeover's claim is handed on (its lease ended), so the redelivery knows it follows earlier attempts (attempt 3) and counts toward `max_attempts` | `inbox::two_phase_releases_the_claim_when_the_handler_fails`, `edges_two_phase::a_failed_takeover_hands_its_claim_on_with_its_history` |
//! | a two-phase handler's side effect is done and the database is lost for less than the lease | the completion is tried until it is back: `Processed`, one effect | `edges_two_phase::a_two_phase_completion_outlasts_a_short_outage` |
//! | a two-phase output cannot be stored (serialization, the database refuses it) | the record completes without it; no redelivery repeats the effect | `inbox::two_phase_output_that_cannot_be_stored_still_completes_the_record`, `edges_two_phase::*::two_phase_output_the_database_refuses_completes_the_record_without_it` |
//! | a record past its retention | behaves as absent, taken over once by 32 concurrent copies | `inbox::expired_record_is_processed_again`, `inbox::thirty_two_concurrent_copies_of_an_expired_record_have_one_effect` |
//! | the message type gains a defaulted or optional field | redeliveries of older messages stay duplicates; other content is a mismatch | `edges_deployment::*::redeliveries_of_an_older_message_version_are_duplicates` |
//! | the same key with other content | `FingerprintMismatch`, dead-lettered, never processed | `inbox::reused_key_with_other_content_is_refused` |
//! | a record changed by hand | `CorruptRecord`, dead-lettered, never a requeue loop | `edges_transactions::*::corrupt_records_and_refused_statements_have_their_own_errors` |
//! | a worker's clock runs two hours behind (PostgreSQL, MariaDB) | its lease holds for a worker with a true clock: leases are the database's clock | `clocks::postgres_a_worker_whose_clock_is_behind_keeps_its_lease`, `clocks::mysql_a_worker_whose_clock_is_behind_keeps_its_lease` |
//! | eight replicas start at once | all start | `edges_deployment::*::replicas_starting_together_all_start` |
//! | cleaners of same-named tables in two schemas (PostgreSQL) | each cleans its own | `edges_deployment::postgres_cleaners_of_same_named_tables_in_two_schemas_do_not_share_a_lock` |
//!
//! # Features
//!
//! | feature | default | what it enables |
//! |---|---|---|
//! | `macros` | yes | `#[idempotent]`, re-exported from `idem-macros` |
//! | `sqlite` | yes | SQLite (bundled), the embedded default |
//! | `postgres` | no | PostgreSQL |
//! | `mysql` | no | MySQL and MariaDB |
//! | `tls-rustls` | no | TLS to the database |
//! | `migration` | no | `migration::CreateInbox`, `CreateInboxCompanions` and `UpgradeInboxCompanions` for `sea-orm-migration` |
//! | `otel` | no | staged outbox messages carry the handler's trace context (`traceparent`), through `tracing-opentelemetry` (the module `trace_context`) |
//!
//! # Backends
//!
//! The claim is `INSERT ... ON CONFLICT DO NOTHING` on PostgreSQL and SQLite and
//! `INSERT IGNORE` on MySQL/MariaDB, whose affected-row count stays 0 for a duplicate even with
//! `CLIENT_FOUND_ROWS`. SQLite transactions begin `IMMEDIATE`. In transactional mode the handler
//! holds a pooled connection for its transaction; with sea-orm's default single-connection SQLite
//! pool, write through the transaction only.
//!
//! Leases and expiries are written and compared by the database's clock, in the statements
//! themselves: the processes sharing an inbox agree on them whatever their hosts' clocks say.

pub mod admin;
mod clock;
mod configured;
mod context;
mod delivery;
pub mod entity;
mod error;
mod fingerprint;
mod handler;
mod inbox;
mod key;
mod metadata;
pub mod metrics;
mod observe;
pub mod outbox;
mod report;
pub mod retention;
pub mod schema;
mod slice;
mod store;
mod telemetry;
#[cfg(feature = "otel")]
pub mod trace_context;
pub mod transport;

#[cfg(feature = "migration")]
pub mod migration;

#[doc(hidden)]
pub mod __private;
// Hidden here too so that a message without `Serialize` gets an error naming the trait plainly,
// never through `__private` (see `__private::Fingerprintable`).
#[doc(hidden)]
pub use __private::Fingerprintable;

pub use configured::{Configured, HandlerExt};
pub use context::Context;
pub use error::{ConfigError, Error, Result};
pub use fingerprint::{Fingerprint, FingerprintError};
pub use handler::{Handler, Mode, Outcome};
pub use inbox::{Inbox, InboxBuilder};
pub use key::{KeyError, MessageKey};
pub use metadata::Metadata;
pub use outbox::{Outbound, Outbox, OutboxBuilder, OutboxMessage, StagingError};
pub use report::Report;
pub use retention::{RedeliveryWindow, RetentionPolicy};
pub use slice::{SliceContext, SliceHandler};

#[cfg(feature = "macros")]
pub use idem_macros::idempotent;

/// The sea-orm version idem is built on, re-exported so handlers name the same types.
pub use sea_orm;
