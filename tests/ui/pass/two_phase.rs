//! Two-phase handlers: by default without a transaction, or asked for, with lease and retention.
use std::time::Duration;

use idem_runtime::{Context, Handler, Mode, idempotent};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub struct Webhook {
    pub id: u64,
    pub url: String,
}

#[derive(Debug, thiserror::Error)]
#[error("endpoint unavailable")]
pub struct WebhookError;

/// No transaction parameter: two-phase by default, with the default lease.
#[idempotent(key = hook.id)]
async fn deliver(hook: Webhook) -> Result<(), WebhookError> {
    let _ = hook.url;
    Ok(())
}

/// Asked for, with the context to pass the key downstream and see takeovers.
#[idempotent(key = hook.id, mode = two_phase, lease = "500ms", retention = "2h")]
async fn deliver_again(cx: &Context<'_>, hook: Webhook) -> Result<String, WebhookError> {
    if cx.is_takeover() {
        // Reconcile with the endpoint before calling it again.
    }
    Ok(format!("{} {}", hook.url, cx.message_key()))
}

fn main() {
    let handler = deliver_handler();
    assert_eq!(handler.mode(), Mode::two_phase());
    assert_eq!(handler.retention(), None);
    let handler = deliver_again_handler();
    assert_eq!(handler.mode(), Mode::TwoPhase { lease: Duration::from_millis(500) });
    assert_eq!(handler.retention(), Some(Duration::from_secs(7200)));
    let meta = idem_runtime::Metadata::default();
    let hook = Webhook { id: 42, url: "https://example.com".into() };
    assert_eq!(handler.key(&hook, &meta).unwrap().as_str(), "42");
}
