use idem_runtime::idempotent;

#[idempotent(key = order)]
const fn charge(order: u64) -> Result<u64, ()> {
    Ok(order)
}

fn main() {}
