//! An AMQP probe: a TCP proxy in front of the broker that reads the frames going through and
//! times, for every delivery, the span from its `basic.deliver` reaching the consumer's socket to
//! the `basic.ack` (or `basic.reject`, `basic.nack`) that settles it leaving it.
//!
//! It measures every consumer the same way, at the wire, whatever its code: a hand-written loop
//! and idem's consumer alike, one ack per delivery or one `multiple` ack per batch. It runs on a
//! thread of its own, with its own runtime, so that its work does not queue behind the
//! consumer's tasks.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::figures::Histogram;

/// A running probe; consumers reach the broker through [`Probe::url`].
#[derive(Debug)]
pub struct Probe {
    url: String,
    shared: Arc<Shared>,
}

/// What the probe saw since the last [`Probe::take`].
#[derive(Debug, Default)]
pub struct Observed {
    /// Deliveries settled for good: acknowledged, or rejected without requeue.
    pub finished: u64,
    /// Deliveries sent back to the queue (`requeue = true`).
    pub requeued: u64,
    /// Channels and connections the broker closed with an error (a soft error such as
    /// `PRECONDITION_FAILED - unknown delivery tag`, a hard one), as their `close` frames said.
    pub broker_errors: u64,
    /// When the last settlement left the consumer.
    pub last_settlement: Option<Instant>,
    /// Delivery-to-settlement latency of every settled delivery.
    pub latency: Histogram,
}

#[derive(Debug, Default)]
struct Shared {
    finished: AtomicU64,
    /// Deliveries on open channels not settled yet.
    outstanding: AtomicU64,
    broker_errors: AtomicU64,
    observed: Mutex<Observed>,
}

impl Probe {
    /// Starts a probe in front of the broker of `broker_url` (`amqp://user:pass@host:port/vhost`).
    ///
    /// # Panics
    /// If the URL has no host, or no local port is free.
    pub fn start(broker_url: &str) -> Self {
        let (before, authority, after) = split_authority(broker_url);
        let upstream: SocketAddr = {
            use std::net::ToSocketAddrs;
            let with_port = if authority.contains(':') {
                authority.to_owned()
            } else {
                format!("{authority}:5672")
            };
            with_port
                .to_socket_addrs()
                .ok()
                .and_then(|mut addrs| addrs.next())
                .unwrap_or_else(|| panic!("the broker's address {authority} does not resolve"))
        };
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        listener.set_nonblocking(true).expect("non-blocking");
        let port = listener.local_addr().expect("an address").port();
        let shared = Arc::new(Shared::default());
        let serving = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("amqp-probe".into())
            .spawn(move || {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a runtime")
                    .block_on(serve(listener, upstream, serving));
            })
            .expect("a thread");
        Self {
            url: format!("{before}127.0.0.1:{port}{after}"),
            shared,
        }
    }

    /// The broker's URL through the probe.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Deliveries settled for good since the last [`Probe::take`].
    pub fn finished(&self) -> u64 {
        self.shared.finished.load(Ordering::SeqCst)
    }

    /// Deliveries on open channels not settled yet.
    pub fn outstanding(&self) -> u64 {
        self.shared.outstanding.load(Ordering::SeqCst)
    }

    /// Channels and connections the broker closed with an error since the last
    /// [`Probe::take`].
    pub fn broker_errors(&self) -> u64 {
        self.shared.broker_errors.load(Ordering::SeqCst)
    }

    /// Returns what was seen since the last call, and starts afresh.
    pub fn take(&self) -> Observed {
        let mut observed = self.shared.observed.lock().unwrap();
        let taken = std::mem::take(&mut *observed);
        self.shared.finished.store(0, Ordering::SeqCst);
        self.shared.broker_errors.store(0, Ordering::SeqCst);
        taken
    }
}

/// Splits `scheme://user:pass@host:port/vhost` around `host:port`.
fn split_authority(url: &str) -> (&str, &str, &str) {
    let start = url.find("://").map_or(0, |i| i + 3);
    let start = url[start..].find('@').map_or(start, |i| start + i + 1);
    let end = url[start..]
        .find(['/', '?'])
        .map_or(url.len(), |i| start + i);
    (&url[..start], &url[start..end], &url[end..])
}

