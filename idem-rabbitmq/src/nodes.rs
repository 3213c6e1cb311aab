//! The nodes a connection may reach: tried in turn, the one reached remembered for the next
//! connection to the same URL, each failed attempt logged with its reason.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{LazyLock, Mutex};

use lapin::tcp::{OwnedTLSConfig, TLSConfig};
use lapin::uri::AMQPUri;

use crate::error::Error;
use crate::metrics::CONNECTIONS_TOTAL;
use crate::url::{AmqpUrl, redact_url};

/// The node each URL's connections reached last, by URL: the next connection starts there.
static LAST_REACHED: LazyLock<Mutex<HashMap<String, usize>>> = LazyLock::new(Mutex::default);

/// One node of a broker.
#[derive(Debug)]
struct Node {
    uri: AMQPUri,
    /// Its URL, password hidden, for logs.
    shown: String,
    /// `host:port`, for the metric's label.
    address: String,
}

/// The nodes of one connection, and the one it is on or tries next.
#[derive(Debug)]
pub(crate) struct Nodes {
    /// The URL they came from (the key of [`LAST_REACHED`]).
    url: String,
    /// The connection's name, for logs and metrics.
    connection: String,
    nodes: Vec<Node>,
    current: AtomicUsize,
    /// The node the last attempt went to.
    trying: AtomicUsize,
    /// A stream was handed out: the next call is a reconnection, its node having gone away or
    /// refused the handshake (a load balancer in front of a dead node accepts, then closes).
    handed_out: AtomicBool,
    tls: OwnedTLSConfig,
}

impl Nodes {
    /// The nodes of `url`, for the connection named `connection`.
    ///
    /// # Errors
    ///
    /// [`Error::Connect`] naming a URL that cannot be read.
    pub(crate) fn of(url: &AmqpUrl, connection: &str) -> crate::Result<Self> {
        let nodes = url
            .node_urls()
            .into_iter()
            .map(|text| {
                let uri: AMQPUri = text.parse().map_err(|problem: String| Error::Connect {
                    url: redact_url(text),
                    source: std::io::Error::other(problem).into(),
                })?;
                let address = format!("{}:{}", uri.authority.host, uri.authority.port);
                Ok(Node {
                    uri,
                    shown: redact_url(text),
                    address,
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let first = match LAST_REACHED
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(url.expose())
        {
            Some(&last) => last,
            None if url.is_shuffled() => random_below(nodes.len(), connection),
            None => 0,
        };
        Ok(Self {
            url: url.expose().to_owned(),
            connection: connection.to_owned(),
            nodes,
            current: AtomicUsize::new(first),
            trying: AtomicUsize::new(first),
            handed_out: AtomicBool::new(false),
            tls: url.tls_settings().lapin_config(),
        })
    }

    /// The TLS settings for `amqps://` nodes.
    pub(crate) fn tls(&self) -> TLSConfig<'_, '_, '_> {
        self.tls.as_ref()
    }

    /// The URI whose credentials and virtual host every node is given.
    pub(crate) fn handshake_uri(&self) -> AMQPUri {
        self.nodes[0].uri.clone()
    }

    /// Connects with `connect` to the node it is on (to the next one when it is called again
    /// after a stream was handed out: that node's connection broke), else to each of the others
    /// in turn, and stays on the first reached. Every failure is logged (the node, the reason,
    /// the node tried next); the last one is returned when none can be reached.
    pub(crate) async fn reach<S, E: std::fmt::Display, F: Future<Output = Result<S, E>>>(
        &self,
        connect: impl Fn(AMQPUri) -> F,
    ) -> Result<S, E> {
        let count = self.nodes.len();
        let broke = usize::from(self.handed_out.swap(false, Ordering::SeqCst));
        let start = (self.current.load(Ordering::SeqCst) + broke) % count;
        let mut last_error = None;
        for step in 0..count {
            let index = (start + step) % count;
            let node = &self.nodes[index];
            self.trying.store(index, Ordering::SeqCst);
            match connect(node.uri.clone()).await {
                Ok(stream) => {
                    self.handed_out.store(true, Ordering::SeqCst);
                    self.reached(index);
                    return Ok(stream);
                }
                Err(error) => {
                    let next = (step + 1 < count).then(|| &self.nodes[(index + 1) % count].shown);
                    tracing::warn!(
                        connection = %self.connection,
                        node = %node.shown,
                        %error,
                        next = next.map_or("none left: lapin tries again after its back-off", |n| n.as_str()),
                        "cannot reach the broker"
                    );
                    last_error = Some(error);
                }
            }
        }
        Err(last_error.expect("a URL has at least one node"))
    }

    /// Sends the next connection to this URL past the node this one tried last, which did not
    /// open it in time (it accepted and never answered, or its connect hung); unless another
    /// connection reached a node meanwhile.
    pub(crate) fn pass_over(&self) {
        let count = self.nodes.len();
        let trying = self.trying.load(Ordering::SeqCst);
        let mut last = LAST_REACHED.lock().unwrap_or_else(|e| e.into_inner());
        if count > 1 && last.get(&self.url).is_none_or(|&at| at == trying) {
            last.insert(self.url.clone(), (trying + 1) % count);
        }
    }

    /// Stays on node `index`, says so, and counts the connection.
    fn reached(&self, index: usize) {
        let node = &self.nodes[index];
        self.current.store(index, Ordering::SeqCst);
        (LAST_REACHED.lock().unwrap_or_else(|e| e.into_inner())).insert(self.url.clone(), index);
        tracing::info!(connection = %self.connection, node = %node.shown, "connected to the broker");
        metrics::counter!(
            CONNECTIONS_TOTAL,
            "connection" => self.connection.clone(),
            "node" => node.address.clone()
        )
        .increment(1);
    }
}

/// A number below `count`, different from process to process.
fn random_below(count: usize, seed: &str) -> usize {
    let random = std::collections::hash_map::RandomState::new().hash_one(seed);
    (random % count as u64) as usize
}
