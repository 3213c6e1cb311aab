//! Connecting to RabbitMQ.

#[cfg(unix)]
use std::os::fd::{AsFd, OwnedFd as OwnedSocket};
#[cfg(windows)]
use std::os::windows::io::{AsSocket, OwnedSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use async_compat::Compat;
use std::time::Duration;

use lapin::tcp::{AMQPUriTcpExt, AsyncTcpStream};
use lapin::uri::AMQPUri;
use lapin::{Connection, ConnectionProperties};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::link_runtime::{LinkRuntime, Tasks};
use crate::nodes::Nodes;
use crate::url::AmqpUrl;

/// How long a look at a connection's status may take on its runtime before it counts as down.
const LOOK_LIMIT: Duration = Duration::from_secs(1);

/// A connect for [`Nodes::reach`]: TCP (and TLS) to a node, with the nodes' TLS settings, on
/// `runtime`. A macro because lapin does not name its runtime's type.
macro_rules! tcp_to {
    ($nodes:expr, $runtime:expr) => {{
        let (nodes, runtime) = ($nodes, $runtime);
        move |node: AMQPUri| async move {
            AMQPUriTcpExt::connect_with_config_async(&node, nodes.tls(), runtime).await
        }
    }};
}

/// Connects with lapin's automatic recovery on, naming the connection so operators can find it
/// (`rabbitmqctl list_connections client_properties`). A cluster's nodes ([`AmqpUrl`]) are
/// tried in turn, at the start and at every recovery.
pub async fn connect(url: &AmqpUrl, connection_name: &str) -> Result<Connection> {
    let properties = ConnectionProperties::default().enable_auto_recover();
    open(url, connection_name, properties).await
}

/// Connects without automatic recovery, for a tool whose work a lost connection must stop (its
/// unacknowledged deliveries go back to their queues, and lapin would hand on a new channel
/// as if nothing happened): [`connect`] otherwise.
pub async fn connect_once(url: &AmqpUrl, connection_name: &str) -> Result<Connection> {
    open(url, connection_name, ConnectionProperties::default()).await
}

/// Closes `connection`, given up after `limit` ([`Error::TimedOut`]): lapin's close can wait
/// for good on a connection the broker is closing too (a channel the broker closed with an
/// error while the client closed it), and a tool or a service stopping must not wait with it.
/// A connection that is not connected is left alone; the broker gives back what it held.
pub async fn close_within(connection: &Connection, reason: &str, limit: Duration) -> Result<()> {
    if !connection.status().connected() {
        return Ok(());
    }
    let closing = connection.close(200, reason.into());
    match tokio::time::timeout(limit, closing).await {
        Ok(closed) => closed.map_err(Error::amqp("connection.close")),
        Err(_) => Err(Error::TimedOut {
            operation: "closing the connection".into(),
            after: limit,
        }),
    }
}

/// Opens a connection named `name` to the first of `url`'s nodes it reaches, with `properties`;
/// lapin's reconnections, if `properties` asks for them, go through the nodes in turn too. An
/// opening given up on (its future dropped) shuts its plain TCP socket down (a TLS one keeps
/// its socket to itself) and refuses lapin any further attempt, so that lapin's thread does not
/// wait on a silent broker for good; the next connection to the URL passes over the node that
/// left it waiting.
pub(crate) async fn open(
    url: &AmqpUrl,
    name: &str,
    properties: ConnectionProperties,
) -> Result<Connection> {
    let nodes = Arc::new(Nodes::of(url, name)?);
    let gate = Arc::new(Gate::default());
    let opened = open_gated(url, name, properties, nodes, gate, Tasks::Caller).await?;
    Ok(opened.connection)
}

/// Opens a connection as [`open`] does, given up after `limit`: [`Error::TimedOut`] when it was
/// left waiting on a node (one that accepted the connection and never answered, or whose connect
/// hung), which the next connection to the URL then passes over; [`Error::Connect`] with the
/// last reason when every node refused it.
pub(crate) async fn open_within(
    url: &AmqpUrl,
    name: &str,
    properties: ConnectionProperties,
    limit: Duration,
    tasks: Tasks,
) -> Result<Link> {
    let nodes = Arc::new(Nodes::of(url, name)?);
    let gate = Arc::new(Gate::default());
    let opening = open_gated(url, name, properties, nodes, Arc::clone(&gate), tasks);
    let Ok(opened) = tokio::time::timeout(limit, opening).await else {
        if gate.left_waiting() {
            return Err(Error::TimedOut {
                operation: format!("connecting to {url}"),
                after: limit,
            });
        }
        let reason = gate
            .unreached
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        let reason = reason.unwrap_or_else(|| {
            let why = format!("no node answered within {limit:?}");
            std::io::Error::new(std::io::ErrorKind::TimedOut, why)
        });
        return Err(Error::Connect {
            url: url.redacted(),
            source: reason.into(),
        });
    };
    opened
}

/// Opens a connection as [`open`] does, every stream it gets going through `gate`, its lapin
/// tasks where `tasks` says.
async fn open_gated(
    url: &AmqpUrl,
    name: &str,
    properties: ConnectionProperties,
    nodes: Arc<Nodes>,
    gate: Arc<Gate>,
    tasks: Tasks,
) -> Result<Link> {
    let failed = |source: lapin::Error| Error::Connect {
        url: url.redacted(),
        source,
    };
    let own = LinkRuntime::start(tasks).map_err(|e| failed(e.into()))?;
    let runtime = own.lapin();
    let uri = nodes.handshake_uri();
    let first = first_stream(&nodes, tcp_to!(&nodes, &runtime), &gate).await;
    let first = Handover::new(first.map_err(|e| failed(e.into()))?);
    let mut guard = OpenGuard(Some((Arc::clone(&gate), Arc::clone(&nodes))));
    let shared = Arc::clone(&gate);
    let connect = async move |_: AMQPUri, runtime| {
        let refused = || -> lapin::Error {
            std::io::Error::new(
                std::io::ErrorKind::ConnectionRefused,
                "connection given up on",
            )
            .into()
        };
        shared.stream_out.store(false, Ordering::SeqCst);
        if shared.retired.load(Ordering::SeqCst) {
            return Err(refused());
        }
        let tcp = tcp_to!(&nodes, &runtime);
        let stream = match first.take() {
            Some(stream) => stream,
            None => {
                shared.reaching();
                nodes
                    .reach(tcp)
                    .await
                    .inspect_err(|e| shared.unreached(e))?
            }
        };
        shared.note_socket(&stream);
        shared.reached.store(true, Ordering::SeqCst);
        shared.stream_out.store(true, Ordering::SeqCst);
        if shared.retired.load(Ordering::SeqCst) {
            shared.stream_out.store(false, Ordering::SeqCst);
            return Err(refused());
        }
        Ok(stream)
    };
    let properties = properties.with_connection_name(name.into());
    let connection = Connection::connector(uri, runtime, connect, properties).await;
    let Some((gate, _)) = guard.0.take() else {
        unreachable!("the guard is disarmed only here")
    };
    match connection {
        Ok(connection) => {
            gate.end_opening(false);
            Ok(Link {
                connection,
                gate,
                runtime: own,
            })
        }
        // A connection that failed to open is recovered by nobody: retired.
        Err(source) => {
            gate.retired.store(true, Ordering::SeqCst);
            gate.end_opening(true);
            let broken = matches!(source.kind(), lapin::ErrorKind::IOError(_));
            if broken && gate.reached.load(Ordering::SeqCst) {
                // A node that took the connection and broke it (killed during the handshake,
                // a load balancer without a live node behind it): the broker's state.
                let operation = format!("connecting to {url}");
                return Err(Error::Amqp { operation, source });
            }
            Err(failed(source))
        }
    }
}

/// The stream a connection opens on, reached before lapin takes the connection over: a node
/// whose TLS refuses the connection (a certificate not trusted, a plain port) fails it at once
/// with its reason, where lapin would try again for minutes. `None` when no node could be
/// reached for another reason: lapin tries again after its back-off.
async fn first_stream<S, F: Future<Output = std::io::Result<S>>>(
    nodes: &Nodes,
    tcp: impl Fn(AMQPUri) -> F,
    gate: &Gate,
) -> std::io::Result<Option<S>> {
    match nodes.reach(tcp).await {
        Ok(stream) => Ok(Some(stream)),
        Err(error) if error.kind() == std::io::ErrorKind::InvalidData => Err(error),
        Err(error) => {
            gate.unreached(&error);
            Ok(None)
        }
    }
}

/// The first stream, handed to lapin's first call for one.
struct Handover<S>(Mutex<Option<S>>);

impl<S> Handover<S> {
    fn new(stream: Option<S>) -> Self {
        Self(Mutex::new(stream))
    }

    fn take(&self) -> Option<S> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

/// A connection with a gate that refuses it any further reconnection once its owner has given
/// up on it (the consumer's and the relay's connections, whose lapin recovery is bounded in time;
/// also every connection while it opens).
///
/// lapin cannot be told to stop recovering a connection (`close` needs it connected), and left
/// alone it keeps reconnecting for minutes; a connection that came back would recreate its
/// consumer and take deliveries nobody reads. Every reconnection goes through the TCP connect
/// given to lapin here, which fails once the gate is closed.
#[derive(Debug)]
pub(crate) struct Link {
    pub(crate) connection: Connection,
    gate: Arc<Gate>,
    /// The runtime the connection's lapin tasks run on, its own.
    pub(crate) runtime: LinkRuntime,
}

/// What the TCP connect given to lapin shares with the consumer.
#[derive(Debug, Default)]
struct Gate {
    /// No more connections: every attempt fails.
    retired: AtomicBool,
    /// The last attempt gave lapin a TCP stream, on which a handshake may still complete. Set
    /// before the attempt's last look at `retired`, so that a watcher that finds it unset after
    /// retiring knows no stream can get through any more.
    stream_out: AtomicBool,
    /// While the connection opens, a handle on its socket (plain TCP): an opening given up on
    /// shuts it down, or lapin's thread would wait on a silent broker for good.
    opening: Mutex<Opening>,
    /// A node accepted a stream of this connection once: an opening that does not end is a
    /// silent broker, not an unreachable one.
    reached: AtomicBool,
    /// Why the last attempt reached no node.
    unreached: Mutex<Option<std::io::Error>>,
}

/// The socket of a connection that is opening.
#[derive(Debug, Default)]
struct Opening {
    /// Another handle on the socket lapin was given last.
    socket: Option<OwnedSocket>,
    /// The connection opened, or its opening was given up on: no socket is kept any more (the
    /// sockets of lapin's reconnections are its own).
    over: bool,
}

impl Gate {
    fn opening(&self) -> std::sync::MutexGuard<'_, Opening> {
        self.opening.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the opening was left waiting on a node (it accepted the connection and did not
    /// answer, or its connect hung), rather than on nodes that refused it.
    fn left_waiting(&self) -> bool {
        self.reached.load(Ordering::SeqCst)
            || self
                .unreached
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_none()
    }

    /// An attempt to reach a node begins: the reason an earlier one failed no longer holds.
    fn reaching(&self) {
        *self.unreached.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Remembers why an attempt reached no node.
    fn unreached(&self, error: &std::io::Error) {
        let copy = std::io::Error::new(error.kind(), error.to_string());
        *self.unreached.lock().unwrap_or_else(|e| e.into_inner()) = Some(copy);
    }

    /// Keeps a handle on the socket of a plain TCP `stream` while the connection opens (a TLS
    /// one keeps its socket to itself).
    fn note_socket(&self, stream: &AsyncTcpStream<Compat<tokio::net::TcpStream>>) {
        let mut opening = self.opening();
        if !opening.over
            && let AsyncTcpStream::Plain(plain) = stream
            && let Ok(socket) = socket_of(plain.get_ref())
        {
            opening.socket = Some(socket);
        }
    }

    /// Ends the opening: forgets the socket's handle, shut down first if `give_up`.
    fn end_opening(&self, give_up: bool) {
        let socket = {
            let mut opening = self.opening();
            opening.over = true;
            opening.socket.take()
        };
        if let Some(socket) = socket
            && give_up
        {
            let _ = std::net::TcpStream::from(socket).shutdown(std::net::Shutdown::Both);
        }
    }
}

/// Another handle on `stream`'s socket.
#[cfg(unix)]
fn socket_of(stream: &tokio::net::TcpStream) -> std::io::Result<OwnedSocket> {
    stream.as_fd().try_clone_to_owned()
}

/// Another handle on `stream`'s socket.
#[cfg(windows)]
fn socket_of(stream: &tokio::net::TcpStream) -> std::io::Result<OwnedSocket> {
    stream.as_socket().try_clone_to_owned()
}

/// Retires the gate of a connection whose opening was abandoned (its future dropped), shuts its
/// socket down, and sends the next connection to its URL past a node that left it waiting.
struct OpenGuard(Option<(Arc<Gate>, Arc<Nodes>)>);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        if let Some((gate, nodes)) = self.0.take() {
            gate.retired.store(true, Ordering::SeqCst);
            gate.end_opening(true);
            if gate.left_waiting() {
                nodes.pass_over();
            }
        }
    }
}

impl Link {
    /// Connects like [`connect`], lapin's recovery given up after `recovery_bound` of waiting
    /// between attempts, the opening given up after `limit` ([`open_within`]).
    pub(crate) async fn open(
        url: &AmqpUrl,
        name: &str,
        recovery_bound: Duration,
        limit: Duration,
    ) -> Result<Self> {
        let properties = ConnectionProperties::default()
            .enable_auto_recover()
            .configure_backoff(|backoff| backoff.with_total_delay(Some(recovery_bound)));
        open_within(url, name, properties, limit, Tasks::Own).await
    }

    /// Whether the connection and `channel` (one of its own) are up, as told on the
    /// connection's runtime within a second: a lapin lock held for good there (lapin 4.12's
    /// recovery deadlock) makes them look down, and never blocks the caller's thread.
    pub(crate) async fn up(&self, channel: &lapin::Channel) -> bool {
        let (connection, channel) = (self.connection.status().clone(), channel.status().clone());
        let look = async move { connection.connected() && channel.connected() };
        self.runtime.run(LOOK_LIMIT, look).await == Some(true)
    }

    /// Closes the connection, best effort and bounded, and refuses lapin any reconnection of it.
    pub(crate) async fn close(&self, reason: &str) {
        self.gate.retired.store(true, Ordering::SeqCst);
        let _ = close_within(&self.connection, reason, Duration::from_secs(5)).await;
    }

    /// Whether lapin may still bring the connection back: it is connected, or a stream it got
    /// before the gate closed may still complete a handshake.
    fn may_come_back(&self) -> bool {
        let status = self.connection.status();
        if status.closed() || status.errored() {
            return false;
        }
        status.connected() || self.gate.stream_out.load(Ordering::SeqCst)
    }
}

/// Connections the consumer gave up on, each watched until it cannot come back: its gate closed
/// (no reconnection can start any more), closed if it is connected or becomes connected (it may
/// have been reconnecting when retired), and forgotten once no stream of it can get through, or
/// at its deadline.
pub(crate) struct Retirees {
    watchers: std::sync::Mutex<JoinSet<()>>,
    timeout: Duration,
}

impl Retirees {
    pub(crate) fn new(timeout: Duration) -> Self {
        Self {
            watchers: std::sync::Mutex::new(JoinSet::new()),
            timeout,
        }
    }

    /// Retires `link` and watches it in the background.
    pub(crate) fn retire(&self, link: Link) {
        link.gate.retired.store(true, Ordering::SeqCst);
        let deadline = Instant::now() + self.timeout;
        let mut watchers = self.watchers.lock().unwrap_or_else(|e| e.into_inner());
        while watchers.try_join_next().is_some() {}
        watchers.spawn(watch(link, deadline));
    }

    /// Waits, at most `grace`, until no retired connection can come back. Any still watched then
    /// go on being watched in the background until their deadline.
    pub(crate) async fn wait_until_gone(&self, grace: Duration) {
        let mut watchers =
            std::mem::take(&mut *self.watchers.lock().unwrap_or_else(|e| e.into_inner()));
        let all = async { while watchers.join_next().await.is_some() {} };
        if tokio::time::timeout(grace, all).await.is_err() {
            tracing::debug!(
                still_watched = watchers.len(),
                "replaced connections still watched after shutdown"
            );
            watchers.detach_all();
        }
    }
}

/// Closes `link`'s connection as soon as it is connected, until it cannot come back or
/// `deadline`.
async fn watch(link: Link, deadline: Instant) {
    while link.may_come_back() && Instant::now() <= deadline {
        if link.connection.status().connected() {
            link.close("replaced").await;
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
