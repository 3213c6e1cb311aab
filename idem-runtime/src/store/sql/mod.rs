//! Each backend's SQL in its own room: a room per backend ([`postgres`], [`mysql`] for MySQL
//! and MariaDB, [`sqlite`]) implements every kind of statement whose text or behaviour differs
//! between backends, one trait per kind: how the backend speaks and behaves ([`Syntax`]), the
//! inbox's statements ([`InboxSql`]), the outbox's ([`OutboxSql`]) and the tables' schemas
//! ([`SchemaSql`]). [`Sql`] is all of them; the dialect holds the backend's room.
//!
//! A new kind of statement is a new trait here and an implementation in each room. What every
//! backend writes alike stays beside the traits (`lists` for statements over lists of values,
//! the shared pieces of `outbox` and `schema`); what a driver's error means is classified in
//! each room too. This folder alone names the backends.

mod inbox;
mod lists;
mod mysql;
mod outbox;
mod postgres;
mod schema;
mod sqlite;
mod syntax;

use sea_orm::DbBackend;

pub(crate) use inbox::{ClaimsReturn, Completion, ExpiredDelete, InboxSql, InboxTable};
pub(crate) use outbox::{Bound, OutboxSql, Staging};
pub(crate) use schema::{DUP_DAILY, KEY_DIGEST, SchemaSql};
pub(crate) use syntax::{Syntax, WithValues};

/// Every kind of a backend's SQL.
pub(crate) trait Sql: Syntax + InboxSql + OutboxSql + SchemaSql {}

impl<T: Syntax + InboxSql + OutboxSql + SchemaSql> Sql for T {}

/// The room of `backend`; `None` for a backend idem does not support. MySQL's family is
/// MariaDB's until [`server_room`] tells them apart.
pub(crate) fn room(backend: DbBackend) -> Option<&'static dyn Sql> {
    match backend {
        DbBackend::Postgres => Some(&postgres::Postgres),
        DbBackend::MySql => Some(&mysql::MARIADB),
        DbBackend::Sqlite => Some(&sqlite::Sqlite),
        _ => None,
    }
}

/// The room of `backend`, SQLite's for one idem does not support (which start-up refuses):
/// for the statements a caller asks of any backend, as before idem knew of others.
pub(crate) fn room_or_sqlite(backend: DbBackend) -> &'static dyn Sql {
    room(backend).unwrap_or(&sqlite::Sqlite)
}

/// The query whose answer tells the servers of `backend`'s family apart (MySQL's
/// `VERSION()`), if they differ.
pub(crate) fn version_query(backend: DbBackend) -> Option<&'static str> {
    (backend == DbBackend::MySql).then_some(mysql::VERSION_QUERY)
}

/// The room of the server of `backend` whose [`version_query`] answered `version`.
pub(crate) fn server_room(backend: DbBackend, version: &str) -> Option<&'static dyn Sql> {
    match backend {
        DbBackend::MySql => Some(mysql::of_version(version)),
        other => room(other),
    }
}

/// A room by its backend's name (`postgres`, `mariadb`, `mysql`, `sqlite`), for tests.
#[cfg(test)]
pub(crate) fn by_name(name: &str) -> &'static dyn Sql {
    match name {
        "postgres" => &postgres::Postgres,
        "mariadb" => &mysql::MARIADB,
        "mysql" => &mysql::MYSQL,
        "sqlite" => &sqlite::Sqlite,
        other => panic!("no room for {other}"),
    }
}

/// What each driver's database errors mean, by the room of its backend.
pub(crate) mod codes {
    #[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
    pub(crate) use super::postgres::{
        failure as sqlstate_failure, refuses_value as sqlstate_refuses_value,
        takes_no_writes as sqlstate_takes_no_writes,
    };

    #[cfg(feature = "mysql")]
    pub(crate) use super::mysql::{
        failure as mysql_failure, refuses_value as mysql_refuses_value,
        takes_no_writes as mysql_takes_no_writes,
    };

    #[cfg(feature = "sqlite")]
    pub(crate) use super::sqlite::{
        failure as sqlite_failure, refuses_value as sqlite_refuses_value,
        takes_no_writes as sqlite_takes_no_writes,
    };
}
