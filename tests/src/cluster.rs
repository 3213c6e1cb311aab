//! The three-node RabbitMQ cluster of `tests/cluster/rabbitmq-cluster`, for the cluster tests:
//! started when a test takes it (the nodes that are down), one test at a time, its nodes killed,
//! stopped and started, and a quorum queue's leader and depth read from a node that runs.
//!
//! Node `n` (1 to 3) is `idem<n>@localhost`, AMQP on `127.0.0.1:570<n>`.

use std::path::PathBuf;
use std::time::Duration;

use tokio::process::Command;
use tokio::sync::{Mutex, MutexGuard};

/// The cluster's nodes.
pub const NODES: [u8; 3] = [1, 2, 3];

/// One test at a time kills and restarts nodes.
static SERIAL: Mutex<()> = Mutex::const_new(());

/// The cluster, taken by one test.
#[derive(Debug)]
pub struct Cluster {
    _serial: MutexGuard<'static, ()>,
}

impl Cluster {
    /// Takes the cluster once the test before has let it go, starting the nodes that are down
    /// (the first start takes about 30 s). A cluster whose nodes run but still cannot declare a
    /// quorum queue after a minute is stopped and started afresh (its queues are the tests'
    /// own). Fails the test if the cluster does not come up.
    pub async fn take() -> Self {
        let serial = SERIAL.lock().await;
        script("start").await;
        if let Err(refusal) = quorum_queues_declare().await {
            eprintln!("the cluster is started afresh: {refusal}");
            script("stop").await;
            script("start").await;
            quorum_queues_declare()
                .await
                .unwrap_or_else(|e| panic!("{e}"));
        }
        Self { _serial: serial }
    }

    /// The URL of `node`.
    pub fn url(node: u8) -> String {
        format!("amqp://guest:guest@127.0.0.1:570{node}/%2f")
    }

    /// Every node's URL, comma-separated as `AMQP_URL` holds them, starting with `first`.
    pub fn urls_from(first: u8) -> String {
        let mut urls = Vec::new();
        for offset in 0..NODES.len() as u8 {
            urls.push(Self::url((first - 1 + offset) % NODES.len() as u8 + 1));
        }
        urls.join(",")
    }

