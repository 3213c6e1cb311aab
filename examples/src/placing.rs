//! The orders service over HTTP: `POST /orders` places an order once per `Idempotency-Key` and
//! client, writing it and staging its `OrderPlaced` event in one transaction with the key's
//! record (idem-http's transactional endpoint); the outbox relay publishes the event to billing.
//!
//! Its answers besides the guard's: 201 with the order; 401 without a bearer token (the
//! stand-in for authentication, not stored); 400 for a body that is not an order; 422 for an
//! invalid field (`field` names it) or an order id another order took. Problems are
//! `application/problem+json`, their type `urn:idem-examples:orders:<kind>`.

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE, LOCATION, WWW_AUTHENTICATE};
use axum::http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use axum::routing::{get, post_service};
use idem_http::{Endpoint, EndpointError, Idempotency, Principal};
use idem_runtime::sea_orm::sea_query::{Expr, ExprTrait, Query};
use idem_runtime::sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, DbErr, SqlErr};
use idem_runtime::{Context, Inbox, OutboxMessage};

use crate::orders::{OrderPlaced, ROUTING_KEY};

/// The table orders are placed in, keyed by the order's id.
pub const TABLE: &str = "placed_orders";

/// The orders service's database unless told otherwise: the embedded SQLite file `orders.db`.
pub const DEFAULT_DATABASE_URL: &str = "sqlite://orders.db?mode=rwc";

/// The consumer name the service's keys are kept under.
pub const CONSUMER: &str = "http.orders";

/// Places orders: `POST /orders` with an [`OrderPlaced`] as JSON.
#[derive(Debug, Clone)]
pub struct PlaceOrder {
    /// Where `OrderPlaced` events go.
    pub exchange: String,
}

impl Endpoint for PlaceOrder {
    async fn handle(
        &self,
        cx: &Context<'_>,
        request: Request<Bytes>,
    ) -> Result<Response<Bytes>, EndpointError> {
        if client(request.headers()).is_none() {
            // Answered, not stored: the guard keeps no 401, and the key stays free for the
            // client's retry with its credentials.
            let mut response = problem(
                StatusCode::UNAUTHORIZED,
                "unauthenticated",
                "The request has no credentials",
                "send `Authorization: Bearer <token>`",
                None,
            );
            let challenge = HeaderValue::from_static("Bearer");
            response.headers_mut().insert(WWW_AUTHENTICATE, challenge);
            return Ok(response);
        }
        let order: OrderPlaced = match serde_json::from_slice(request.body()) {
            Ok(order) => order,
            Err(error) => {
                let detail = format!("not an order: {error}");
                let response = problem(
                    StatusCode::BAD_REQUEST,
                    "not-an-order",
                    "The body is not an order",
                    &detail,
                    None,
                );
                return Err(EndpointError::Rejected(response));
            }
        };
        if let Some((field, detail)) = invalid_field(&order) {
            let response = problem(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid-field",
                "The order is refused",
                detail,
                Some(field),
            );
            return Err(EndpointError::Rejected(response));
        }
        let tx = cx
            .transaction()
            .expect("a transactional endpoint runs in a transaction");
        let insert = Query::insert()
            .into_table(TABLE)
            .columns(["order_id", "customer", "amount_cents"])
            .values_panic([
                order.order_id.clone().into(),
                order.customer.clone().into(),
                order.amount_cents.into(),
            ])
            .to_owned();
        if let Err(error) = tx.execute(&insert).await {
            return Err(match error.sql_err() {
                // Placed before under another key: this request places nothing. Not 409, which
                // the draft keeps for a request in progress that the client should retry.
                Some(SqlErr::UniqueConstraintViolation(_)) => EndpointError::Rejected(problem(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "order-id-taken",
                    "The order id is taken",
                    "another order has this id: place this one under an id of its own",
                    Some("order_id"),
                )),
                _ => error.into(),
            });
        }
        // Its id derives from the request's key: a run after a crash stages the same id.
        let event = OutboxMessage::json(self.exchange.as_str(), ROUTING_KEY, &order)
            .map_err(|error| EndpointError::Failed(Box::new(error)))?;
        cx.stage(event).await?;
        let body =
            serde_json::to_vec(&order).map_err(|error| EndpointError::Failed(Box::new(error)))?;
        let response = Response::builder()
            .status(StatusCode::CREATED)
            .header(CONTENT_TYPE, "application/json")
            .header(LOCATION, format!("/orders/{}", order.order_id))
            .body(Bytes::from(body))
            .map_err(|error| EndpointError::Failed(Box::new(error)))?;
        Ok(response)
    }
}

