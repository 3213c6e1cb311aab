//! A TCP proxy in front of a database or the broker that a test can cut and restore: a real
//! outage as the application sees it, without touching the server other tests use.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Mutex;
use tokio::task::JoinSet;

/// A proxy listening on a free local port and forwarding to `target`.
#[derive(Debug, Clone)]
pub struct Proxy {
    port: u16,
    up: Arc<AtomicBool>,
    links: Arc<Mutex<JoinSet<()>>>,
}

impl Proxy {
    /// Starts a proxy to `target` (`host:port`).
    pub async fn start(target: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let proxy = Self {
            port,
            up: Arc::new(AtomicBool::new(true)),
            links: Arc::new(Mutex::new(JoinSet::new())),
        };
        let (up, links, target) = (proxy.up.clone(), proxy.links.clone(), target.to_owned());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if !up.load(Ordering::SeqCst) {
                    drop(client); // refused while down
                    continue;
                }
                let target = target.clone();
                links.lock().await.spawn(async move {
                    if let Ok(mut server) = TcpStream::connect(&target).await {
                        let mut client = client;
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
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
        self.up.store(false, Ordering::SeqCst);
        let mut links = self.links.lock().await;
        links.abort_all();
        while links.join_next().await.is_some() {}
    }

    /// Accepts connections again.
    pub fn restore(&self) {
        self.up.store(true, Ordering::SeqCst);
    }
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
