//! Keys of every supported kind: `bool`, small integers, `char`, `Uuid`, and composite tuples
//! (components borrowed from the message, escaped and joined with `/`).
use idem_runtime::{Handler, Metadata, idempotent};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

#[derive(Serialize, Deserialize)]
pub struct Event {
    pub tenant: String,
    pub id: String,
    pub uuid: Uuid,
    pub flag: bool,
    pub small: u8,
    pub signed: i8,
    pub short: u16,
    pub shorter: i16,
    pub letter: char,
}

#[derive(Debug, thiserror::Error)]
#[error("failed")]
pub struct Failed;

#[idempotent(key = event.flag, consumer = "bool")]
async fn by_bool(event: Event) -> Result<(), Failed> {
    let _ = event;
    Ok(())
}

#[idempotent(key = (event.small, event.signed, event.short, event.shorter), consumer = "ints")]
async fn by_integers(event: Event) -> Result<(), Failed> {
    let _ = event;
    Ok(())
}

#[idempotent(key = event.letter, consumer = "char")]
async fn by_char(event: Event) -> Result<(), Failed> {
    let _ = event;
    Ok(())
}

#[idempotent(key = event.uuid, consumer = "uuid")]
async fn by_uuid(event: Event) -> Result<(), Failed> {
    let _ = event;
    Ok(())
}

#[idempotent(key = (event.tenant, event.id), consumer = "tenant")]
async fn by_tenant_and_id(event: Event) -> Result<(), Failed> {
    let _ = event;
    Ok(())
}

#[idempotent(key = ((event.tenant, event.id), event.uuid), consumer = "nested")]
async fn nested(event: Event) -> Result<(), Failed> {
    let _ = event;
    Ok(())
}

fn key(handler: impl Handler<Message = Event>, event: &Event) -> String {
    handler.key(event, &Metadata::default()).unwrap().to_string()
}

fn main() {
    let event = Event {
        tenant: "acme/eu".into(),
        id: "o-1".into(),
        uuid: Uuid::nil(),
        flag: true,
        small: 255,
        signed: -128,
        short: 65_535,
        shorter: -32_768,
        letter: 'λ',
    };
    assert_eq!(key(by_bool_handler(), &event), "true");
    assert_eq!(key(by_integers_handler(), &event), "255/-128/65535/-32768");
    assert_eq!(key(by_char_handler(), &event), "λ");
    assert_eq!(key(by_uuid_handler(), &event), "00000000-0000-0000-0000-000000000000");
    assert_eq!(key(by_tenant_and_id_handler(), &event), "acme\\/eu/o-1");
    assert_eq!(
        key(nested_handler(), &event),
        "acme\\\\\\/eu\\/o-1/00000000-0000-0000-0000-000000000000"
    );
    // The message is still whole: the key only borrowed it.
    assert_eq!(event.tenant, "acme/eu");
}
