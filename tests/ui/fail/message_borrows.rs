use std::borrow::Cow;

use idem_runtime::{Inbox, Metadata, idempotent};

#[derive(Debug, thiserror::Error)]
#[error("failed")]
pub struct Failed;

#[idempotent(key = note)]
async fn post(note: Cow<'_, str>) -> Result<(), Failed> {
    let _ = note;
    Ok(())
}

pub async fn run(inbox: &Inbox) {
    // No second error here: a stand-in `post_handler()` stands for the handler.
    let _ = inbox.process(&post_handler(), Cow::Borrowed("note"), &Metadata::default()).await;
}

fn main() {}
