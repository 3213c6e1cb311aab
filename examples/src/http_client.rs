//! A plain HTTP/1.1 client for the orders demo: one request per connection, so that a
//! request the client gives up on is a connection it closes, as a timed-out client's is.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A response: its status, whether it replays a stored one, and its body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The status code.
    pub status: u16,
    /// It carries `Idempotent-Replayed: true`.
    pub replayed: bool,
    /// The body, as text.
    pub body: String,
}

/// The `Authorization` value of a client whose bearer token is `token`.
pub fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

/// Sends `POST <path>` to `addr` as the client whose bearer token is `token`, with a JSON
/// `body` and `key` as its `Idempotency-Key` (quoted here), and reads the answer for at most
/// `timeout`; `None` when it did not come in time, and the connection is closed under the
/// request.
///
/// # Errors
///
/// The connection failed, or the answer is not HTTP.
pub async fn post(
    addr: SocketAddr,
    path: &str,
    (key, token): (&str, &str),
    body: &[u8],
    timeout: Duration,
) -> std::io::Result<Option<Answer>> {
    let mut stream = TcpStream::connect(addr).await?;
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nIdempotency-Key: \"{key}\"\r\n\
         Authorization: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        bearer(token),
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body).await?;
    let mut raw = Vec::new();
    match tokio::time::timeout(timeout, stream.read_to_end(&mut raw)).await {
        Err(_elapsed) => Ok(None),
        Ok(read) => {
            read?;
            parse(&raw).map(Some)
        }
    }
}

fn parse(raw: &[u8]) -> std::io::Result<Answer> {
    let invalid = || std::io::Error::new(std::io::ErrorKind::InvalidData, "not an HTTP response");
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text.split_once("\r\n\r\n").ok_or_else(invalid)?;
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|line| line.split_whitespace().nth(1))
        .and_then(|code| code.parse().ok())
        .ok_or_else(invalid)?;
    let replayed = lines.any(|line| {
        line.split_once(':').is_some_and(|(name, value)| {
            name.eq_ignore_ascii_case(idem_http::REPLAYED_HEADER) && value.trim() == "true"
        })
    });
    Ok(Answer {
        status,
        replayed,
        body: body.to_owned(),
    })
}
