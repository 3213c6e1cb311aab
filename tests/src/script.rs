//! A handler whose message body says what it does after writing its effect, for the tests of
//! faults a handler meets on its own: another database it reads being down, an output too large
//! for the server.

use std::time::Duration;

use idem_runtime::fingerprint::{Fingerprint, FingerprintError};
use idem_runtime::{Context, Handler, KeyError, MessageKey, Metadata};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr};

use crate::db::insert_effect;
use crate::proxy::Proxy;
use crate::recorder::Msg;

/// The consumer name a [`Script`] records its effects under.
pub const SCRIPT_CONSUMER: &str = "script";

/// A transactional handler writing one effect row per run into its effects table, then doing
/// what the message's body says: `other-db` reads another database (see
/// [`another_database_that_is_down`]) and returns its error; `huge` returns an output of
/// [`Script::with_huge_outputs`] characters; anything else returns `did <body>`.
#[derive(Debug, Clone)]
pub struct Script {
    effects: String,
    other: Option<DatabaseConnection>,
    huge: usize,
}

impl Script {
    /// A script writing into `effects`.
    pub fn new(effects: &str) -> Self {
        Self {
            effects: effects.to_owned(),
            other: None,
            huge: 0,
        }
    }

    /// The same script, whose `other-db` reads `other`.
    pub fn reading(mut self, other: DatabaseConnection) -> Self {
        self.other = Some(other);
        self
    }

    /// The same script, whose `huge` output is `length` characters long.
    pub fn with_huge_outputs(mut self, length: usize) -> Self {
        self.huge = length;
        self
    }
}

impl Handler for Script {
    type Message = Msg;
    type Output = String;
    type Error = DbErr;

    fn consumer(&self) -> &str {
        SCRIPT_CONSUMER
    }
    fn key(&self, msg: &Msg, _: &Metadata) -> Result<MessageKey, KeyError> {
        MessageKey::new(msg.id.as_str())
    }
    fn fingerprint(
        &self,
        msg: &Msg,
        meta: &Metadata,
    ) -> Result<Option<Fingerprint>, FingerprintError> {
        meta.content_fingerprint(msg).map(Some)
    }
    async fn handle(&self, cx: &Context<'_>, msg: Msg) -> Result<String, DbErr> {
        let tx = cx.transaction().expect("transactional");
        insert_effect(tx, &self.effects, SCRIPT_CONSUMER, &msg.id, &msg.body).await?;
        match msg.body.as_str() {
            "other-db" => {
                let other = self.other.as_ref().expect("another database");
                other.execute_unprepared("SELECT 1").await?;
                Ok("read the other database".to_owned())
            }
            "huge" => Ok("x".repeat(self.huge)),
            _ => Ok(format!("did {}", msg.body)),
        }
    }
}

/// A PostgreSQL database behind a proxy that is cut, as another database a handler reads can
/// be down while the inbox's is up; restore the proxy to bring it back.
pub async fn another_database_that_is_down() -> (DatabaseConnection, Proxy) {
    let proxy = Proxy::start("127.0.0.1:5432").await;
    let url = format!("postgres://postgres@127.0.0.1:{}/test", proxy.port());
    let other = crate::db::connect_with(&url, 1, Duration::from_millis(500))
        .await
        .expect("the other database is up at first");
    other.execute_unprepared("SELECT 1").await.unwrap();
    proxy.cut().await;
    (other, proxy)
}
