//! The orders service over HTTP: `POST /orders` places an order once per `Idempotency-Key`,
//! writing it and staging its `OrderPlaced` event in one transaction with the key's record
//! (idem-http's transactional endpoint); the outbox relay publishes the event to billing.

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::header::{CONTENT_TYPE, LOCATION};
use axum::http::{Request, Response, StatusCode};
use axum::routing::{get, post_service};
use idem_http::{Endpoint, EndpointError, Idempotency};
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
        let order: OrderPlaced = match serde_json::from_slice(request.body()) {
            Ok(order) => order,
            Err(error) => {
                return Err(rejected(
                    StatusCode::BAD_REQUEST,
                    &format!("not an order: {error}"),
                ));
            }
        };
        if !is_order_id(&order.order_id) || order.amount_cents <= 0 {
            let detail = "an order needs an id (1 to 64 letters, digits, '-', '_' or '.') and a \
                          positive amount";
            return Err(rejected(StatusCode::UNPROCESSABLE_ENTITY, detail));
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
                // Placed before under another key: this request places nothing.
                Some(SqlErr::UniqueConstraintViolation(_)) => rejected(
                    StatusCode::CONFLICT,
                    "this order id is taken by another order",
                ),
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

/// A response sent as it is and not kept: the key stays free for a corrected request.
fn rejected(status: StatusCode, detail: &str) -> EndpointError {
    let body = serde_json::json!({ "title": "The order is refused", "status": status.as_u16(), "detail": detail });
    let response = Response::builder()
        .status(status)
        .header(CONTENT_TYPE, "application/problem+json")
        .body(Bytes::from(body.to_string()))
        .expect("a valid response");
    EndpointError::Rejected(response)
}

/// Whether `id` is an order id: 1 to 64 letters, digits, `-`, `_` or `.`, so that it goes into
/// a URL as it is.
fn is_order_id(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
}

/// The service's routes on `inbox` (which stages into its outbox): `POST /orders`, and
/// `GET /orders/{id}` for the order a 201's `Location` names.
///
/// # Errors
///
/// None in practice: the consumer name is valid.
pub fn router(inbox: Inbox, exchange: &str) -> Result<Router, idem_runtime::KeyError> {
    let db = inbox.connection().clone();
    let keys = Idempotency::new(inbox, CONSUMER)?;
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