async fn serve(listener: std::net::TcpListener, upstream: SocketAddr, shared: Arc<Shared>) {
    let listener = TcpListener::from_std(listener).expect("a tokio listener");
    while let Ok((client, _)) = listener.accept().await {
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            if let Ok(server) = TcpStream::connect(upstream).await {
                link(client, server, shared).await;
            }
        });
    }
}

/// Deliveries not settled yet, per channel: delivery tag -> when it arrived.
type Pending = Mutex<HashMap<u16, BTreeMap<u64, Instant>>>;

async fn link(client: TcpStream, server: TcpStream, shared: Arc<Shared>) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let pending = Arc::new(Pending::default());
    let to_server = pump(
        client_read,
        server_write,
        Side::FromClient,
        Arc::clone(&pending),
        Arc::clone(&shared),
    );
    let to_client = pump(
        server_read,
        client_write,
        Side::FromServer,
        Arc::clone(&pending),
        Arc::clone(&shared),
    );
    tokio::join!(to_server, to_client);
    // A connection that ended without closing its channels: the broker requeues what it had.
    let left: usize = pending.lock().unwrap().drain().map(|(_, o)| o.len()).sum();
    forget(left, &shared);
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    FromClient,
    FromServer,
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    side: Side,
    pending: Arc<Pending>,
    shared: Arc<Shared>,
) {
    let mut buffer = vec![0u8; 64 * 1024];
    // The client opens with the 8-byte protocol header, which is not a frame.
    let mut frames = Frames::new(if side == Side::FromClient { 8 } else { 0 });
    loop {
        let read = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(read) => read,
        };
        let now = Instant::now();
        if to.write_all(&buffer[..read]).await.is_err() {
            break;
        }
        frames.feed(&buffer[..read], |channel, method| {
            on_method(side, channel, method, now, &pending, &shared)
        });
    }
    let _ = to.shutdown().await;
}

/// Reassembles frames from a byte stream and hands over the payload of each method frame.
struct Frames {
    skip: usize,
    buffer: Vec<u8>,
}

impl Frames {
    fn new(skip: usize) -> Self {
        Self {
            skip,
            buffer: Vec::new(),
        }
    }

    fn feed(&mut self, mut bytes: &[u8], mut on_method: impl FnMut(u16, &[u8])) {
        let skipped = self.skip.min(bytes.len());
        self.skip -= skipped;
        bytes = &bytes[skipped..];
        self.buffer.extend_from_slice(bytes);
        let mut at = 0;
        while self.buffer.len() - at >= 7 {
            let header = &self.buffer[at..at + 7];
            let size = u32::from_be_bytes([header[3], header[4], header[5], header[6]]) as usize;
            let end = at + 7 + size + 1;
            if self.buffer.len() < end {
                break;
            }
            if header[0] == 1 {
                let channel = u16::from_be_bytes([header[1], header[2]]);
                on_method(channel, &self.buffer[at + 7..at + 7 + size]);
            }
            at = end;
        }
        self.buffer.drain(..at);
    }
}

const BASIC: u16 = 60;
const DELIVER: u16 = 60;
const ACK: u16 = 80;
const REJECT: u16 = 90;
const NACK: u16 = 120;
const CHANNEL: u16 = 20;
const CONNECTION: u16 = 10;
const CLOSE: u16 = 40;
const CLOSE_OK: u16 = 41;
const CONNECTION_CLOSE: u16 = 50;
const CONNECTION_CLOSE_OK: u16 = 51;

