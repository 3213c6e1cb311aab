//! Connecting to RabbitMQ.

use lapin::{Connection, ConnectionProperties};

use crate::error::{Error, Result};
use crate::url::AmqpUrl;

/// Connects with lapin's automatic recovery on, naming the connection so operators can find it
/// (`rabbitmqctl list_connections client_properties`).
pub async fn connect(url: &AmqpUrl, connection_name: &str) -> Result<Connection> {
    let properties = ConnectionProperties::default()
        .enable_auto_recover()
        .with_connection_name(connection_name.into());
    Connection::connect(url.expose(), properties)
        .await
        .map_err(|source| Error::Connect {
            url: url.redacted(),
            source,
        })
}
