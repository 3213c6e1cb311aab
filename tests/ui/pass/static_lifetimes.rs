//! `'static` borrows are owned data: `Cow<'static, str>` in the message and the output.
use std::borrow::Cow;

use idem_runtime::{Handler, Metadata, idempotent};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub struct Notice {
    pub id: Cow<'static, str>,
    pub text: Cow<'static, str>,
}

#[derive(Debug, thiserror::Error)]
#[error("failed")]
pub struct Failed;

#[idempotent(key = notice.id, consumer = "notices")]
async fn post(notice: Notice) -> Result<Cow<'static, str>, Failed> {
    Ok(notice.text)
}

#[idempotent(key = notice.0, consumer = "static-messages")]
async fn post_static(notice: (Cow<'static, str>, &'static str)) -> Result<Cow<'static, str>, Failed> {
    Ok(Cow::Borrowed(notice.1))
}

fn main() {
    let notice = Notice { id: Cow::Borrowed("n-1"), text: Cow::Borrowed("hello") };
    let meta = Metadata::default();
    assert_eq!(post_handler().key(&notice, &meta).unwrap().as_str(), "n-1");
    let static_notice = (Cow::Borrowed("n-2"), "text");
    assert_eq!(post_static_handler().key(&static_notice, &meta).unwrap().as_str(), "n-2");
}