fn on_method(
    side: Side,
    channel: u16,
    method: &[u8],
    now: Instant,
    pending: &Pending,
    shared: &Shared,
) {
    let Some(ids) = method.get(..4) else { return };
    let class = u16::from_be_bytes([ids[0], ids[1]]);
    let id = u16::from_be_bytes([ids[2], ids[3]]);
    let args = &method[4..];
    match (side, class, id) {
        (Side::FromServer, BASIC, DELIVER) => {
            // consumer-tag (short string), then the delivery tag.
            let Some(&tag_len) = args.first() else { return };
            let at = 1 + tag_len as usize;
            if let Some(tag) = args.get(at..at + 8) {
                let tag = u64::from_be_bytes(tag.try_into().expect("8 bytes"));
                let new = pending
                    .lock()
                    .unwrap()
                    .entry(channel)
                    .or_default()
                    .insert(tag, now)
                    .is_none();
                if new {
                    shared.outstanding.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
        (Side::FromClient, BASIC, ACK | REJECT | NACK) => {
            let (Some(tag), Some(&bits)) = (args.get(..8), args.get(8)) else {
                return;
            };
            let tag = u64::from_be_bytes(tag.try_into().expect("8 bytes"));
            let (multiple, requeue) = match id {
                ACK => (bits & 1 != 0, false),
                REJECT => (false, bits & 1 != 0),
                _ => (bits & 1 != 0, bits & 2 != 0),
            };
            settle(channel, tag, multiple, requeue, now, pending, shared);
        }
        (_, CHANNEL, CLOSE | CLOSE_OK) => {
            // Unsettled deliveries of a closed channel go back to the queue.
            let dropped = pending.lock().unwrap().remove(&channel);
            forget(dropped.map_or(0, |open| open.len()), shared);
            if side == Side::FromServer && id == CLOSE {
                note_close(args, shared);
            }
        }
        (_, CONNECTION, CONNECTION_CLOSE | CONNECTION_CLOSE_OK) => {
            let dropped: usize = pending.lock().unwrap().drain().map(|(_, o)| o.len()).sum();
            forget(dropped, shared);
            if side == Side::FromServer && id == CONNECTION_CLOSE {
                note_close(args, shared);
            }
        }
        _ => {}
    }
}

/// Counts a `close` from the broker whose reply code is an error (not 200, a normal close).
fn note_close(args: &[u8], shared: &Shared) {
    if let Some(code) = args.get(..2)
        && u16::from_be_bytes([code[0], code[1]]) != 200
    {
        shared.observed.lock().unwrap().broker_errors += 1;
        shared.broker_errors.fetch_add(1, Ordering::SeqCst);
    }
}

/// Drops `count` deliveries from the outstanding ones: their channel closed, and the broker
/// delivers them again.
fn forget(count: usize, shared: &Shared) {
    let _ = shared
        .outstanding
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
            Some(n.saturating_sub(count as u64))
        });
}

fn settle(
    channel: u16,
    tag: u64,
    multiple: bool,
    requeue: bool,
    now: Instant,
    pending: &Pending,
    shared: &Shared,
) {
    let settled: Vec<Instant> = {
        let mut pending = pending.lock().unwrap();
        let Some(open) = pending.get_mut(&channel) else {
            return;
        };
        if multiple {
            // Tag 0 with `multiple` settles every outstanding delivery.
            let rest = if tag == 0 {
                BTreeMap::new()
            } else {
                open.split_off(&(tag + 1))
            };
            std::mem::replace(open, rest).into_values().collect()
        } else {
            open.remove(&tag).into_iter().collect()
        }
    };
    if settled.is_empty() {
        return;
    }
    forget(settled.len(), shared);
    let mut observed = shared.observed.lock().unwrap();
    for delivered in &settled {
        observed
            .latency
            .record(now.saturating_duration_since(*delivered));
    }
    let count = settled.len() as u64;
    if requeue {
        observed.requeued += count;
    } else {
        observed.finished += count;
        observed.last_settlement = Some(now);
        shared.finished.fetch_add(count, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_authority_is_found() {
        assert_eq!(
            split_authority("amqp://guest:guest@127.0.0.1:5672/%2f"),
            ("amqp://guest:guest@", "127.0.0.1:5672", "/%2f")
        );
        assert_eq!(
            split_authority("amqp://localhost"),
            ("amqp://", "localhost", "")
        );
    }

    #[test]
    fn frames_split_across_reads_are_reassembled() {
        // An ack on channel 1: class 60, method 80, tag 7, multiple.
        let mut frame = vec![1, 0, 1, 0, 0, 0, 13, 0, 60, 0, 80];
        frame.extend_from_slice(&7u64.to_be_bytes());
        frame.push(1);
        frame.push(0xCE);
        let mut stream = b"AMQP\x00\x00\x09\x01".to_vec();
        stream.extend_from_slice(&frame);
        stream.extend_from_slice(&frame);
        let mut frames = Frames::new(8);
        let mut seen = Vec::new();
        for chunk in stream.chunks(5) {
            frames.feed(chunk, |channel, method| {
                seen.push((channel, method.to_vec()))
            });
        }
        assert_eq!(seen.len(), 2);
        assert_eq!(seen[0].0, 1);
        assert_eq!(&seen[0].1[..4], &[0, 60, 0, 80]);
    }
}
