//! A loopback HTTP stub of a notification provider: it accepts `POST /notify` with an
//! `Idempotency-Key` header and counts the calls made with each key, as a provider that
//! deduplicates by key would. `GET /stats` returns the counts as JSON; [`Stub::calls_with`]
//! counts the calls made with some keys only (one demo run's).
//!
//! Plain HTTP/1.1 on a `TcpListener`, one request per connection: enough for a demo, with no
//! dependency.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use serde::Serialize;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// What the stub has seen.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct StubStats {
    /// Calls of `POST /notify`.
    pub calls: u64,
    /// Distinct `Idempotency-Key`s among them.
    pub distinct_keys: u64,
    /// Calls without a key (refused with 400).
    pub without_key: u64,
}

/// The calls made with some keys only: [`Stub::calls_with`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct KeyedCalls {
    /// Calls of `POST /notify` with one of the keys.
    pub calls: u64,
    /// How many of the keys were called with, once or more.
    pub distinct_keys: u64,
}

#[derive(Debug, Default)]
struct Seen {
    calls: u64,
    /// The calls made with each key.
    keys: HashMap<String, u64>,
    without_key: u64,
}

impl Seen {
    fn stats(&self) -> StubStats {
        StubStats {
            calls: self.calls,
            distinct_keys: self.keys.len() as u64,
            without_key: self.without_key,
        }
    }
}

/// A running stub.
#[derive(Debug, Clone)]
pub struct Stub {
    addr: SocketAddr,
    seen: Arc<Mutex<Seen>>,
}

impl Stub {
    /// Starts the stub on `addr` (`127.0.0.1:0` for any free port).
    ///
    /// # Errors
    ///
    /// The address cannot be bound.
    pub async fn start(addr: &str) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let stub = Self {
            addr: listener.local_addr()?,
            seen: Arc::default(),
        };
        let seen = Arc::clone(&stub.seen);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let seen = Arc::clone(&seen);
                tokio::spawn(async move {
                    if let Err(error) = serve(stream, &seen).await {
                        tracing::debug!(%error, "stub connection failed");
                    }
                });
            }
        });
        Ok(stub)
    }

    /// The URL of its `POST /notify` endpoint.
    pub fn notify_url(&self) -> String {
        format!("http://{}/notify", self.addr)
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The distinct `Idempotency-Key`s it has seen.
    pub fn keys(&self) -> HashSet<String> {
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.keys.keys().cloned().collect()
    }

    /// The calls made with `keys` (the keys of one run's orders, say), and how many of them
    /// were called with: the calls with any other key are left out.
    pub fn calls_with<'a>(&self, keys: impl IntoIterator<Item = &'a String>) -> KeyedCalls {
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let mut counted = KeyedCalls::default();
        for calls in keys.into_iter().filter_map(|key| seen.keys.get(key)) {
            counted.calls += calls;
            counted.distinct_keys += 1;
        }
        counted
    }

    /// What it has seen so far.
    pub fn stats(&self) -> StubStats {
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.stats()
    }
}

async fn serve(stream: TcpStream, seen: &Mutex<Seen>) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream);
    let mut request_line = String::new();
    reader.read_line(&mut request_line).await?;
    let mut key = None;
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).await? == 0 || line == "\r\n" {
            break;
        }
        if let Some((name, value)) = line.trim_end().split_once(':') {
            match name.trim().to_ascii_lowercase().as_str() {
                "idempotency-key" => key = Some(value.trim().to_owned()),
                "content-length" => length = value.trim().parse().unwrap_or(0),
                _ => {}
            }
        }
    }
    let mut body = vec![0; length.min(1 << 20)];
    reader.read_exact(&mut body).await?;
    let (status, body) = if request_line.starts_with("POST /notify ") {
        let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
        match key {
            Some(key) if !key.is_empty() => {
                seen.calls += 1;
                *seen.keys.entry(key).or_default() += 1;
                ("200 OK", "{}".to_owned())
            }
            _ => {
                seen.without_key += 1;
                (
                    "400 Bad Request",
                    "{\"error\":\"Idempotency-Key required\"}".to_owned(),
                )
            }
        }
    } else if request_line.starts_with("GET /stats ") {
        let stats = seen.lock().unwrap_or_else(|e| e.into_inner()).stats();
        (
            "200 OK",
            serde_json::to_string(&stats).expect("stats serialize"),
        )
    } else {
        ("404 Not Found", "{}".to_owned())
    };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    );
    let mut stream = reader.into_inner();
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

/// Sends `POST <url>` with `body` and an `Idempotency-Key`; returns the status code.
///
/// # Errors
///
/// The URL is not `http://host:port/path`, or the connection failed.
pub async fn post(url: &str, idempotency_key: &str, body: &[u8]) -> std::io::Result<u16> {
    let invalid = || std::io::Error::new(std::io::ErrorKind::InvalidInput, "not an http:// URL");
    let rest = url.strip_prefix("http://").ok_or_else(invalid)?;
    let (host, path) = rest.split_once('/').ok_or_else(invalid)?;
    let mut stream = TcpStream::connect(host).await?;
    let head = format!(
        "POST /{path} HTTP/1.1\r\nHost: {host}\r\nIdempotency-Key: {idempotency_key}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body).await?;
    let mut response = String::new();
    BufReader::new(stream).read_line(&mut response).await?;
    response
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidData, "no HTTP status"))
}
