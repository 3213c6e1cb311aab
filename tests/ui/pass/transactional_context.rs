//! `mode = transactional` without a transaction parameter: the handler reaches the transaction
//! through its context.
use idem_runtime::sea_orm::{ConnectionTrait, DbErr};
use idem_runtime::{Context, Handler, Mode, idempotent};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub struct Tick {
    pub n: u64,
}

#[idempotent(key = tick.n, consumer = "ticks", mode = transactional)]
async fn tick(cx: &Context<'_>, tick: Tick) -> Result<u64, DbErr> {
    if let Some(tx) = cx.transaction() {
        tx.execute_unprepared("SELECT 1").await?;
    }
    Ok(tick.n)
}

fn main() {
    assert_eq!(tick_handler().mode(), Mode::Transactional);
}
