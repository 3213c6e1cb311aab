use idem_runtime::idempotent;
use idem_runtime::sea_orm::{DatabaseTransaction, DbErr};

pub struct Ping {
    pub id: String,
}

pub struct Pinger;

impl Pinger {
    #[idempotent(key = ping.id, consumer = "pinger")]
    async fn ping(&self, tx: &DatabaseTransaction, ping: Ping) -> Result<(), DbErr> {
        let _ = (tx, ping);
        Ok(())
    }
}

fn main() {}
