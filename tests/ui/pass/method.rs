//! Methods with `&self` on a service holding its dependencies, in a plain and a generic `impl`.
use std::sync::Arc;
use std::time::Duration;

use idem_runtime::{Context, Handler, Mode, idempotent};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub struct SendMail {
    pub to: String,
    pub subject: String,
}

#[derive(Debug, thiserror::Error)]
#[error("mail server unavailable")]
pub struct MailError;

pub trait Transport: Send + Sync + 'static {
    fn send(&self, to: &str, idempotency_key: &str) -> Result<u32, MailError>;
}

pub struct Smtp;

impl Transport for Smtp {
    fn send(&self, _: &str, _: &str) -> Result<u32, MailError> {
        Ok(250)
    }
}

/// A service with an HTTP-client-like dependency and configuration.
pub struct Mailer {
    pub transport: Smtp,
    pub from: String,
}

impl Mailer {
    #[idempotent(key = mail.to.clone() + "/" + &mail.subject, consumer = "mailer", lease = "45s")]
    pub async fn send(&self, cx: &Context<'_>, mail: SendMail) -> Result<u32, MailError> {
        self.transport.send(&mail.to, cx.message_key().as_str())
    }
}

/// A generic service: the method lives in a generic `impl` block, with the default consumer name.
pub struct Notifier<T> {
    pub transport: T,
}

impl<T: Transport> Notifier<T> {
    #[idempotent(key = mail.subject, consumer = "notifier.notify", mode = two_phase)]
    async fn notify(&self, cx: &Context<'_>, mail: SendMail) -> Result<u32, MailError> {
        self.transport.send(&mail.to, cx.message_key().as_str())
    }
}

fn is_handler<H>(_: &H)
where
    H: Handler<Message = SendMail, Output = u32, Error = MailError> + Send + Sync + 'static,
{
}

fn main() {
    let mailer = Arc::new(Mailer { transport: Smtp, from: "shop@example.com".into() });
    let handler = mailer.send_handler();
    is_handler(&handler);
    assert_eq!(handler.consumer(), "mailer");
    assert_eq!(handler.mode(), Mode::TwoPhase { lease: Duration::from_secs(45) });
    assert_eq!(mailer.from, "shop@example.com");

    let notifier = Arc::new(Notifier { transport: Smtp });
    let handler = notifier.notify_handler();
    is_handler(&handler);
    assert_eq!(handler.consumer(), "notifier.notify");
    assert_eq!(handler.mode(), Mode::two_phase());
    let mail = SendMail { to: "a@b.c".into(), subject: "hi".into() };
    let meta = idem_runtime::Metadata::default();
    assert_eq!(handler.key(&mail, &meta).unwrap().as_str(), "hi");
    // Handlers can be spawned: they are `'static` and hold the service in an `Arc`.
    std::thread::spawn(move || drop(handler)).join().unwrap();
}