    /// Kills `node` with SIGKILL, as a crashed machine would stop it, and waits until it no
    /// longer answers.
    pub async fn kill(&self, node: u8) {
        self.sigkill(node).await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while self.runs(node).await {
            assert!(tokio::time::Instant::now() < deadline, "node {node} died");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Sends `node` SIGKILL, without waiting.
    pub async fn sigkill(&self, node: u8) {
        let pid_file = data_dir().join(format!("idem{node}/pid"));
        let pid = tokio::fs::read_to_string(&pid_file)
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", pid_file.display()));
        let status = Command::new("kill")
            .args(["-KILL", pid.trim()])
            .status()
            .await
            .expect("kill runs");
        assert!(status.success(), "node {node} (pid {pid}) killed");
    }

    /// Starts the nodes that are down and waits until they run in the cluster.
    pub async fn start_stopped(&self) {
        start_stopped().await;
    }

    /// Whether `node` answers and runs RabbitMQ.
    pub async fn runs(&self, node: u8) -> bool {
        ctl(node, &["eval", "rabbit:is_running()."])
            .await
            .is_some_and(|out| out == "true")
    }

    /// Runs `rabbitmqctl -n idem<node>@localhost <args>`; fails the test if it fails.
    pub async fn ctl(&self, node: u8, args: &[&str]) -> String {
        ctl(node, args)
            .await
            .unwrap_or_else(|| panic!("rabbitmqctl {args:?} on node {node} failed"))
    }

    /// The node that hosts `queue`'s leader, as a running node tells.
    pub async fn leader(&self, queue: &str) -> u8 {
        let listing = self.ask_any(&["list_queues", "name", "leader"]).await;
        let line = listing
            .lines()
            .find(|line| line.split_whitespace().next() == Some(queue))
            .unwrap_or_else(|| panic!("{queue} in {listing}"));
        let leader = line.split_whitespace().nth(1).unwrap_or_default();
        NODES
            .into_iter()
            .find(|node| leader == format!("idem{node}@localhost"))
            .unwrap_or_else(|| panic!("a node of the cluster leads {queue}: {line}"))
    }

    /// How many messages `queue` holds (ready and unacknowledged), as a running node tells;
    /// `None` while it has no leader (it reads 0 then: never conclude from one reading).
    pub async fn messages(&self, queue: &str) -> Option<u64> {
        let listing = self.ask_any(&["list_queues", "name", "messages"]).await;
        listing
            .lines()
            .find(|line| line.split_whitespace().next() == Some(queue))
            .and_then(|line| line.split_whitespace().nth(1)?.parse().ok())
    }

    async fn ask_any(&self, args: &[&str]) -> String {
        for node in NODES {
            if let Some(out) = ctl(node, args).await {
                return out;
            }
        }
        panic!("no node of the cluster answered rabbitmqctl {args:?}")
    }
}

/// [`Cluster::start_stopped`], for a task of its own while the test goes on (the test holds
/// the cluster meanwhile).
pub async fn start_stopped() {
    script("start").await;
    quorum_queues_declare()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
}

/// Waits until a quorum queue can be declared through every node. A node that runs in the
/// cluster may still refuse to start a new queue's replicas (`INTERNAL_ERROR`) for a while after
/// a restart; a test that declares its queues then would fail on the cluster's state, not on
/// idem. Says which node still refuses after a minute, and why.
async fn quorum_queues_declare() -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    for node in NODES {
        loop {
            match declare_probe(node).await {
                Ok(()) => break,
                Err(error) if tokio::time::Instant::now() < deadline => {
                    eprintln!("node {node} declares no quorum queue yet: {error}");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                Err(error) => return Err(format!("node {node} declares no quorum queue: {error}")),
            }
        }
    }
    Ok(())
}

/// Declares and deletes a quorum queue through `node`.
async fn declare_probe(node: u8) -> Result<(), idem_rabbitmq::lapin::Error> {
    use idem_rabbitmq::lapin::options::{QueueDeclareOptions, QueueDeleteOptions};
    use idem_rabbitmq::lapin::types::{AMQPValue, FieldTable};
    use idem_rabbitmq::lapin::{Connection, ConnectionProperties};

    let connection =
        Connection::connect(&Cluster::url(node), ConnectionProperties::default()).await?;
    let probed = async {
        let channel = connection.create_channel().await?;
        let queue = format!("idem-cluster-probe-{node}");
        let mut arguments = FieldTable::default();
        let quorum = AMQPValue::LongString("quorum".into());
        arguments.insert("x-queue-type".into(), quorum);
        let options = QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        };
        channel
            .queue_declare(queue.as_str().into(), options, arguments)
            .await?;
        channel
            .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
            .await
    }
    .await;
    // Closed whatever the probe found: a node that keeps refusing is asked once a second.
    let _ =
        idem_rabbitmq::amqp::close_within(&connection, "probe done", Duration::from_secs(5)).await;
    probed.map(|_| ())
}

/// Closes, from the broker side, every connection of the cluster whose client-provided name
/// contains `name`, as [`close_connections`](crate::rabbit::close_connections) does on the
/// local broker. Returns how many were closed.
pub async fn close_connections(name: &str) -> usize {
    for node in NODES {
        let Some(listing) = ctl(node, &["list_connections", "pid", "client_properties"]).await
        else {
            continue;
        };
        let pids: Vec<&str> = listing
            .lines()
            .filter(|line| line.contains(name))
            .filter_map(|line| line.split_whitespace().next())
            .collect();
        let mut closed = 0;
        for pid in &pids {
            closed += usize::from(
                ctl(node, &["close_connection", pid, "closed by test"])
                    .await
                    .is_some(),
            );
        }
        return closed;
    }
    0
}

/// Where the cluster keeps its nodes' data: `IDEM_RABBITMQ_CLUSTER_DIR`, as the script.
fn data_dir() -> PathBuf {
    std::env::var_os("IDEM_RABBITMQ_CLUSTER_DIR").map_or_else(
        || PathBuf::from("/var/tmp/idem-rabbitmq-cluster"),
        PathBuf::from,
    )
}

async fn script(command: &str) {
    run_script("rabbitmq-cluster", command).await;
}

/// Runs `tests/cluster/<name> <command>` (the cluster's script, a database pair's); fails the
/// test with what it printed if it fails.
pub async fn run_script(name: &str, command: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("cluster")
        .join(name);
    let output = Command::new("bash")
        .arg(&path)
        .arg(command)
        .output()
        .await
        .unwrap_or_else(|e| panic!("{} runs: {e}", path.display()));
    assert!(
        output.status.success(),
        "{} {command} failed: {}{}",
        path.display(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

async fn ctl(node: u8, args: &[&str]) -> Option<String> {
    let output = Command::new("rabbitmqctl")
        .args(["-q", "-n", &format!("idem{node}@localhost")])
        .args(args)
        .output()
        .await
        .expect("rabbitmqctl runs");
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).trim().to_owned())
}