/// The client a request is from: the stand-in for a real service's authentication takes any
/// bearer token of 1 to 64 letters, digits, `-`, `_` or `.` as a client's (a real service
/// verifies it). `None` without one.
pub fn client(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(AUTHORIZATION)?.to_str().ok()?;
    let token = value.strip_prefix("Bearer ")?;
    is_name(token).then_some(token)
}

/// The first field of `order` that the service refuses, and why.
fn invalid_field(order: &OrderPlaced) -> Option<(&'static str, &'static str)> {
    if !is_name(&order.order_id) {
        return Some((
            "order_id",
            "an order id is 1 to 64 letters, digits, '-', '_' or '.'",
        ));
    }
    let customer = order.customer.chars().count();
    if !(1..=MAX_CUSTOMER_LEN).contains(&customer) {
        return Some(("customer", "a customer is 1 to 255 characters"));
    }
    if order.amount_cents <= 0 {
        return Some(("amount_cents", "an amount is a positive number of cents"));
    }
    None
}

/// The longest customer kept, in characters: the column's size.
pub const MAX_CUSTOMER_LEN: usize = 255;

/// A problem (RFC 9457) of the orders service: `kind` names its type (`urn:idem-examples:
/// orders:<kind>`, each described in the README), `field` the request's field at fault.
fn problem(
    status: StatusCode,
    kind: &str,
    title: &str,
    detail: &str,
    field: Option<&str>,
) -> Response<Bytes> {
    let mut body = serde_json::json!({
        "type": format!("urn:idem-examples:orders:{kind}"),
        "title": title,
        "status": status.as_u16(),
        "detail": detail,
    });
    if let Some(field) = field {
        body["field"] = field.into();
    }
    Response::builder()
        .status(status)
        .header(CONTENT_TYPE, "application/problem+json")
        .body(Bytes::from(body.to_string()))
        .expect("a valid response")
}

/// Whether `name` is 1 to 64 letters, digits, `-`, `_` or `.`, so that it goes into a URL or a
/// header as it is.
fn is_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
}

/// The service's routes on `inbox` (which stages into its outbox): `POST /orders`, and
/// `GET /orders/{id}` for the order a 201's `Location` names.
///
/// # Errors
///
/// None in practice: the consumer name and the settings are valid.
pub fn router(inbox: Inbox, exchange: &str) -> Result<Router, idem_runtime::Error> {
    let db = inbox.connection().clone();
    // Each client's keys apart, told by its credentials.
    let keys = Idempotency::builder(inbox, CONSUMER, Principal::authorization()).build()?;
    let place = PlaceOrder {
        exchange: exchange.to_owned(),
    };
    Ok(Router::new()
        .route("/orders", post_service(keys.transactional(place)))
        .route("/orders/{id}", get(show))
        .with_state(db))
}

/// `GET /orders/{id}`: the order as JSON, or 404.
async fn show(State(db): State<DatabaseConnection>, Path(id): Path<String>) -> Response<Body> {
    let select = Query::select()
        .columns(["order_id", "customer", "amount_cents"])
        .from(TABLE)
        .and_where(Expr::col("order_id").eq(id))
        .to_owned();
    let found = match db.query_one(&select).await {
        Ok(row) => row,
        Err(error) => {
            tracing::warn!(%error, "reading an order");
            return plain(
                StatusCode::SERVICE_UNAVAILABLE,
                "the database is unavailable",
            );
        }
    };
    let order = found.and_then(|row| {
        Some(OrderPlaced {
            order_id: row.try_get("", "order_id").ok()?,
            customer: row.try_get("", "customer").ok()?,
            amount_cents: row.try_get("", "amount_cents").ok()?,
        })
    });
    match order.map(|order| serde_json::to_vec(&order)) {
        Some(Ok(json)) => Response::builder()
            .header(CONTENT_TYPE, "application/json")
            .body(Body::from(json))
            .expect("a valid response"),
        _ => plain(StatusCode::NOT_FOUND, "no such order"),
    }
}

fn plain(status: StatusCode, text: &'static str) -> Response<Body> {
    let mut response = Response::new(Body::from(text));
    *response.status_mut() = status;
    response
}

/// Creates the orders table if it is missing.
///
/// # Errors
///
/// The database refused the statement.
pub async fn create_table(db: &DatabaseConnection) -> Result<(), DbErr> {
    let key = match db.get_database_backend() {
        DbBackend::MySql => "VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin",
        _ => "VARCHAR(255)",
    };
    db.execute_unprepared(&format!(
        "CREATE TABLE IF NOT EXISTS {TABLE} (order_id {key} NOT NULL PRIMARY KEY, \
         customer VARCHAR(255) NOT NULL, amount_cents BIGINT NOT NULL)"
    ))
    .await
    .map(drop)
}
