//! A second worker on a test's inbox table whose two-phase lease renewals a test can make fail:
//! the worker whose claim runs out while its handler is still running.

use idem_runtime::sea_orm::{ConnectionTrait, DatabaseConnection};
use idem_runtime::{Inbox, InboxBuilder};

use crate::proxy::{Proxy, behind_proxy};
use crate::{Backend, TestDb};

/// An inbox on the same table as a test's, whose lease renewals fail for real once
/// [`CutWorker::cut`] is called, while its handlers keep running.
///
/// On PostgreSQL and MariaDB its connection goes through a [`Proxy`], and cutting it makes the
/// database unreachable for this worker only. SQLite has no server to lose: cutting adds a
/// trigger that refuses renewals of the claims in progress at that moment, so this worker's
/// renewal statements fail as they would against an unreachable database, while other workers'
/// later claims renew normally.
#[derive(Debug)]
pub struct CutWorker {
    /// The worker's inbox.
    pub inbox: Inbox,
    way: Way,
}

#[derive(Debug)]
enum Way {
    Proxy {
        proxy: Proxy,
        _db: TestDb,
    },
    Trigger {
        db: DatabaseConnection,
        table: String,
    },
}

impl CutWorker {
    /// A worker on `table` of `db`, its inbox configured by `configure` (as the test's own).
    pub async fn new(
        db: &TestDb,
        table: &str,
        configure: impl FnOnce(InboxBuilder) -> InboxBuilder,
    ) -> Self {
        let (pool, way) = match db.backend {
            Backend::Sqlite => {
                let pool = db.another_pool(4).await;
                let way = Way::Trigger {
                    db: pool.clone(),
                    table: table.to_owned(),
                };
                (pool, way)
            }
            backend => {
                let (proxied, proxy) = behind_proxy(backend).await;
                (
                    proxied.db.clone(),
                    Way::Proxy {
                        proxy,
                        _db: proxied,
                    },
                )
            }
        };
        let inbox = configure(Inbox::builder(pool).table(table).create_table(false))
            .build()
            .await
            .expect("the cut worker's inbox builds");
        Self { inbox, way }
    }

    /// From now on, this worker's renewals fail.
    pub async fn cut(&self) {
        match &self.way {
            Way::Proxy { proxy, .. } => proxy.cut().await,
            Way::Trigger { db, table } => {
                let tokens = db
                    .query_all_raw(idem_runtime::sea_orm::Statement::from_string(
                        db.get_database_backend(),
                        format!("SELECT claim_token FROM {table} WHERE status = 'in_progress'"),
                    ))
                    .await
                    .unwrap()
                    .iter()
                    .map(|row| row.try_get_by_index::<i64>(0).unwrap().to_string())
                    .collect::<Vec<_>>();
                assert!(!tokens.is_empty(), "no claim in progress to cut");
                // A renewal keeps the claim token and the status; a takeover changes the token
                // and a completion the status, which stay allowed.
                db.execute_unprepared(&format!(
                    "CREATE TRIGGER {table}_cut BEFORE UPDATE ON {table} \
                     WHEN NEW.status = 'in_progress' AND NEW.claim_token = OLD.claim_token \
                     AND OLD.claim_token IN ({}) \
                     BEGIN SELECT RAISE(ABORT, 'renewals cut'); END",
                    tokens.join(", ")
                ))
                .await
                .unwrap();
            }
        }
    }

    /// This worker reaches the database again.
    pub async fn restore(&self) {
        match &self.way {
            Way::Proxy { proxy, .. } => proxy.restore(),
            Way::Trigger { db, table } => {
                db.execute_unprepared(&format!("DROP TRIGGER IF EXISTS {table}_cut"))
                    .await
                    .unwrap();
            }
        }
    }
}
