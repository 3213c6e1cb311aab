//! A default consumer name, `<module path>::<function name>`, longer than 128 bytes.

#[derive(serde::Serialize)]
pub struct Order {
    pub id: String,
}

#[derive(Debug, thiserror::Error)]
#[error("failed")]
pub struct Failed;

pub mod a_module_whose_name_is_long_enough_to_matter {
    pub mod and_a_nested_module_whose_name_is_just_as_long {
        use super::super::{Failed, Order};
        use idem_runtime::idempotent;

        #[idempotent(key = order.id)]
        pub async fn ship_the_order_to_the_customer(order: Order) -> Result<(), Failed> {
            let _ = order;
            Ok(())
        }
    }
}

fn main() {}
