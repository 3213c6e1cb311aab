//! What counts as a message's effect: rows in the database, or a count the test keeps itself
//! (calls an in-memory payment provider received).

use std::fmt;

use idem_runtime::sea_orm::sea_query::SelectStatement;
use idem_runtime::sea_orm::sea_query::{Alias, Asterisk, Expr, ExprTrait, Func, Query};
use idem_runtime::sea_orm::{ConnectionTrait, DatabaseConnection, DbErr, Value};

/// How to count the effects of one message: each message must have exactly one once the run
/// has drained.
///
/// ```
/// use idem_runtime::sea_orm::sea_query::{Asterisk, Expr, ExprTrait, Func, Query};
/// use idem_testkit::Effects;
///
/// struct Order { id: String }
///
/// // The rows of `invoices` whose `order_id` is the order's.
/// let invoices = Effects::rows("invoices", "order_id", |order: &Order| order.id.clone());
///
/// // Any query whose first column is the count.
/// let shipped = Effects::query(|order: &Order| {
///     Query::select()
///         .expr(Func::count(Expr::col(Asterisk)))
///         .from("shipments")
///         .and_where(Expr::col("order_id").eq(order.id.clone()))
///         .and_where(Expr::col("state").ne("cancelled"))
///         .to_owned()
/// });
///
/// // A count kept outside the database: calls a stub of a payment provider received.
/// let charges = Effects::counted(|order: &Order| if order.id.is_empty() { 0 } else { 1 });
/// ```
pub struct Effects<M> {
    counter: Counter<M>,
}

type Select<M> = Box<dyn Fn(&M) -> SelectStatement>;

enum Counter<M> {
    /// A query whose first column is the count.
    Query(Select<M>),
    /// A count the test keeps.
    Counted(Box<dyn Fn(&M) -> u64>),
}

impl<M> Effects<M> {
    /// The rows of `table` whose `column` equals what `value` gives for the message (an order
    /// id, say): `SELECT COUNT(*) FROM table WHERE column = value`.
    pub fn rows<V>(
        table: impl Into<String>,
        column: impl Into<String>,
        value: impl Fn(&M) -> V + 'static,
    ) -> Self
    where
        V: Into<Value>,
    {
        let (table, column) = (table.into(), column.into());
        Self::query(move |message| {
            Query::select()
                .expr(Func::count(Expr::col(Asterisk)))
                .from(Alias::new(table.as_str()))
                .and_where(Expr::col(Alias::new(column.as_str())).eq(value(message)))
                .to_owned()
        })
    }

    /// The count the query `select` gives for the message returns in its first column (an
    /// integer), on the run's database.
    pub fn query(select: impl Fn(&M) -> SelectStatement + 'static) -> Self {
        Self {
            counter: Counter::Query(Box::new(select)),
        }
    }

    /// The count `count` returns for the message: for effects outside the database, which the
    /// test counts itself (an in-memory stub of an external service).
    pub fn counted(count: impl Fn(&M) -> u64 + 'static) -> Self {
        Self {
            counter: Counter::Counted(Box::new(count)),
        }
    }

    /// The effects of `message` on `db`.
    pub(crate) async fn count(&self, db: &DatabaseConnection, message: &M) -> Result<u64, DbErr> {
        match &self.counter {
            Counter::Counted(count) => Ok(count(message)),
            Counter::Query(select) => {
                let row = db.query_one(&select(message)).await?;
                let count = match row {
                    Some(row) => row.try_get_by_index::<i64>(0)?,
                    None => 0,
                };
                Ok(u64::try_from(count).unwrap_or(0))
            }
        }
    }
}

impl<M> fmt::Debug for Effects<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.counter {
            Counter::Query(_) => "query",
            Counter::Counted(_) => "counted",
        };
        f.debug_struct("Effects").field("counter", &kind).finish()
    }
}
