//! Key expressions: `format!`, method calls, destructured and `mut` parameters, integers,
//! optional fields; result aliases; the documented default consumer name; `permanent`.
use idem_runtime::sea_orm::{DatabaseTransaction, DbErr};
use idem_runtime::{Handler, Metadata, idempotent};
use serde::{Deserialize, Serialize};

#[derive(Clone, Serialize, Deserialize)]
pub struct Line {
    pub order: String,
    pub line: u32,
    pub note: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum LineError {
    #[error("out of stock")]
    OutOfStock,
    #[error(transparent)]
    Db(#[from] DbErr),
}

impl LineError {
    fn is_permanent(&self) -> bool {
        matches!(self, LineError::OutOfStock)
    }
}

pub type Result<T, E = LineError> = std::result::Result<T, E>;

#[idempotent(key = format!("{}#{}", line.order, line.line), permanent = LineError::is_permanent)]
async fn formatted(tx: &DatabaseTransaction, mut line: Line) -> Result<u32> {
    let _ = tx;
    line.line += 1;
    Ok(line.line)
}

#[idempotent(key = order.to_uppercase(), consumer = "destructured")]
async fn destructured(tx: &DatabaseTransaction, Line { order, .. }: Line) -> Result<String> {
    let _ = tx;
    Ok(order)
}

#[idempotent(key = line.line, consumer = "integer")]
async fn integer(line: Line) -> std::result::Result<(), LineError> {
    let _ = line;
    Ok(())
}

#[idempotent(key = line.note, consumer = "optional")]
async fn optional(line: Line) -> Result<()> {
    let _ = line;
    Ok(())
}

fn main() {
    let line = Line { order: "o-1".into(), line: 2, note: None };
    let meta = Metadata::default();
    let handler = formatted_handler();
    assert_eq!(handler.key(&line, &meta).unwrap().as_str(), "o-1#2");
    assert_eq!(handler.consumer(), concat!(module_path!(), "::formatted"));
    assert!(handler.is_permanent(&LineError::OutOfStock));
    assert!(!handler.is_permanent(&LineError::Db(DbErr::Custom("down".into()))));
    assert_eq!(destructured_handler().key(&line, &meta).unwrap().as_str(), "O-1");
    assert!(!destructured_handler().is_permanent(&LineError::OutOfStock));
    assert_eq!(integer_handler().key(&line, &meta).unwrap().as_str(), "2");
    assert!(optional_handler().key(&line, &meta).is_err());
}
