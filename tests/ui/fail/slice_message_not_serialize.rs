use idem_runtime::idempotent;
use idem_runtime::sea_orm::{DatabaseTransaction, DbErr};

#[derive(Clone)]
pub struct Ping {
    pub id: String,
}

#[idempotent(key = ping.id, consumer = "pinger", slice)]
async fn ping_all(tx: &DatabaseTransaction, pings: Vec<Ping>) -> Result<Vec<()>, DbErr> {
    let _ = (tx, pings);
    Ok(vec![])
}

fn main() {}
