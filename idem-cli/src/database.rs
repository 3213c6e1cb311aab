//! The database the services use: reached first by TCP, so that one that cannot be reached is
//! said at once, then a small pool on it.

use std::time::Duration;

use idem_runtime::sea_orm::{ConnectOptions, Database, DatabaseConnection, DbErr};

/// How long reaching the database is waited for.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A small pool on the database at `url`, as every command needs. A server that cannot be
/// reached is said at once, with the reason (a refused port, a name that does not resolve).
pub(crate) async fn connect(url: &str) -> Result<DatabaseConnection, String> {
    if let Some(address) = server_address(url) {
        let reaching = tokio::net::TcpStream::connect(address.clone());
        match tokio::time::timeout(CONNECT_TIMEOUT, reaching).await {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => {
                return Err(format!("cannot reach the database at {address}: {error}"));
            }
            Err(_) => {
                return Err(format!(
                    "cannot reach the database at {address}: no answer within {CONNECT_TIMEOUT:?}"
                ));
            }
        }
    }
    let mut options = ConnectOptions::new(url);
    options
        .max_connections(2)
        .connect_timeout(CONNECT_TIMEOUT)
        .acquire_timeout(CONNECT_TIMEOUT)
        .sqlx_logging(false);
    Database::connect(options)
        .await
        .map_err(|error: DbErr| format!("cannot connect to the database: {error}"))
}

/// `host:port` of a PostgreSQL or MySQL URL that names a host (not a socket): what a
/// connection must reach first.
fn server_address(url: &str) -> Option<String> {
    let parsed = url::Url::parse(url).ok()?;
    let default_port = match parsed.scheme() {
        "postgres" | "postgresql" => 5432,
        "mysql" | "mariadb" => 3306,
        _ => return None,
    };
    let host = parsed.host_str().filter(|host| !host.is_empty())?;
    Some(format!("{host}:{}", parsed.port().unwrap_or(default_port)))
}
