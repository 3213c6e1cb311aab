//! Shared context for idem's end-to-end tests: real databases (SQLite, PostgreSQL, MariaDB)
//! with per-test tables, the real RabbitMQ with per-test queues, a proxy to cut a database off,
//! a recording handler, and the [`Fixture`] a test through the broker starts from.
//!
//! Run them with the command the README gives; the PostgreSQL and MariaDB servers must be up
//! (`.ci/run` starts them). A missing server fails the tests, it never skips them.

pub mod backlog;
pub mod bench;
pub mod cancel;
pub mod cluster;
pub mod cut;
pub mod db;
pub mod fixture;
pub mod otel;
pub mod proxy;
pub mod rabbit;
pub mod recorder;
pub mod script;
pub mod skew;
pub mod slicer;
pub mod tls;
pub mod watchdog;

pub use cut::CutWorker;
pub use db::{Backend, TestDb, unique};
pub use fixture::{Fixture, Layout};

/// A database of `backend` with an inbox on a fresh table, and a fresh effects table for
/// [`Recorder`]s: where most tests start.
pub async fn inbox_and_effects(backend: Backend) -> (TestDb, idem_runtime::Inbox, String) {
    inbox_and_effects_with(backend, |inbox| inbox).await
}

/// Like [`inbox_and_effects`], the inbox configured by `configure` (retention, ...).
pub async fn inbox_and_effects_with(
    backend: Backend,
    configure: impl FnOnce(idem_runtime::InboxBuilder) -> idem_runtime::InboxBuilder,
) -> (TestDb, idem_runtime::Inbox, String) {
    let db = TestDb::connect(backend).await;
    let table = db.table("inbox");
    let inbox = configure(idem_runtime::Inbox::builder(db.db.clone()).table(table))
        .build()
        .await
        .expect("inbox builds");
    let effects = db.effects_table().await;
    (db, inbox, effects)
}

/// An inbox on the table of `inbox`, on a pool of one connection that is given up on after a
/// second when it is busy, and that pool: to make the inbox's database take no writes, or have
/// no free connection.
pub async fn one_connection_inbox(
    db: &TestDb,
    inbox: &idem_runtime::Inbox,
) -> (idem_runtime::Inbox, sea_orm::DatabaseConnection) {
    let pool = db
        .pool_waiting_at_most(1, std::time::Duration::from_secs(1))
        .await;
    let one = idem_runtime::Inbox::builder(pool.clone())
        .table(inbox.table().as_str())
        .create_table(false)
        .build()
        .await
        .expect("the inbox builds");
    (one, pool)
}

/// The metadata of a message that came without any: no transport, no headers.
pub fn meta() -> idem_runtime::Metadata {
    idem_runtime::Metadata::default()
}

/// The inbox key of `consumer` and `key`, both valid.
pub fn inbox_key(consumer: &str, key: &str) -> idem_runtime::admin::InboxKey {
    idem_runtime::admin::InboxKey {
        consumer: idem_runtime::admin::ConsumerName::new(consumer).expect("a valid consumer name"),
        message_key: idem_runtime::MessageKey::new(key).expect("a valid key"),
    }
}

/// Runs `cleanup` to completion on a runtime of its own, in a thread of its own: test fixtures
/// clean up when dropped, possibly while the test's runtime is shutting down.
pub fn clean_up<F>(cleanup: F)
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let _ = std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
            .block_on(cleanup);
    })
    .join();
}
pub use rabbit::TestBroker;
pub use recorder::{Msg, Recorder};

/// The name the test harness gives the test `name` of the module at `module_path` (its
/// `module_path!()`): the path without the crate's name, as a child process that runs this
/// test binary again on that one test must pass it to `--exact`.
pub fn test_named(module_path: &str, name: &str) -> String {
    match module_path.split_once("::") {
        Some((_, path)) => format!("{path}::{name}"),
        None => name.to_owned(),
    }
}
