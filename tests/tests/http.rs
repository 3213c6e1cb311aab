//! `Idempotency-Key` on HTTP routes (idem-http) on each backend, through an axum router: the
//! draft's answers (400, 409, 422, the replay), scopes, concurrent retries, the transactional
//! endpoint whose writes, response and staged event commit together, and a database lost
//! mid-request.
//!
//! Run: `cargo test -p idem-tests --test http` with PostgreSQL and MariaDB up (see README).

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::header::{CONTENT_TYPE, LOCATION};
use axum::http::{HeaderMap, Request, Response, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use idem_http::{
    Endpoint, EndpointError, Idempotency, NotStored, REPLAYED_HEADER, RETENTION_HEADER,
};
use idem_runtime::{Context, Inbox, Outbox, OutboxMessage};
use idem_tests::cancel::cancelled_after;
use idem_tests::db::insert_effect;
use idem_tests::proxy::behind_proxy;
use idem_tests::{Backend, TestDb, on_each_backend, unique};
use sea_orm::DatabaseConnection;
use tokio::sync::Notify;
use tower::ServiceExt;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

on_each_backend!(
    a_request_without_a_usable_key_is_refused_and_runs_nothing,
    a_retry_gets_the_stored_response_and_runs_nothing,
    the_same_key_with_another_request_is_refused,
    a_retry_while_the_first_runs_gets_409_then_the_stored_response,
    keys_are_scoped_per_route_and_principal,
    thirty_two_concurrent_retries_have_one_effect,
    a_transactional_endpoint_commits_its_write_response_and_event_together,
    a_failed_or_rejected_request_keeps_nothing_and_the_retry_runs,
    a_first_server_error_is_stored_and_replayed,
    clients_hanging_up_at_any_moment_leave_each_request_once,
    a_layered_response_too_large_to_keep_is_kept_as_a_500_and_not_run_again,
    a_layered_service_that_fails_once_called_is_not_run_again,
    a_layered_service_refusing_with_not_stored_leaves_the_key_free,
    a_transactional_response_too_large_to_keep_is_rolled_back,
);

/// Faults of the database servers'.
mod servers {
    use super::*;
    on_each_backend!([postgres, mysql]: a_database_lost_mid_request_answers_503_and_the_retry_runs_once);
}

/// What a test's routes share: where effects go, and a gate a held request waits at.
#[derive(Clone)]
struct Shop {
    db: DatabaseConnection,
    effects: String,
    started: Arc<Notify>,
    release: Arc<Notify>,
}

/// `POST /payments` and `POST /refunds` behind the layer: each writes one effect row (the
/// body) outside any transaction and answers 201. `x-script: hold` waits for the test's
/// release; `invalid` answers 400 without storing; `500` writes and answers 500; `big` writes and
/// answers more than the layer keeps; `panic` writes and panics.
async fn pay(State(shop): State<Shop>, headers: HeaderMap, body: Bytes) -> Response<Body> {
    let script = headers
        .get("x-script")
        .and_then(|value| value.to_str().ok());
    if script == Some("hold") {
        shop.started.notify_one();
        shop.release.notified().await;
    }
    if script == Some("invalid") {
        let mut response = (StatusCode::BAD_REQUEST, "invalid payment").into_response();
        response.extensions_mut().insert(NotStored);
        return response;
    }
    let payment = String::from_utf8_lossy(&body).into_owned();
    let written = insert_effect(&shop.db, &shop.effects, "pay", &payment, "paid").await;
    if let Err(error) = written {
        return (StatusCode::INTERNAL_SERVER_ERROR, error.to_string()).into_response();
    }
    if script == Some("big") {
        return (
            StatusCode::OK,
            "x".repeat(Idempotency::DEFAULT_RESPONSE_LIMIT + 1),
        )
            .into_response();
    }
    if script == Some("panic") {
        panic!("the payment provider's client panicked after paying");
    }
    if script == Some("500") {
        return (StatusCode::INTERNAL_SERVER_ERROR, "the provider failed").into_response();
    }
    let run = unique("run");
    let headers = [
        (LOCATION, format!("/payments/{payment}")),
        (CONTENT_TYPE, "text/plain".to_owned()),
    ];
    (
        StatusCode::CREATED,
        headers,
        [("x-run", run.clone())],
        format!("paid {payment} in {run}"),
    )
        .into_response()
}

/// The layered routes, keys scoped per principal by `x-user`.
fn layered(keys: Idempotency, shop: Shop) -> Router {
    let keys = keys.principal(|parts| {
        let user = parts.headers.get("x-user")?;
        Some(user.to_str().ok()?.to_owned())
    });
    Router::new()
        .route("/payments", post(pay))
        .route("/refunds", post(pay))
        .route_layer(keys.layer())
        .with_state(shop)
}

/// `POST /orders`, transactional: writes the order as an effect row, stages `order.placed`,
/// answers 201. `x-script: fail` fails after both, `reject` rejects after both, `slow` takes
/// 1.5 s after both, `cut` waits for the test's release after both, `big` answers more than the
/// guard keeps after both.
struct PlaceOrder {
    effects: String,
    started: Arc<Notify>,
    release: Arc<Notify>,
}

impl Endpoint for PlaceOrder {
    async fn handle(
        &self,
        cx: &Context<'_>,
        request: Request<Bytes>,
    ) -> Result<Response<Bytes>, EndpointError> {
        let tx = cx.transaction().expect("a transactional endpoint");
        let order = String::from_utf8_lossy(request.body()).into_owned();
        insert_effect(tx, &self.effects, "orders", &order, "placed").await?;
        cx.stage(OutboxMessage::new("orders", "order.placed", order.clone()))
            .await?;
        let script = request
            .headers()
            .get("x-script")
            .and_then(|value| value.to_str().ok());
        match script {
            Some("fail") => return Err(EndpointError::Failed("the stock service is down".into())),
            Some("reject") => {
                let response = Response::builder().status(StatusCode::BAD_REQUEST);
                return Err(EndpointError::Rejected(
                    response.body(Bytes::from("no stock")).unwrap(),
                ));
            }
            Some("slow") => tokio::time::sleep(Duration::from_millis(1500)).await,
            Some("big") => {
                let body = "x".repeat(Idempotency::DEFAULT_RESPONSE_LIMIT + 1);
                return Ok(Response::new(Bytes::from(body)));
            }
            Some("cut") => {
                self.started.notify_one();
                self.release.notified().await;
                insert_effect(tx, &self.effects, "orders", &order, "after the cut").await?;
            }
            _ => {}
        }
        let response = Response::builder()
            .status(StatusCode::CREATED)
            .header(LOCATION, format!("/orders/{order}"))
            .body(Bytes::from(format!("order {order} placed")))
            .unwrap();
        Ok(response)
    }
}

/// A test's world: the database, the effects table, the outbox table, both apps.
struct World {
    db: TestDb,
    effects: String,
    outbox: String,
    payments: Router,
    orders: Router,
    started: Arc<Notify>,
    release: Arc<Notify>,
}

async fn world(backend: Backend) -> World {
    world_on(TestDb::connect(backend).await).await
}

async fn world_on(db: TestDb) -> World {
    let outbox_table = db.table("outbox");
    let outbox = Outbox::builder(db.db.clone())
        .table(outbox_table.clone())
        .build()
        .await
        .expect("outbox builds");
    let inbox = Inbox::builder(db.db.clone())
        .table(db.table("inbox"))
        .outbox(outbox)
        .claim_wait(Duration::from_millis(500))
        .build()
        .await
        .expect("inbox builds");
    let effects = db.effects_table().await;
    let (started, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let shop = Shop {
        db: db.db.clone(),
        effects: effects.clone(),
        started: Arc::clone(&started),
        release: Arc::clone(&release),
    };
    let keys =
        |consumer: &str| Idempotency::new(inbox.clone(), consumer).expect("a valid consumer name");
    let place = PlaceOrder {
        effects: effects.clone(),
        started: Arc::clone(&started),
        release: Arc::clone(&release),
    };
    World {
        payments: layered(keys("http.payments"), shop),
        orders: Router::new().route_service("/orders", keys("http.orders").transactional(place)),
        db,
        effects,
        outbox: outbox_table,
        started,
        release,
    }
}

/// What a request got back.
#[derive(Debug)]
struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

impl Answer {
    async fn read(response: Response<Body>) -> Self {
        let (parts, body) = response.into_parts();
        let body = axum::body::to_bytes(body, usize::MAX)
            .await
            .expect("the body reads");
        Self {
            status: parts.status,
            headers: parts.headers,
            body: String::from_utf8_lossy(&body).into_owned(),
        }
    }

    fn replayed(&self) -> bool {
        self.headers
            .get(REPLAYED_HEADER)
            .is_some_and(|value| value == "true")
    }

    fn problem(&self) -> serde_json::Value {
        assert_eq!(
            self.headers[CONTENT_TYPE], "application/problem+json",
            "{self:?}"
        );
        serde_json::from_str(&self.body).expect("a problem+json body")
    }
}

/// A `POST` to `path` with `key` as the header's raw value, if any.
fn request(path: &str, key: Option<&str>, body: &str) -> axum::http::request::Builder {
    let builder = Request::post(path);
    match key {
        Some(key) => builder.header("idempotency-key", key),
        None => builder,
    }
    .header("x-body", body)
}

async fn send(app: &Router, builder: axum::http::request::Builder, body: &str) -> Answer {
    let request = builder.body(Body::from(body.to_owned())).unwrap();
    let response = app
        .clone()
        .oneshot(request)
        .await
        .expect("the router answers");
    Answer::read(response).await
}

async fn post_to(app: &Router, path: &str, key: &str, body: &str) -> Answer {
    send(app, request(path, Some(key), body), body).await
}

/// A fresh key, as the header carries it.
fn fresh_key() -> String {
    format!("\"{}\"", uuid::Uuid::new_v4())
}

impl World {
    async fn effects(&self, body: &str) -> i64 {
        self.db
            .count(&self.effects, &format!("message_key = '{body}'"))
            .await
    }

    async fn staged(&self, order: &str) -> i64 {
        // The payload is bytes: compared as bytes.
        let payload = match self.db.backend {
            Backend::Postgres => format!("payload = convert_to('{order}', 'UTF8')"),
            Backend::Sqlite => format!("CAST(payload AS TEXT) = '{order}'"),
            Backend::MySql => format!("payload = '{order}'"),
        };
        let filter = format!("routing_key = 'order.placed' AND {payload}");
        self.db.count(&self.outbox, &filter).await
    }
}

async fn a_request_without_a_usable_key_is_refused_and_runs_nothing(backend: Backend) {
    let world = world(backend).await;
    let payment = unique("p");
    let missing = send(
        &world.payments,
        request("/payments", None, &payment),
        &payment,
    )
    .await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    assert_eq!(missing.problem()["title"], "Idempotency-Key is missing");
    for malformed in ["unquoted", "\"\"", "\"a\";p=1", "\"open"] {
        let answer = post_to(&world.payments, "/payments", malformed, &payment).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{malformed}");
        assert_eq!(
            answer.problem()["title"],
            "Idempotency-Key is malformed",
            "{malformed}"
        );
    }
    let order = unique("o");
    let missing = send(&world.orders, request("/orders", None, &order), &order).await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        world.effects(&payment).await + world.effects(&order).await,
        0
    );
    assert_eq!(world.staged(&order).await, 0);
}

async fn a_retry_gets_the_stored_response_and_runs_nothing(backend: Backend) {
    let world = world(backend).await;
    let (key, payment) = (fresh_key(), unique("p"));
    let first = post_to(&world.payments, "/payments", &key, &payment).await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    assert!(!first.replayed());
    assert!(
        first.headers.contains_key("x-run"),
        "the first response is sent whole"
    );
    let retention = first.headers[RETENTION_HEADER].to_str().unwrap().to_owned();
    assert_eq!(
        retention,
        Idempotency::DEFAULT_RETENTION.as_secs().to_string()
    );
    for _ in 0..3 {
        let again = post_to(&world.payments, "/payments", &key, &payment).await;
        assert_eq!(again.status, StatusCode::CREATED);
        assert!(again.replayed(), "{again:?}");
        assert_eq!(
            again.body, first.body,
            "the same response, not a second run's"
        );
        assert_eq!(again.headers[LOCATION], first.headers[LOCATION]);
        assert_eq!(again.headers[CONTENT_TYPE], "text/plain");
        assert!(
            !again.headers.contains_key("x-run"),
            "only the chosen headers are replayed"
        );
        assert_eq!(again.headers[RETENTION_HEADER].to_str().unwrap(), retention);
    }
    assert_eq!(world.effects(&payment).await, 1);
}

async fn the_same_key_with_another_request_is_refused(backend: Backend) {
    let world = world(backend).await;
    let (key, payment) = (fresh_key(), unique("p"));
    assert_eq!(
        post_to(&world.payments, "/payments", &key, &payment)
            .await
            .status,
        StatusCode::CREATED
    );
    let other = unique("p");
    let reused = post_to(&world.payments, "/payments", &key, &other).await;
    assert_eq!(reused.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(reused.problem()["title"], "Idempotency-Key is already used");
    let query = post_to(&world.payments, "/payments?currency=eur", &key, &payment).await;
    assert_eq!(
        query.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "the query is part of the request"
    );
    assert_eq!(world.effects(&other).await, 0);
    assert_eq!(world.effects(&payment).await, 1);
}

async fn a_retry_while_the_first_runs_gets_409_then_the_stored_response(backend: Backend) {
    let world = world(backend).await;
    let (key, payment) = (fresh_key(), unique("p"));
    let started = world.started.notified();
    let first = tokio::spawn({
        let app = world.payments.clone();
        let builder = request("/payments", Some(&key), &payment).header("x-script", "hold");
        let payment = payment.clone();
        async move { send(&app, builder, &payment).await }
    });
    started.await;
    let during = post_to(&world.payments, "/payments", &key, &payment).await;
    assert_eq!(during.status, StatusCode::CONFLICT, "{during:?}");
    let retry_after: u64 = during.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&retry_after), "{during:?}");
    assert_eq!(
        during.problem()["title"],
        "A request is outstanding for this Idempotency-Key"
    );
    world.release.notify_one();
    let first = first.await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED);
    let after = post_to(&world.payments, "/payments", &key, &payment).await;
    assert!(after.replayed());
    assert_eq!(after.body, first.body);
    assert_eq!(world.effects(&payment).await, 1);

    // The transactional endpoint: a retry waits at most the claim wait (500 ms here) on the
    // servers; SQLite writes one transaction at a time, so there it waits for the first and
    // gets its response.
    let (key, order) = (fresh_key(), unique("o"));
    let slow = tokio::spawn({
        let app = world.orders.clone();
        let builder = request("/orders", Some(&key), &order).header("x-script", "slow");
        let order = order.clone();
        async move { send(&app, builder, &order).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let during = post_to(&world.orders, "/orders", &key, &order).await;
    if backend == Backend::Sqlite {
        assert_eq!(
            (during.status, during.replayed()),
            (StatusCode::CREATED, true)
        );
    } else {
        assert_eq!(during.status, StatusCode::CONFLICT, "{during:?}");
    }
    assert_eq!(slow.await.unwrap().status, StatusCode::CREATED);
    assert!(
        post_to(&world.orders, "/orders", &key, &order)
            .await
            .replayed()
    );
    assert_eq!(
        (world.effects(&order).await, world.staged(&order).await),
        (1, 1)
    );
}

async fn keys_are_scoped_per_route_and_principal(backend: Backend) {
    let world = world(backend).await;
    let (key, payment) = (fresh_key(), unique("p"));
    let by = |user: &str| request("/payments", Some(&key), &payment).header("x-user", user);
    let ada = send(&world.payments, by("ada"), &payment).await;
    let bob = send(&world.payments, by("bob"), &payment).await;
    let refund = post_to(&world.payments, "/refunds", &key, &payment).await;
    for answer in [&ada, &bob, &refund] {
        assert_eq!(answer.status, StatusCode::CREATED);
        assert!(!answer.replayed(), "another scope's key is another request");
    }
    assert!(send(&world.payments, by("ada"), &payment).await.replayed());
    assert_eq!(world.effects(&payment).await, 3);
}

async fn thirty_two_concurrent_retries_have_one_effect(backend: Backend) {
    let world = world(backend).await;
    let (key, payment) = (fresh_key(), unique("p"));
    let (key_o, order) = (fresh_key(), unique("o"));
    let mut requests = Vec::new();
    for _ in 0..32 {
        let (app, key, payment) = (world.payments.clone(), key.clone(), payment.clone());
        requests.push(tokio::spawn(async move {
            post_to(&app, "/payments", &key, &payment).await
        }));
        let (app, key, order) = (world.orders.clone(), key_o.clone(), order.clone());
        requests.push(tokio::spawn(async move {
            post_to(&app, "/orders", &key, &order).await
        }));
    }
    let (mut ran, mut replayed, mut conflicts) = (0, 0, 0);
    for request in requests {
        let answer = request.await.unwrap();
        match answer.status {
            StatusCode::CREATED if answer.replayed() => replayed += 1,
            StatusCode::CREATED => ran += 1,
            StatusCode::CONFLICT => conflicts += 1,
            _ => panic!("unexpected answer {answer:?}"),
        }
    }
    assert_eq!(
        ran, 2,
        "one run per key ({replayed} replayed, {conflicts} conflicts)"
    );
    assert_eq!(ran + replayed + conflicts, 64);
    assert_eq!(world.effects(&payment).await, 1);
    assert_eq!(
        (world.effects(&order).await, world.staged(&order).await),
        (1, 1)
    );
    assert!(
        post_to(&world.orders, "/orders", &key_o, &order)
            .await
            .replayed()
    );
}

async fn a_transactional_endpoint_commits_its_write_response_and_event_together(backend: Backend) {
    let world = world(backend).await;
    let (key, order) = (fresh_key(), unique("o"));
    let first = post_to(&world.orders, "/orders", &key, &order).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(
        first.headers[LOCATION].to_str().unwrap(),
        format!("/orders/{order}")
    );
    let again = post_to(&world.orders, "/orders", &key, &order).await;
    assert!(again.replayed());
    assert_eq!((again.status, &again.body), (first.status, &first.body));
    assert_eq!(
        (world.effects(&order).await, world.staged(&order).await),
        (1, 1)
    );
}

async fn a_failed_or_rejected_request_keeps_nothing_and_the_retry_runs(backend: Backend) {
    let world = world(backend).await;
    let (key, order) = (fresh_key(), unique("o"));
    let with = |script: &str| request("/orders", Some(&key), &order).header("x-script", script);
    let failed = send(&world.orders, with("fail"), &order).await;
    assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(failed.problem()["title"], "The request failed");
    let rejected = send(&world.orders, with("reject"), &order).await;
    assert_eq!(
        (rejected.status, rejected.body.as_str()),
        (StatusCode::BAD_REQUEST, "no stock")
    );
    assert_eq!(
        (world.effects(&order).await, world.staged(&order).await),
        (0, 0),
        "rolled back"
    );
    let placed = post_to(&world.orders, "/orders", &key, &order).await;
    assert_eq!(placed.status, StatusCode::CREATED);
    assert!(!placed.replayed());
    assert_eq!(
        (world.effects(&order).await, world.staged(&order).await),
        (1, 1)
    );

    let (key, payment) = (fresh_key(), unique("p"));
    let invalid = request("/payments", Some(&key), &payment).header("x-script", "invalid");
    assert_eq!(
        send(&world.payments, invalid, &payment).await.status,
        StatusCode::BAD_REQUEST
    );
    let paid = post_to(&world.payments, "/payments", &key, &payment).await;
    assert_eq!((paid.status, paid.replayed()), (StatusCode::CREATED, false));
    assert_eq!(world.effects(&payment).await, 1);
}

async fn a_first_server_error_is_stored_and_replayed(backend: Backend) {
    let world = world(backend).await;
    let (key, payment) = (fresh_key(), unique("p"));
    let failing = request("/payments", Some(&key), &payment).header("x-script", "500");
    let first = send(&world.payments, failing, &payment).await;
    assert_eq!(first.status, StatusCode::INTERNAL_SERVER_ERROR);
    let again = post_to(&world.payments, "/payments", &key, &payment).await;
    assert_eq!(
        (again.status, again.replayed()),
        (StatusCode::INTERNAL_SERVER_ERROR, true)
    );
    assert_eq!(again.body, "the provider failed");
    assert_eq!(world.effects(&payment).await, 1);
}

async fn a_database_lost_mid_request_answers_503_and_the_retry_runs_once(backend: Backend) {
    let (db, proxy) = behind_proxy(backend).await;
    let world = world_on(db).await;
    let (key, order) = (fresh_key(), unique("o"));
    let started = world.started.notified();
    let cut = tokio::spawn({
        let app = world.orders.clone();
        let builder = request("/orders", Some(&key), &order).header("x-script", "cut");
        let order = order.clone();
        async move { send(&app, builder, &order).await }
    });
    started.await;
    proxy.cut().await;
    world.release.notify_one();
    let answer = cut.await.unwrap();
    assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE, "{answer:?}");
    assert!(answer.headers.contains_key("retry-after"));
    proxy.restore();
    let mut retried = None;
    for _ in 0..50 {
        let answer = post_to(&world.orders, "/orders", &key, &order).await;
        if answer.status != StatusCode::SERVICE_UNAVAILABLE {
            retried = Some(answer);
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let retried = retried.expect("the retry succeeds once the database is back");
    assert_eq!(
        (retried.status, retried.replayed()),
        (StatusCode::CREATED, false)
    );
    assert_eq!(
        (world.effects(&order).await, world.staged(&order).await),
        (1, 1)
    );
}

/// A client that hangs up drops the request's future: the request still runs to its end, once,
/// and no pooled connection is lost to a statement cancelled half-way (two connections here, which
/// such a loss would soon use up).
async fn clients_hanging_up_at_any_moment_leave_each_request_once(backend: Backend) {
    let world = world_on(TestDb::connect_with_pool(backend, 2).await).await;
    let mut sent = Vec::new();
    for i in 0..120u64 {
        let (key, body) = (fresh_key(), unique("r"));
        let (app, path) = match i % 2 {
            0 => (&world.orders, "/orders"),
            _ => (&world.payments, "/payments"),
        };
        let hung_up = request(path, Some(&key), &body)
            .body(Body::from(body.clone()))
            .unwrap();
        cancelled_after(
            Duration::from_micros((i * 53) % 4000),
            app.clone().oneshot(hung_up),
        )
        .await;
        sent.push((app, path, key, body));
    }
    for (app, path, key, body) in &sent {
        let mut answer = post_to(app, path, key, body).await;
        for _ in 0..100 {
            if answer.status != StatusCode::CONFLICT {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            answer = post_to(app, path, key, body).await;
        }
        assert_eq!(
            answer.status,
            StatusCode::CREATED,
            "{path} {body}: {answer:?}"
        );
        assert_eq!(world.effects(body).await, 1, "{path} {body}");
        if *path == "/orders" {
            assert_eq!(world.staged(body).await, 1, "{body}");
        }
    }
}

/// A response past the layer's limit (a stream, an export) cannot be kept, but the service ran:
/// a 500 is kept in its place, and a retry gets it rather than running the service again.
async fn a_layered_response_too_large_to_keep_is_kept_as_a_500_and_not_run_again(backend: Backend) {
    let world = world(backend).await;
    let (key, payment) = (fresh_key(), unique("p"));
    let big = || request("/payments", Some(&key), &payment).header("x-script", "big");
    let answer = send(&world.payments, big(), &payment).await;
    assert_eq!(answer.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        answer.problem()["title"],
        "The response is too large to keep"
    );
    let again = send(&world.payments, big(), &payment).await;
    assert_eq!(
        (again.status, again.replayed()),
        (StatusCode::INTERNAL_SERVER_ERROR, true),
        "{again:?}"
    );
    assert_eq!(
        again.problem()["title"],
        "The response is too large to keep"
    );
    assert_eq!(world.effects(&payment).await, 1, "the service ran once");
}

/// A layered service that errs or panics once called may have had its effect: a 500 is kept and
/// replayed, and the retry does not run it again.
async fn a_layered_service_that_fails_once_called_is_not_run_again(backend: Backend) {
    let world = world(backend).await;
    let (key, payment) = (fresh_key(), unique("p"));
    let panicking = || request("/payments", Some(&key), &payment).header("x-script", "panic");
    let first = send(&world.payments, panicking(), &payment).await;
    assert_eq!(first.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        first.problem()["title"],
        "The request began but did not complete"
    );
    let again = post_to(&world.payments, "/payments", &key, &payment).await;
    assert_eq!(
        (again.status, again.replayed()),
        (StatusCode::INTERNAL_SERVER_ERROR, true),
        "{again:?}"
    );
    assert_eq!(world.effects(&payment).await, 1, "the panicked run only");

    // A tower service whose error comes after its write (a timeout around a slow provider).
    let transfers = world.transfers(|keys| keys, |_| Step::Fail).await;
    let (key, transfer) = (fresh_key(), unique("t"));
    for attempt in 0..2 {
        let answer = transfers.send(&key, &transfer).await;
        assert_eq!(answer.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(answer.replayed(), attempt == 1, "{answer:?}");
    }
    assert_eq!(world.effects(&transfer).await, 1, "one transfer");

    // A limit smaller than the guard's own 500: that 500 is kept all the same.
    let transfers = world
        .transfers(|keys| keys.response_limit(64), |_| Step::Big)
        .await;
    let (key, transfer) = (fresh_key(), unique("t"));
    for attempt in 0..2 {
        let answer = transfers.send(&key, &transfer).await;
        assert_eq!(answer.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(answer.replayed(), attempt == 1, "{answer:?}");
        let detail = answer.problem()["detail"].as_str().unwrap().to_owned();
        assert!(detail.contains("answered 200"), "{detail}");
    }
    assert_eq!(world.effects(&transfer).await, 1, "one transfer");

    // A response whose body breaks off after its first chunk: the service ran all the same.
    let transfers = world.transfers(|keys| keys, |_| Step::BrokenOff).await;
    let (key, transfer) = (fresh_key(), unique("t"));
    for attempt in 0..2 {
        let answer = transfers.send(&key, &transfer).await;
        assert_eq!(answer.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(answer.replayed(), attempt == 1, "{answer:?}");
        assert_eq!(
            answer.problem()["title"],
            "The request began but did not complete"
        );
    }
    assert_eq!(world.effects(&transfer).await, 1, "one transfer");
}

/// A layered service whose error says it did not run the request (`NotStored`, a load shedder's)
/// leaves the key free: 503, and the retry runs.
async fn a_layered_service_refusing_with_not_stored_leaves_the_key_free(backend: Backend) {
    let world = world(backend).await;
    let transfers = world
        .transfers(
            |keys| keys,
            |call| match call {
                0 => Step::Refuse,
                _ => Step::Created,
            },
        )
        .await;
    let (key, transfer) = (fresh_key(), unique("t"));
    let refused = transfers.send(&key, &transfer).await;
    assert_eq!(
        refused.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{refused:?}"
    );
    assert!(refused.headers.contains_key("retry-after"));
    assert_eq!(world.effects(&transfer).await, 0);
    let sent = transfers.send(&key, &transfer).await;
    assert_eq!((sent.status, sent.replayed()), (StatusCode::CREATED, false));
    let again = transfers.send(&key, &transfer).await;
    assert_eq!(
        (again.status, again.replayed()),
        (StatusCode::CREATED, true)
    );
    assert_eq!(world.effects(&transfer).await, 1, "one transfer");
}

/// What the bare `/transfers` service does on a call.
#[derive(Clone, Copy)]
enum Step {
    /// Errs with `NotStored` before writing anything.
    Refuse,
    /// Writes the transfer, then errs.
    Fail,
    /// Writes the transfer, then answers 200 with 100 bytes.
    Big,
    /// Writes the transfer, then answers 200 with a body that breaks off after its first chunk.
    BrokenOff,
    /// Writes the transfer, then answers 201.
    Created,
}

/// `/transfers`: a bare tower service (its error a boxed one, not axum's `Infallible`) behind
/// the layer, on an inbox table of its own.
#[derive(Clone)]
struct Transfers(tower::util::BoxCloneService<Request<Body>, Response<Body>, BoxError>);

impl World {
    /// `/transfers` with its keys tuned by `tune`, its n-th call doing `step(n)`.
    async fn transfers(
        &self,
        tune: impl FnOnce(Idempotency) -> Idempotency,
        step: impl Fn(usize) -> Step + Clone + Send + Sync + 'static,
    ) -> Transfers {
        let (db, effects) = (self.db.db.clone(), self.effects.clone());
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let service = tower::service_fn(move |request: Request<Body>| {
            let (db, effects, step) = (db.clone(), effects.clone(), step.clone());
            let call = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async move {
                let step = step(call);
                if let Step::Refuse = step {
                    return Err(BoxError::from(NotStored));
                }
                let body = axum::body::to_bytes(request.into_body(), usize::MAX).await?;
                let transfer = String::from_utf8_lossy(&body).into_owned();
                insert_effect(&db, &effects, "transfer", &transfer, "sent").await?;
                match step {
                    Step::Refuse | Step::Fail => Err("the provider timed out after sending".into()),
                    Step::Big => Ok(Response::new(Body::from("x".repeat(100)))),
                    Step::BrokenOff => Ok(Response::new(Body::from_stream(
                        futures_util::stream::iter([
                            Ok(Bytes::from_static(b"sent")),
                            Err(std::io::Error::other(
                                "the connection to the provider broke",
                            )),
                        ]),
                    ))),
                    Step::Created => Ok((StatusCode::CREATED, "sent").into_response()),
                }
            }
        });
        let inbox = Inbox::builder(self.db.db.clone())
            .table(self.db.table("transfer_keys"))
            .build()
            .await
            .expect("inbox builds");
        let keys = tune(Idempotency::new(inbox, "http.transfers").expect("a valid consumer name"));
        let guarded = tower::Layer::layer(&keys.layer(), service);
        Transfers(tower::util::BoxCloneService::new(guarded))
    }
}

impl Transfers {
    async fn send(&self, key: &str, transfer: &str) -> Answer {
        let request = request("/transfers", Some(key), transfer)
            .body(Body::from(transfer.to_owned()))
            .unwrap();
        let response = self
            .0
            .clone()
            .oneshot(request)
            .await
            .expect("the guard answers the service's errors itself");
        Answer::read(response).await
    }
}

/// A transactional endpoint's response past the limit rolls back with its writes: the key is free
/// and the retry runs.
async fn a_transactional_response_too_large_to_keep_is_rolled_back(backend: Backend) {
    let world = world(backend).await;
    let (key, order) = (fresh_key(), unique("o"));
    let big = request("/orders", Some(&key), &order).header("x-script", "big");
    let answer = send(&world.orders, big, &order).await;
    assert_eq!(answer.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        answer.problem()["title"],
        "The response is too large to keep"
    );
    assert_eq!(
        (world.effects(&order).await, world.staged(&order).await),
        (0, 0),
        "rolled back"
    );
    let placed = post_to(&world.orders, "/orders", &key, &order).await;
    assert_eq!(
        (placed.status, placed.replayed()),
        (StatusCode::CREATED, false)
    );
    assert_eq!(
        (world.effects(&order).await, world.staged(&order).await),
        (1, 1)
    );
}
