use idem_runtime::idempotent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub struct AuditEvent {
    pub action: String,
}

#[derive(Debug, thiserror::Error)]
#[error("failed")]
pub struct Failed;

#[idempotent(key = meta.message_id())]
async fn audit(event: AuditEvent) -> Result<(), Failed> {
    let _ = event;
    Ok(())
}

fn main() {
    let _ = audit_handler();
}
