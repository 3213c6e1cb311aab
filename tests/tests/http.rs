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
    BodyComparison, Endpoint, EndpointError, Idempotency, IdempotencyBuilder, NotStored, Principal,
    REPLAYED_HEADER, RETENTION_HEADER,
};
use idem_runtime::outbox::Outbox;
use idem_runtime::{Context, Inbox, OutboxMessage};
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
    keys_are_scoped_per_principal,
    thirty_two_concurrent_retries_have_one_effect,
    a_transactional_endpoint_commits_its_write_response_and_event_together,
    a_failed_or_rejected_request_keeps_nothing_and_the_retry_runs,
    a_first_server_error_is_stored_and_replayed,
    clients_hanging_up_at_any_moment_leave_each_request_once,
    a_layered_response_too_large_to_keep_is_kept_as_a_500_and_not_run_again,
    a_layered_service_that_fails_once_called_is_not_run_again,
    a_layered_service_refusing_with_not_stored_leaves_the_key_free,
    a_transactional_response_too_large_to_keep_is_rolled_back,
    a_refusal_before_the_work_is_not_stored_and_the_key_stays_free,
    an_anonymous_request_never_gets_an_authenticated_response,
    the_same_key_on_another_method_or_path_is_refused,
    paths_are_compared_whole_and_normalised,
    a_header_that_is_not_utf8_is_replayed,
    keys_with_parameters_and_json_spelled_otherwise_are_the_same_request,
    clients_hanging_up_stay_within_a_concurrency_limit_in_front,
);

