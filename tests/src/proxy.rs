//! A TCP proxy in front of a database or the broker that a test can cut and restore: a real
//! outage as the application sees it, without touching the server other tests use. It can also
//! hold back what the server sends, as a distant server's answers are.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Mutex, mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

/// A proxy listening on a free local port and forwarding to `target`.
#[derive(Debug, Clone)]
pub struct Proxy {
    port: u16,
    state: Arc<AtomicU8>,
    /// Where new connections go (`host:port`).
    target: Arc<std::sync::Mutex<String>>,
    links: Arc<Mutex<JoinSet<()>>>,
    /// Silent connections the client has not closed.
    silent: Arc<AtomicUsize>,
    /// Bumped by [`Proxy::freeze`]: the connections open then stop carrying anything.
    frozen: Arc<watch::Sender<u64>>,
}

/// Forwarding connections.
const UP: u8 = 0;
/// Refusing connections.
const DOWN: u8 = 1;
/// Accepting connections and never answering on them, as a host that went away behind a
/// load balancer does.
const SILENT: u8 = 2;

impl Proxy {
    /// Starts a proxy to `target` (`host:port`).
    pub async fn start(target: &str) -> Self {
        Self::start_with(target, None).await
    }

    /// Starts a proxy to `target` that passes on what the server sends `delay` after it came
    /// (what the client sends goes at once): every answer of the server takes `delay` longer,
    /// and answers to requests sent together still come together.
    pub async fn start_with_delay(target: &str, delay: Duration) -> Self {
        Self::start_with(target, Some(delay)).await
    }

    async fn start_with(target: &str, delay: Option<Duration>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let proxy = Self {
            port,
            state: Arc::new(AtomicU8::new(UP)),
            target: Arc::new(std::sync::Mutex::new(target.to_owned())),
            links: Arc::new(Mutex::new(JoinSet::new())),
            silent: Arc::new(AtomicUsize::new(0)),
            frozen: Arc::new(watch::Sender::new(0)),
        };
        let (state, links, target) = (
            proxy.state.clone(),
            proxy.links.clone(),
            proxy.target.clone(),
        );
        let silent = proxy.silent.clone();
        let frozen = proxy.frozen.clone();
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                match state.load(Ordering::SeqCst) {
                    DOWN => {
                        drop(client); // refused while down
                        continue;
                    }
                    SILENT => {
                        // Read and never answer, until the client closes or the proxy cuts.
                        let silent = SilentLink::open(&silent);
                        links.lock().await.spawn(async move {
                            let _open = silent;
                            let mut sink = vec![0u8; 4096];
                            while matches!(client.read(&mut sink).await, Ok(read) if read > 0) {}
                        });
                        continue;
                    }
                    _ => {}
                }
                let target = target.lock().unwrap().clone();
                let mut frozen = frozen.subscribe();
                links.lock().await.spawn(async move {
                    let Ok(mut server) = TcpStream::connect(&target).await else {
                        return;
                    };
                    tokio::select! {
                        () = link(&mut client, &mut server, delay) => {}
                        // Both ends stay open, and nothing goes either way any more.
                        _ = frozen.changed() => std::future::pending::<()>().await,
                    }
                });
            }
        });
        proxy
    }

    /// The port to connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Cuts every open connection and refuses new ones.
    pub async fn cut(&self) {
        self.cut_to(DOWN).await;
    }

    /// Cuts every open connection and accepts new ones without ever answering on them.
    pub async fn silence(&self) {
        self.cut_to(SILENT).await;
    }

    async fn cut_to(&self, state: u8) {
        self.state.store(state, Ordering::SeqCst);
        let mut links = self.links.lock().await;
        links.abort_all();
        while links.join_next().await.is_some() {}
    }

    /// Stops every open connection carrying anything either way, and keeps it open, as a link
    /// whose far end went away without closing it (a host gone, a NAT entry dropped) looks to
    /// the client; new connections are forwarded.
    pub fn freeze(&self) {
        self.frozen.send_modify(|generation| *generation += 1);
    }

    /// Silent connections (see [`Proxy::silence`]) their clients have not closed.
    pub fn silent_links(&self) -> usize {
        self.silent.load(Ordering::SeqCst)
    }

    /// Sends new connections to `target` (`host:port`) from now on, as a failover's virtual
    /// address moves to the promoted server; open ones stay where they are.
    pub fn point_at(&self, target: &str) {
        *self.target.lock().unwrap() = target.to_owned();
    }

    /// Forwards new connections again (the silent ones stay silent).
    pub fn restore(&self) {
        self.state.store(UP, Ordering::SeqCst);
    }
}

/// Counts a silent connection while it is open.
struct SilentLink(Arc<AtomicUsize>);

impl SilentLink {
    fn open(count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::SeqCst);
        Self(Arc::clone(count))
    }
}

impl Drop for SilentLink {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Forwards between `client` and `server` until either closes, holding what the server sends
/// for `delay`.
async fn link(client: &mut TcpStream, server: &mut TcpStream, delay: Option<Duration>) {
    let Some(delay) = delay else {
        let _ = tokio::io::copy_bidirectional(client, server).await;
        return;
    };
    let (mut client_read, client_write) = client.split();
    let (server_read, mut server_write) = server.split();
    tokio::select! {
        _ = tokio::io::copy(&mut client_read, &mut server_write) => {}
        () = delayed(server_read, client_write, delay) => {}
    }
}

/// Copies `from` to `to`, each chunk `delay` after it was read, in order.
async fn delayed(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    delay: Duration,
) {
    let (chunks, mut due) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let read = async move {
        let mut buffer = vec![0u8; 64 * 1024];
        while let Ok(read) = from.read(&mut buffer).await {
            if read == 0
                || chunks
                    .send((Instant::now() + delay, buffer[..read].to_vec()))
                    .is_err()
            {
                break;
            }
        }
    };
    let write = async move {
        while let Some((at, chunk)) = due.recv().await {
            tokio::time::sleep_until(at).await;
            if to.write_all(&chunk).await.is_err() {
                break;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(read, write);
}

/// A database of `backend` (PostgreSQL or MariaDB) reached through a proxy that a test cuts,
/// with a pool of four connections.
pub async fn behind_proxy(backend: crate::Backend) -> (crate::TestDb, Proxy) {
    use crate::Backend;
    let (target, url) = match backend {
        Backend::Postgres => (
            "127.0.0.1:5432",
            "postgres://postgres@127.0.0.1:{port}/test",
        ),
        Backend::MySql => ("127.0.0.1:3306", "mysql://root@127.0.0.1:{port}/test"),
        Backend::Sqlite => unreachable!("SQLite has no server to lose"),
    };
    let proxy = Proxy::start(target).await;
    let url = url.replace("{port}", &proxy.port().to_string());
    (crate::TestDb::connect_url(backend, url, 4).await, proxy)
}
