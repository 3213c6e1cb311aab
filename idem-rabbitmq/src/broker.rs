//! What a broker node says of itself when a connection opens: its version, from the server
//! properties of `connection.start`, which lapin does not keep. Read on a plain connection of
//! its own that goes no further than that first frame.

use std::time::Duration;

use lapin::types::parsing::parse_field_table;
use lapin::types::{AMQPValue, FieldTable};
use lapin::uri::{AMQPScheme, AMQPUri};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::url::AmqpUrl;

/// The header that opens an AMQP 0-9-1 connection.
const PROTOCOL_HEADER: &[u8] = b"AMQP\x00\x00\x09\x01";

/// A method frame's type, and `connection.start`'s class and method.
const METHOD_FRAME: u8 = 1;
const CONNECTION_START: [u8; 4] = [0, 10, 0, 10];

/// The largest `connection.start` read (RabbitMQ's is about 500 bytes).
const MAX_START: usize = 64 * 1024;

/// The major version of the RabbitMQ the first reachable plain (`amqp://`) node of `url` runs,
/// each node given up after `limit`; `None` when none tells it (TLS nodes are not asked).
pub(crate) async fn major_version(url: &AmqpUrl, limit: Duration) -> Option<u32> {
    server_version(url, limit)
        .await
        .as_deref()
        .and_then(major_of)
}

/// The version the broker at `url` says it runs (`3.10.8`), read from the first frame of a
/// connection of its own to its first reachable plain (`amqp://`) node, each node given up
/// after `limit`; `None` when none tells it (TLS nodes are not asked). Where RabbitMQ 3 and 4
/// differ (a quorum queue's default delivery limit), the consumer declares by it.
pub async fn server_version(url: &AmqpUrl, limit: Duration) -> Option<String> {
    for node in url.node_urls() {
        let Ok(uri) = node.parse::<AMQPUri>() else {
            continue;
        };
        if uri.scheme != AMQPScheme::AMQP {
            continue;
        }
        let address = format!("{}:{}", uri.authority.host, uri.authority.port);
        if let Ok(Some(properties)) = tokio::time::timeout(limit, server_properties(&address)).await
        {
            return version_of(&properties);
        }
    }
    None
}

/// The server properties the node at `address` sends first; `None` when it sends no AMQP.
async fn server_properties(address: &str) -> Option<FieldTable> {
    let mut stream = tokio::net::TcpStream::connect(address).await.ok()?;
    stream.write_all(PROTOCOL_HEADER).await.ok()?;
    let mut header = [0u8; 7];
    stream.read_exact(&mut header).await.ok()?;
    let size = u32::from_be_bytes(header[3..7].try_into().ok()?) as usize;
    if header[0] != METHOD_FRAME || size > MAX_START {
        return None;
    }
    let mut payload = vec![0u8; size];
    stream.read_exact(&mut payload).await.ok()?;
    // The node closes the connection left at its first frame; nothing else is said to it.
    start_properties(&payload)
}

/// The server properties of a `connection.start` method frame's payload.
fn start_properties(payload: &[u8]) -> Option<FieldTable> {
    let rest = payload.strip_prefix(&CONNECTION_START)?;
    // The protocol's major and minor version come before the table.
    let table = rest.get(2..)?;
    parse_field_table(table)
        .ok()
        .map(|(_, properties)| properties)
}

/// The `version` property, as text.
fn version_of(properties: &FieldTable) -> Option<String> {
    match properties.inner().get("version")? {
        AMQPValue::LongString(text) => Some(String::from_utf8_lossy(text.as_bytes()).into_owned()),
        AMQPValue::ShortString(text) => Some(text.as_str().to_owned()),
        _ => None,
    }
}

/// The major version of a version string (`3.10.8` is 3).
fn major_of(version: &str) -> Option<u32> {
    version.split('.').next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A field table of text values, as the wire carries it.
    fn table(entries: &[(&str, &str)]) -> Vec<u8> {
        let mut body = Vec::new();
        for (name, value) in entries {
            body.push(name.len() as u8);
            body.extend(name.as_bytes());
            body.push(b'S');
            body.extend((value.len() as u32).to_be_bytes());
            body.extend(value.as_bytes());
        }
        let mut table = (body.len() as u32).to_be_bytes().to_vec();
        table.extend(body);
        table
    }

    #[test]
    fn a_start_frame_tells_the_version() {
        let mut payload = CONNECTION_START.to_vec();
        payload.extend([0, 9]);
        payload.extend(table(&[("product", "RabbitMQ"), ("version", "4.1.2")]));
        let read = start_properties(&payload).expect("a start frame");
        assert_eq!(version_of(&read).as_deref(), Some("4.1.2"));
        assert_eq!(major_of("4.1.2"), Some(4));
        assert_eq!(major_of("3.10.8"), Some(3));
        assert!(start_properties(&[0, 10, 0, 11]).is_none(), "not a start");
    }
}