/// Faults of the database servers'.
mod servers {
    use super::*;
    on_each_backend!([postgres, mysql]:
        a_database_lost_mid_request_answers_503_and_the_retry_runs_once,
        retries_of_a_key_in_flight_get_409_at_once_and_hold_no_connection,
    );
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
/// release; `invalid` answers 400 without storing; `unauthorized`, `unsupported` and `limited`
/// answer 401, 415 and 429 before writing; `500` writes and answers 500; `big` writes and
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
    // Checks made before the work: authentication, content type, rate limit.
    for (refusal, status) in [
        ("unauthorized", StatusCode::UNAUTHORIZED),
        ("unsupported", StatusCode::UNSUPPORTED_MEDIA_TYPE),
        ("limited", StatusCode::TOO_MANY_REQUESTS),
    ] {
        if script == Some(refusal) {
            return (status, refusal).into_response();
        }
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

/// The principal a test's request names in `x-user`.
fn x_user() -> Principal {
    Principal::from_request(|parts| {
        let user = parts.headers.get("x-user")?;
        Some(user.to_str().ok()?.to_owned())
    })
}

/// Keys in `inbox` under `consumer`, scoped per `principal`, the other settings as tuned.
fn keys_in(
    inbox: Inbox,
    consumer: &str,
    principal: Principal,
    tune: impl FnOnce(IdempotencyBuilder) -> IdempotencyBuilder,
) -> Idempotency {
    tune(Idempotency::builder(inbox, consumer, principal))
        .build()
        .expect("valid settings")
}

/// The layered routes, keys scoped per principal by `x-user`.
fn layered(keys: Idempotency, shop: Shop) -> Router {
    Router::new()
        .route("/payments", post(pay).put(pay))
        .route("/refunds", post(pay))
        .route_layer(keys.layer())
        .with_state(shop)
}

/// `POST /orders`, transactional: writes the order as an effect row, stages `order.placed`,
/// answers 201. `x-script: fail` fails after both, `reject` rejects after both, `slow` takes
/// 1.5 s after both, `unauthorized` answers 401 after both, `cut` waits for the test's release after both, `big` answers more than the
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
            Some("unauthorized") => {
                let response = Response::builder().status(StatusCode::UNAUTHORIZED);
                return Ok(response.body(Bytes::from("token expired")).unwrap());
            }
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
    inbox_table: String,
    outbox_table: String,
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
    let pool = db.db.clone();
    world_on_pool(db, pool, Duration::from_millis(500)).await
}

/// A world whose routes use `pool` (on `db`'s database), their inbox claims waiting at most
/// `claim_wait`.
async fn world_on_pool(db: TestDb, pool: DatabaseConnection, claim_wait: Duration) -> World {
    let outbox_table = db.table("outbox");
    let inbox_table = db.table("inbox");
    let inbox = inbox_on(&pool, (&inbox_table, &outbox_table), claim_wait, true).await;
    let effects = db.effects_table().await;
    let (started, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let shop = Shop {
        db: db.db.clone(),
        effects: effects.clone(),
        started: Arc::clone(&started),
        release: Arc::clone(&release),
    };
    let keys = |consumer: &str| keys_in(inbox.clone(), consumer, x_user(), |keys| keys);
    let place = PlaceOrder {
        effects: effects.clone(),
        started: Arc::clone(&started),
        release: Arc::clone(&release),
    };
    World {
        inbox_table,
        outbox_table: outbox_table.clone(),
        payments: layered(keys("http.payments"), shop),
        orders: Router::new().route_service("/orders", keys("http.orders").transactional(place)),
        db,
        effects,
        outbox: outbox_table,
        started,
        release,
    }
}

/// An inbox on `table` with an outbox on `outbox`, through `pool`; the tables are made if
/// `create` says so (PostgreSQL makes it wait for the transactions writing to them).
async fn inbox_on(
    pool: &DatabaseConnection,
    (table, outbox): (&str, &str),
    claim_wait: Duration,
    create: bool,
) -> Inbox {
    let outbox = Outbox::builder(pool.clone())
        .table(outbox)
        .create_table(create)
        .build()
        .await
        .expect("outbox builds");
    Inbox::builder(pool.clone())
        .table(table)
        .outbox(outbox)
        .claim_wait(claim_wait)
        .create_table(create)
        .build()
        .await
        .expect("inbox builds")
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
    for malformed in ["unquoted", "\"\"", "\"a\";P=1", "\"open"] {
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

    // The transactional endpoint: a retry gets 409 at once, without waiting for the first's
    // lock (on SQLite, for the write lock).
    let (key, order) = (fresh_key(), unique("o"));
    let slow = tokio::spawn({
        let app = world.orders.clone();
        let builder = request("/orders", Some(&key), &order).header("x-script", "slow");
        let order = order.clone();
        async move { send(&app, builder, &order).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let during = post_to(&world.orders, "/orders", &key, &order).await;
    assert_eq!(during.status, StatusCode::CONFLICT, "{during:?}");
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

async fn keys_are_scoped_per_principal(backend: Backend) {
    let world = world(backend).await;
    let (key, payment) = (fresh_key(), unique("p"));
    let by = |user: &str| request("/payments", Some(&key), &payment).header("x-user", user);
    let ada = send(&world.payments, by("ada"), &payment).await;
    let bob = send(&world.payments, by("bob"), &payment).await;
    let anonymous = post_to(&world.payments, "/payments", &key, &payment).await;
    for answer in [&ada, &bob, &anonymous] {
        assert_eq!(answer.status, StatusCode::CREATED);
        assert!(
            !answer.replayed(),
            "another principal's key is another request"
        );
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
        tune: impl FnOnce(IdempotencyBuilder) -> IdempotencyBuilder,
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
        let keys = keys_in(inbox, "http.transfers", Principal::authorization(), tune);
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

/// A 401, 415 or 429 answers a check made before the work (an expired token, a wrong content
/// type, a rate limit): nothing is stored, and the corrected retry with the same key runs.
async fn a_refusal_before_the_work_is_not_stored_and_the_key_stays_free(backend: Backend) {
    let world = world(backend).await;
    for (refusal, status) in [
        ("unauthorized", StatusCode::UNAUTHORIZED),
        ("unsupported", StatusCode::UNSUPPORTED_MEDIA_TYPE),
        ("limited", StatusCode::TOO_MANY_REQUESTS),
    ] {
        let (key, payment) = (fresh_key(), unique("p"));
        let refused = request("/payments", Some(&key), &payment).header("x-script", refusal);
        assert_eq!(
            send(&world.payments, refused, &payment).await.status,
            status
        );
        let paid = post_to(&world.payments, "/payments", &key, &payment).await;
        assert_eq!(
            (paid.status, paid.replayed()),
            (StatusCode::CREATED, false),
            "{refusal}: {paid:?}"
        );
        assert_eq!(world.effects(&payment).await, 1, "{refusal}");
    }
    let (key, order) = (fresh_key(), unique("o"));
    let expired = request("/orders", Some(&key), &order).header("x-script", "unauthorized");
    let refused = send(&world.orders, expired, &order).await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
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

/// With the guard's defaults, a request without credentials never gets the response of a
/// request that had some, nor one principal another's.
async fn an_anonymous_request_never_gets_an_authenticated_response(backend: Backend) {
    let world = world(backend).await;
    let app = world.open_payments().await;
    let (key, payment) = (fresh_key(), unique("p"));
    let with = |token: Option<&str>| {
        let builder = request("/payments", Some(&key), &payment);
        match token {
            Some(token) => builder.header("authorization", format!("Bearer {token}")),
            None => builder,
        }
    };
    let alice = send(&app, with(Some("alice-token")), &payment).await;
    assert_eq!(alice.status, StatusCode::CREATED);
    for other in [None, Some("bob-token")] {
        let answer = send(&app, with(other), &payment).await;
        assert!(
            !answer.replayed(),
            "{other:?} got alice's response: {answer:?}"
        );
        assert_ne!(answer.body, alice.body, "{other:?}");
    }
    let again = send(&app, with(Some("alice-token")), &payment).await;
    assert!(again.replayed(), "{again:?}");
    assert_eq!(again.body, alice.body);
}

/// The same key sent with another method or to another path is a client's mistake: 422, and
/// nothing runs.
async fn the_same_key_on_another_method_or_path_is_refused(backend: Backend) {
    let world = world(backend).await;
    let (key, payment) = (fresh_key(), unique("p"));
    let first = post_to(&world.payments, "/payments", &key, &payment).await;
    assert_eq!(first.status, StatusCode::CREATED);
    let refund = post_to(&world.payments, "/refunds", &key, &payment).await;
    assert_eq!(
        refund.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{refund:?}"
    );
    assert_eq!(refund.problem()["title"], "Idempotency-Key is already used");
    let put = Request::put("/payments")
        .header("idempotency-key", &key)
        .body(Body::from(payment.clone()))
        .unwrap();
    let put = Answer::read(world.payments.clone().oneshot(put).await.unwrap()).await;
    assert_eq!(put.status, StatusCode::UNPROCESSABLE_ENTITY, "{put:?}");
    assert_eq!(world.effects(&payment).await, 1);
}

/// Another spelling of the same path (a percent-encoded letter, a dot segment) is the same
/// request; the same path under two prefixes of `Router::nest` is not.
async fn paths_are_compared_whole_and_normalised(backend: Backend) {
    let world = world(backend).await;
    let app = world.accounts().await;
    let (key, charge) = (fresh_key(), unique("c"));
    let first = post_to(&app, "/accounts/acct/charges", &key, &charge).await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    for spelling in ["/accounts/%61cct/charges", "/accounts/%61%63ct/./charges"] {
        let again = post_to(&app, spelling, &key, &charge).await;
        assert_eq!(
            (again.status, again.replayed()),
            (StatusCode::CREATED, true),
            "{spelling}: {again:?}"
        );
    }
    assert_eq!(world.effects(&charge).await, 1, "charged once");

    let (key, order) = (fresh_key(), unique("o"));
    let tenants = world.tenants().await;
    let first = post_to(&tenants, "/tenants/one/orders", &key, &order).await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    let other = post_to(&tenants, "/tenants/two/orders", &key, &order).await;
    assert_ne!(other.body, first.body, "another tenant's response");
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY, "{other:?}");
    assert_eq!(world.effects(&order).await, 1);
}

/// A replayed header whose value is not UTF-8 (obs-text, as Latin-1 filenames are) is replayed
/// byte for byte.
async fn a_header_that_is_not_utf8_is_replayed(backend: Backend) {
    let world = world(backend).await;
    let app = world.labelled().await;
    let (key, payment) = (fresh_key(), unique("p"));
    let first = post_to(&app, "/labelled", &key, &payment).await;
    assert_eq!(first.headers["x-label"].as_bytes(), b"caf\xe9");
    let again = post_to(&app, "/labelled", &key, &payment).await;
    assert!(again.replayed());
    assert_eq!(
        again.headers.get("x-label").map(|value| value.as_bytes()),
        Some(&b"caf\xe9"[..]),
        "{again:?}"
    );
}

/// Keys with structured-field parameters are the key without them; a JSON body sent again with
/// other spacing or member order is the same request when the guard compares JSON.
async fn keys_with_parameters_and_json_spelled_otherwise_are_the_same_request(backend: Backend) {
    let world = world(backend).await;
    let (key, payment) = (uuid::Uuid::new_v4().to_string(), unique("p"));
    let plain = format!("\"{key}\"");
    let first = post_to(
        &world.payments,
        "/payments",
        &format!("{plain};v=1"),
        &payment,
    )
    .await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    for spelling in [
        plain.clone(),
        format!("{plain};a;b=?0;c=\"x\";d=1.5;e=:AQ==:;f=tok/en"),
    ] {
        let again = post_to(&world.payments, "/payments", &spelling, &payment).await;
        assert_eq!(
            (again.status, again.replayed()),
            (StatusCode::CREATED, true),
            "{spelling}: {again:?}"
        );
    }
    for malformed in [
        format!("{plain};"),
        format!("{plain} ;a=1"),
        format!("{plain};A=1"),
    ] {
        let answer = post_to(&world.payments, "/payments", &malformed, &payment).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{malformed}");
    }
    assert_eq!(world.effects(&payment).await, 1);

    let app = world.json_payments().await;
    let key = fresh_key();
    let order = unique("j");
    let compact = format!(r#"{{"order":"{order}","amount":5}}"#);
    let spaced = format!("{{ \"amount\": 5,\n  \"order\": \"{order}\" }}");
    let first = send(&app, request("/payments", Some(&key), &order), &compact).await;
    assert_eq!(first.status, StatusCode::CREATED);
    let again = send(&app, request("/payments", Some(&key), &order), &spaced).await;
    assert_eq!(
        (again.status, again.replayed()),
        (StatusCode::CREATED, true),
        "{again:?}"
    );
    let changed = compact.replace("5", "6");
    let other = send(&app, request("/payments", Some(&key), &order), &changed).await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
}

impl World {
    fn shop(&self) -> Shop {
        Shop {
            db: self.db.db.clone(),
            effects: self.effects.clone(),
            started: Arc::clone(&self.started),
            release: Arc::clone(&self.release),
        }
    }

    /// An inbox of the test's on a table of its own.
    async fn inbox(&self, name: &str) -> Inbox {
        Inbox::builder(self.db.db.clone())
            .table(self.db.table(name))
            .build()
            .await
            .expect("inbox builds")
    }

    /// `POST /payments` behind the guard's defaults (no principal named).
    async fn open_payments(&self) -> Router {
        let inbox = self.inbox("open_keys").await;
        let keys = keys_in(inbox, "http.open", Principal::authorization(), |keys| keys);
        Router::new()
            .route("/payments", post(pay))
            .route_layer(keys.layer())
            .with_state(self.shop())
    }

    /// `POST /accounts/{account}/charges`, the guard around the whole router.
    async fn accounts(&self) -> Router {
        let inbox = self.inbox("account_keys").await;
        let keys = keys_in(inbox, "http.accounts", Principal::authorization(), |keys| {
            keys
        });
        Router::new()
            .route("/accounts/{account}/charges", post(pay))
            .layer(keys.layer())
            .with_state(self.shop())
    }

    /// One guarded router nested under `/tenants/one` and `/tenants/two`.
    async fn tenants(&self) -> Router {
        let inbox = self.inbox("tenant_keys").await;
        let keys = keys_in(inbox, "http.tenants", Principal::authorization(), |keys| {
            keys
        });
        let tenant = Router::new()
            .route("/orders", post(pay))
            .route_layer(keys.layer());
        Router::new()
            .nest("/tenants/one", tenant.clone())
            .nest("/tenants/two", tenant)
            .with_state(self.shop())
    }

    /// `POST /labelled`, whose response carries `x-label: caf\xe9`, a replayed header.
    async fn labelled(&self) -> Router {
        let label = axum::http::HeaderName::from_static("x-label");
        let inbox = self.inbox("label_keys").await;
        let keys = keys_in(inbox, "http.labels", Principal::authorization(), |keys| {
            keys.replay_headers([label])
        });
        let label = || async {
            let value = axum::http::HeaderValue::from_bytes(b"caf\xe9").unwrap();
            (StatusCode::CREATED, [("x-label", value)], unique("label")).into_response()
        };
        Router::new()
            .route("/labelled", post(label))
            .route_layer(keys.layer())
    }

    /// `POST /payments` whose bodies are compared as JSON.
    async fn json_payments(&self) -> Router {
        let inbox = self.inbox("json_keys").await;
        let keys = keys_in(inbox, "http.json", Principal::authorization(), |keys| {
            keys.body_comparison(BodyComparison::Json)
        });
        Router::new()
            .route("/payments", post(pay))
            .route_layer(keys.layer())
            .with_state(self.shop())
    }
}

/// Retries of a key whose transactional request is in flight get 409 at once without taking a
/// pooled connection: on a pool of two, one held by the first request, an unrelated request sent
/// with four retries is served. A retry reaching another replica (its own pool and guard, the
/// same table) does not wait for the first's lock either: it gets 409 while the first still runs.
async fn retries_of_a_key_in_flight_get_409_at_once_and_hold_no_connection(backend: Backend) {
    let db = TestDb::connect(backend).await;
    let pool = db.pool_waiting_at_most(2, Duration::from_secs(1)).await;
    // Claims that would wait far longer than the test for the first request's lock.
    let long_wait = Duration::from_secs(60);
    let world = world_on_pool(db, pool, long_wait).await;
    let (key, order) = (fresh_key(), unique("o"));
    let started = world.started.notified();
    let first = tokio::spawn({
        let app = world.orders.clone();
        let builder = request("/orders", Some(&key), &order).header("x-script", "cut");
        let order = order.clone();
        async move { send(&app, builder, &order).await }
    });
    started.await;
    let mut retries = Vec::new();
    for _ in 0..4 {
        let (app, key, order) = (world.orders.clone(), key.clone(), order.clone());
        retries.push(tokio::spawn(async move {
            post_to(&app, "/orders", &key, &order).await
        }));
    }
    let unrelated = unique("o");
    let other = post_to(&world.orders, "/orders", &fresh_key(), &unrelated).await;
    assert_eq!(other.status, StatusCode::CREATED, "{other:?}");
    for retry in retries {
        let retry = retry.await.unwrap();
        assert_eq!(retry.status, StatusCode::CONFLICT, "{retry:?}");
        assert!(retry.headers.contains_key("retry-after"));
    }

    // Another replica: its own pool and guard on the same tables.
    let replica_pool = world.db.another_pool(2).await;
    let tables = (world.inbox_table.as_str(), world.outbox_table.as_str());
    let replica_inbox = inbox_on(&replica_pool, tables, long_wait, false).await;
    let place = PlaceOrder {
        effects: world.effects.clone(),
        started: Arc::new(Notify::new()),
        release: Arc::new(Notify::new()),
    };
    let keys = keys_in(replica_inbox, "http.orders", x_user(), |keys| keys);
    let replica = Router::new().route_service("/orders", keys.transactional(place));
    let mut on_replica = tokio::spawn({
        let (key, order) = (key.clone(), order.clone());
        async move { post_to(&replica, "/orders", &key, &order).await }
    });
    // Bounds how long the first request stays held: a claim that waited for its lock would
    // then find it completed and replay it.
    let answered = tokio::time::timeout(Duration::from_secs(10), &mut on_replica).await;
    world.release.notify_one();
    let on_replica = match answered {
        Ok(answer) => answer.unwrap(),
        Err(_) => on_replica.await.unwrap(),
    };
    assert_eq!(on_replica.status, StatusCode::CONFLICT, "{on_replica:?}");
    assert_eq!(first.await.unwrap().status, StatusCode::CREATED);
    assert_eq!(
        (world.staged(&order).await, world.effects(&unrelated).await),
        (1, 1),
        "the order placed once, the unrelated one too"
    );
}

/// Requests whose clients hang up run on to their end, but within a concurrency limit in front
/// of the guard: six of them, each dropped once its handler began, never run two at a time
/// behind a limit of one; each still runs once.
async fn clients_hanging_up_stay_within_a_concurrency_limit_in_front(backend: Backend) {
    let world = world(backend).await;
    let running = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let most = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Arc::new(Notify::new());
    let work = {
        let (running, most, started) = (running.clone(), most.clone(), started.clone());
        let (db, effects) = (world.db.db.clone(), world.effects.clone());
        move |body: Bytes| {
            let (running, most, started) = (running.clone(), most.clone(), started.clone());
            let (db, effects) = (db.clone(), effects.clone());
            async move {
                use std::sync::atomic::Ordering::SeqCst;
                let now = running.fetch_add(1, SeqCst) + 1;
                most.fetch_max(now, SeqCst);
                started.notify_one();
                tokio::time::sleep(Duration::from_millis(300)).await;
                let body = String::from_utf8_lossy(&body).into_owned();
                insert_effect(&db, &effects, "work", &body, "done")
                    .await
                    .unwrap();
                running.fetch_sub(1, SeqCst);
                StatusCode::CREATED
            }
        }
    };
    let inbox = world.inbox("limited_keys").await;
    let keys = keys_in(inbox, "http.limited", Principal::authorization(), |keys| {
        keys
    });
    let limited = tower::ServiceBuilder::new()
        .concurrency_limit(1)
        .layer(keys.layer());
    // Its handler made a route once, as a server does (a router without state used as a
    // service makes it again for each request, with a limit of its own).
    let app = Router::new()
        .route("/work", post(work))
        .route_layer(limited)
        .with_state(());
    let bodies: Vec<String> = (0..6).map(|_| unique("w")).collect();
    for body in &bodies {
        let began = started.notified();
        let hung_up = request("/work", Some(&fresh_key()), body)
            .body(Body::from(body.clone()))
            .unwrap();
        tokio::select! {
            answered = app.clone().oneshot(hung_up) => panic!("answered before it began: {answered:?}"),
            () = began => {}
        }
    }
    for _ in 0..200 {
        if world.db.count(&world.effects, "consumer = 'work'").await == 6 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for body in &bodies {
        assert_eq!(world.effects(body).await, 1, "{body}");
    }
    assert_eq!(most.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// The work of a request runs in the request's span, whatever task it runs in.
#[tokio::test(flavor = "current_thread")]
async fn a_request_is_handled_in_its_span() {
    use tracing::Instrument;
    use tracing_subscriber::layer::SubscriberExt;
    let scopes = Scopes::default();
    let subscriber = tracing_subscriber::registry().with(scopes.clone());
    let _default = tracing::subscriber::set_default(subscriber);
    let world = world(Backend::Sqlite).await;
    let probe = || async {
        tracing::info!(target: "span_probe", "handling");
        StatusCode::CREATED
    };
    let inbox = world.inbox("span_keys").await;
    let keys = keys_in(inbox, "http.spans", Principal::authorization(), |keys| keys);
    let app = Router::new()
        .route("/probe", post(probe))
        .route_layer(keys.layer());
    let answer = post_to(&app, "/probe", &fresh_key(), "p")
        .instrument(tracing::info_span!("client_request"))
        .await;
    assert_eq!(answer.status, StatusCode::CREATED);
    let seen = scopes.0.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(
        seen[0].iter().any(|name| name == "client_request"),
        "{seen:?}"
    );
}

/// The names of the spans each `span_probe` event was in, the innermost first.
#[derive(Clone, Default)]
struct Scopes(Arc<std::sync::Mutex<Vec<Vec<String>>>>);

impl<S> tracing_subscriber::Layer<S> for Scopes
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn on_event(&self, event: &tracing::Event<'_>, cx: tracing_subscriber::layer::Context<'_, S>) {
        if event.metadata().target() != "span_probe" {
            return;
        }
        let names = cx
            .event_scope(event)
            .map(|scope| scope.map(|span| span.name().to_owned()).collect())
            .unwrap_or_default();
        self.0.lock().unwrap().push(names);
    }
}

/// A retention or lease under a millisecond is refused when the keys are built, naming it,
/// rather than failing every request.
#[tokio::test]
async fn a_zero_retention_or_lease_is_refused_when_built() {
    let db = TestDb::connect(Backend::Sqlite).await;
    let inbox = Inbox::builder(db.db.clone())
        .table(db.table("zero_keys"))
        .build()
        .await
        .expect("inbox builds");
    let builder = || Idempotency::builder(inbox.clone(), "http.zero", Principal::authorization());
    for (built, name) in [
        (builder().retention(Duration::ZERO).build(), "retention"),
        (builder().lease(Duration::from_micros(500)).build(), "lease"),
    ] {
        let error = built.expect_err(name);
        assert!(
            matches!(error, idem_runtime::Error::Config(idem_runtime::ConfigError::Zero(zero)) if zero == name),
            "{error}"
        );
    }
    assert!(
        builder()
            .retention(Duration::from_millis(1))
            .build()
            .is_ok()
    );
}
