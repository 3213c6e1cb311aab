//! Keyed by the transport's message id, named explicitly through `&Metadata`.
use idem_runtime::sea_orm::{DatabaseTransaction, DbErr};
use idem_runtime::{Handler, KeyError, Metadata, idempotent};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub struct AuditEvent {
    pub action: String,
}

#[idempotent(key = meta.message_id(), consumer = "audit")]
async fn audit(tx: &DatabaseTransaction, meta: &Metadata, event: AuditEvent) -> Result<(), DbErr> {
    let _ = (tx, meta, event);
    Ok(())
}

fn main() {
    let handler = audit_handler();
    let event = AuditEvent { action: "login".into() };
    let meta = Metadata { message_id: Some("m-1".into()), ..Metadata::default() };
    assert_eq!(handler.key(&event, &meta).unwrap().as_str(), "m-1");
    assert_eq!(
        handler.key(&event, &Metadata::default()),
        Err(KeyError::Missing("key"))
    );
}
