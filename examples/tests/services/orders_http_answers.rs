//! The orders service (`orders --http ADDR`) as a process, on SQLite, PostgreSQL and MariaDB,
//! through a plain HTTP/1.1 client of this file's own: each answer of the `Idempotency-Key`
//! guard as a client sees it on the wire (400 for a missing or malformed key, 201 then its
//! replay, 409 while the first request runs, 422 for a key reused, 413, a 401 that is not
//! stored, keys apart per client), the service's own refusals (a field too long, an order id
//! taken), and no warning logged for any of these client mistakes.
//!
//! Run: `cargo test -p idem-examples --test services orders_http_answers::` with RabbitMQ, PostgreSQL and
//! MariaDB up.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_examples::orders::OrderPlaced;
use idem_rabbitmq::lapin::ExchangeKind;
use idem_tests::{Backend, TestBroker, unique};
use sea_orm::{ConnectionTrait, Database, DatabaseConnection, TransactionTrait};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guard_answers_each_client_as_the_draft_says_on_sqlite() {
    let file = std::env::temp_dir().join(unique("orders_answers"));
    let url = format!("sqlite://{}?mode=rwc", file.display());
    answers_on(&url).await;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guard_answers_each_client_as_the_draft_says_on_postgres() {
    answers_on(&Backend::Postgres.url("")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guard_answers_each_client_as_the_draft_says_on_mariadb() {
    answers_on(&Backend::MySql.url("")).await;
}

async fn answers_on(database_url: &str) {
    let broker = TestBroker::connect().await;
    // The service's events reach a queue, as where it is deployed: a relay that finds no route
    // warns, and rightly.
    let (exchange, events) = (unique("orders_answers"), unique("orders_answers_events"));
    broker
        .declare_exchange(&exchange, ExchangeKind::Topic)
        .await;
    broker.declare_queue(&events, &[]).await;
    broker.bind(&events, &exchange, "#").await;
    let service = Service::start(&exchange, database_url);
    let addr = service.addr;
    let order = |customer: &str| OrderPlaced {
        order_id: unique("o"),
        customer: customer.to_owned(),
        amount_cents: 1_250,
    };
    let json = |order: &OrderPlaced| serde_json::to_vec(order).unwrap();

    // The key: missing, or not one structured-field string.
    let first = order("ada");
    let missing = post(addr, None, Some("ada"), &json(&first)).await;
    assert_eq!(missing.status, 400, "{missing:?}");
    assert_eq!(missing.problem()["title"], "Idempotency-Key is missing");
    for malformed in ["unquoted", "\"\"", "\"k\";P=1", "\"a\", \"b\""] {
        let answer = post(addr, Some(malformed), Some("ada"), &json(&first)).await;
        assert_eq!(answer.status, 400, "{malformed}: {answer:?}");
        assert_eq!(answer.problem()["title"], "Idempotency-Key is malformed");
    }

    // A request without credentials gets 401, not stored: the same key then places the order.
    let key = quoted(&uuid());
    let unauthenticated = post(addr, Some(&key), None, &json(&first)).await;
    assert_eq!(unauthenticated.status, 401, "{unauthenticated:?}");
    let placed = post(addr, Some(&key), Some("ada"), &json(&first)).await;
    assert_eq!(
        (placed.status, placed.replayed()),
        (201, false),
        "{placed:?}"
    );
    assert_eq!(
        serde_json::from_str::<OrderPlaced>(&placed.body).ok(),
        Some(first.clone())
    );

    // Its retry gets the stored response, marked; with parameters on the key too.
    for spelling in [key.clone(), format!("{key};attempt=2")] {
        let again = post(addr, Some(&spelling), Some("ada"), &json(&first)).await;
        assert_eq!((again.status, again.replayed()), (201, true), "{again:?}");
        assert_eq!(again.body, placed.body);
        assert!(again.header("idempotency-key-retention").is_some());
    }

    // Keys apart per client: another client's request with the key is its own, and a request
    // without credentials never gets ada's order.
    let other = order("bob");
    let bob = post(addr, Some(&key), Some("bob"), &json(&other)).await;
    assert_eq!((bob.status, bob.replayed()), (201, false), "{bob:?}");
    assert_eq!(
        serde_json::from_str::<OrderPlaced>(&bob.body).ok(),
        Some(other)
    );
    let anonymous = post(addr, Some(&key), None, &json(&first)).await;
    assert_eq!(anonymous.status, 401, "{anonymous:?}");
    assert!(!anonymous.body.contains(&first.order_id), "{anonymous:?}");

    // The same key with another order: 422.
    let reused = post(addr, Some(&key), Some("ada"), &json(&order("ada"))).await;
    assert_eq!(reused.status, 422, "{reused:?}");
    assert_eq!(reused.problem()["title"], "Idempotency-Key is already used");

    // A body over the guard's limit, refused from its announced length.
    let too_large = announce_body(addr, &quoted(&uuid()), 1024 * 1024 + 1).await;
    assert_eq!(too_large.status, 413, "{too_large:?}");

    // The service's own refusals: 422 naming the field, and a taken order id (not 409, which
    // tells a client to retry).
    let mut long = order("ada");
    long.customer = "c".repeat(256);
    let invalid = post(addr, Some(&quoted(&uuid())), Some("ada"), &json(&long)).await;
    assert_eq!(invalid.status, 422, "{invalid:?}");
    assert_eq!(invalid.problem()["field"], "customer", "{invalid:?}");
    let mut taken = order("ada");
    taken.order_id = first.order_id.clone();
    let taken = post(addr, Some(&quoted(&uuid())), Some("ada"), &json(&taken)).await;
    assert_eq!(taken.status, 422, "{taken:?}");
    assert_eq!(
        taken.problem()["type"],
        "urn:idem-examples:orders:order-id-taken"
    );

    // A retry while the first request runs (held by a lock this test takes on the order's
    // row, or on SQLite's file): one of the two gets 409 at once, the other places the order.
    let held = order("ada");
    let lock = Lock::take(database_url, &held.order_id).await;
    let key = quoted(&uuid());
    let (body, one, two) = (json(&held), key.clone(), key.clone());
    let first_copy = tokio::spawn({
        let body = body.clone();
        async move { post(addr, Some(&one), Some("ada"), &body).await }
    });
    let second_copy = tokio::spawn(async move { post(addr, Some(&two), Some("ada"), &body).await });
    let (conflict, running) = match futures_util::future::select(first_copy, second_copy).await {
        futures_util::future::Either::Left((answer, other))
        | futures_util::future::Either::Right((answer, other)) => (answer.unwrap(), other),
    };
    assert_eq!(conflict.status, 409, "{conflict:?}");
    assert!(conflict.header("retry-after").is_some(), "{conflict:?}");
    lock.release().await;
    let placed = running.await.unwrap();
    assert_eq!(
        (placed.status, placed.replayed()),
        (201, false),
        "{placed:?}"
    );
    let again = post(addr, Some(&key), Some("ada"), &json(&held)).await;
    assert_eq!((again.status, again.replayed()), (201, true), "{again:?}");

    // One event per order placed: ada's, bob's and the one placed after the retry's 409.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while broker.depth(&events).await < 3 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(broker.depth(&events).await, 3, "one event per order placed");

    // None of these client mistakes is the server's warning: the service logs none at all.
    let logs = service.stop();
    // Still three once the service and its relay have stopped: no event went out twice.
    assert_eq!(broker.depth(&events).await, 3, "one event per order placed");
    let warned: Vec<&String> = (logs.iter())
        .filter(|line| line.contains("WARN") || line.contains("ERROR"))
        .collect();
    assert!(
        warned.is_empty(),
        "requests logged as warnings: {warned:#?}"
    );
}

fn uuid() -> String {
    uuid::Uuid::new_v4().to_string()
}

fn quoted(key: &str) -> String {
    format!("\"{key}\"")
}

/// The orders service as a child process, and the lines it logs.
struct Service {
    child: Child,
    addr: SocketAddr,
    logs: Arc<Mutex<Vec<String>>>,
}

impl Service {
    /// Starts `orders --http 127.0.0.1:0` on `database_url`, its events on `exchange`, and
    /// waits for the address it serves.
    fn start(exchange: &str, database_url: &str) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_orders"))
            .args(["--http", "127.0.0.1:0"])
            .env("ORDERS_DATABASE_URL", database_url)
            .env("ORDERS_EXCHANGE", exchange)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the orders binary starts");
        let stderr = child.stderr.take().expect("its standard error");
        let logs = Arc::new(Mutex::new(Vec::new()));
        let (serving, addr) = std::sync::mpsc::channel();
        std::thread::spawn({
            let logs = Arc::clone(&logs);
            move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    if line.contains("orders is serving") {
                        let _ = serving.send(served_at(&line));
                    }
                    logs.lock().unwrap().push(line);
                }
            }
        });
        let addr = addr
            .recv_timeout(Duration::from_secs(120))
            .unwrap_or_else(|_| panic!("orders did not serve: {:#?}", logs.lock().unwrap()));
        Self { child, addr, logs }
    }

    /// Stops the service as a service manager would, and returns what it logged.
    fn stop(mut self) -> Vec<String> {
        let terminated = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        if !terminated.is_ok_and(|status| status.success()) {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
        self.logs.lock().unwrap().clone()
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The address in an `orders is serving ... addr=127.0.0.1:PORT ...` line.
fn served_at(line: &str) -> SocketAddr {
    let at = line.find("addr=").expect("the line names the address") + "addr=".len();
    let addr = line[at..].split_whitespace().next().unwrap_or_default();
    addr.parse()
        .unwrap_or_else(|error| panic!("{addr:?} in {line:?}: {error}"))
}

/// A lock that holds the next placing of an order: the order's row inserted in a transaction
/// left open (on SQLite, the file's write lock with it).
struct Lock {
    _db: DatabaseConnection,
    tx: sea_orm::DatabaseTransaction,
}

impl Lock {
    async fn take(database_url: &str, order_id: &str) -> Self {
        let db = Database::connect(database_url)
            .await
            .expect("the database answers");
        let tx = db.begin().await.expect("a transaction begins");
        let insert = format!(
            "INSERT INTO placed_orders (order_id, customer, amount_cents) \
             VALUES ('{order_id}', 'lock', 1)"
        );
        tx.execute_unprepared(&insert)
            .await
            .expect("the order's row is locked");
        Self { _db: db, tx }
    }

    async fn release(self) {
        self.tx.rollback().await.expect("the lock is released");
    }
}

/// What came back: the status line's code, the headers, the body.
#[derive(Debug)]
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        (self.headers.iter())
            .find(|(header, _)| header.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }

    fn replayed(&self) -> bool {
        self.header("idempotent-replayed") == Some("true")
    }

    fn problem(&self) -> Value {
        assert_eq!(
            self.header("content-type"),
            Some("application/problem+json"),
            "{self:?}"
        );
        serde_json::from_str(&self.body).expect("a problem as JSON")
    }
}

/// `POST /orders` with `key` as the raw `Idempotency-Key` value and `token` as a bearer token,
/// if any, and `body` as JSON.
async fn post(addr: SocketAddr, key: Option<&str>, token: Option<&str>, body: &[u8]) -> Reply {
    let mut head = format!("POST /orders HTTP/1.1\r\nHost: {addr}\r\n");
    if let Some(key) = key {
        head.push_str(&format!("Idempotency-Key: {key}\r\n"));
    }
    if let Some(token) = token {
        head.push_str(&format!("Authorization: Bearer {token}\r\n"));
    }
    head.push_str(&format!(
        "Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    ));
    exchange(addr, head.as_bytes(), body).await
}

/// `POST /orders` announcing a body of `length` bytes, and reading the answer before sending it.
async fn announce_body(addr: SocketAddr, key: &str, length: usize) -> Reply {
    let head = format!(
        "POST /orders HTTP/1.1\r\nHost: {addr}\r\nIdempotency-Key: {key}\r\n\
         Authorization: Bearer ada\r\nContent-Type: application/json\r\n\
         Content-Length: {length}\r\nConnection: close\r\n\r\n"
    );
    exchange(addr, head.as_bytes(), b"").await
}

/// Sends `head` and `body` on a connection of its own and reads the response to its end.
async fn exchange(addr: SocketAddr, head: &[u8], body: &[u8]) -> Reply {
    let mut stream = TcpStream::connect(addr).await.expect("the service accepts");
    stream.write_all(head).await.expect("the head is sent");
    stream.write_all(body).await.expect("the body is sent");
    let mut raw = Vec::new();
    stream
        .read_to_end(&mut raw)
        .await
        .expect("the response is read");
    parse(&raw)
}

/// An HTTP/1.1 response: a status line, headers, and a body of `Content-Length` bytes or in
/// chunks.
fn parse(raw: &[u8]) -> Reply {
    let end = (raw.windows(4))
        .position(|window| window == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no end of head in {:?}", String::from_utf8_lossy(raw)));
    let head = String::from_utf8_lossy(&raw[..end]).into_owned();
    let mut lines = head.split("\r\n");
    let status = (lines.next().and_then(|line| line.split(' ').nth(1)))
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    let headers: Vec<(String, String)> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_owned(), value.trim().to_owned()))
        .collect();
    let rest = &raw[end + 4..];
    let chunked = headers.iter().any(|(name, value)| {
        name.eq_ignore_ascii_case("transfer-encoding") && value.eq_ignore_ascii_case("chunked")
    });
    let body = if chunked {
        unchunk(rest)
    } else {
        rest.to_vec()
    };
    Reply {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

/// A chunked body's bytes (RFC 9112, section 7.1), its extensions and trailers ignored.
fn unchunk(mut rest: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    loop {
        let line_end = (rest.windows(2))
            .position(|window| window == b"\r\n")
            .expect("a chunk's size line");
        let size = String::from_utf8_lossy(&rest[..line_end]);
        let size = size.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size, 16).expect("a chunk's size in hexadecimal");
        rest = &rest[line_end + 2..];
        if size == 0 {
            return body;
        }
        body.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
}
