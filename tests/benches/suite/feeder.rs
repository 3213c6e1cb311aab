//! Publishing a round's messages.

use std::collections::VecDeque;

use idem_rabbitmq::lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use idem_rabbitmq::lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use idem_tests::bench::Order;
use idem_tests::rabbit::amqp_url;

/// Publishes the rounds' messages straight to the broker (not through the probe): persistent,
/// JSON, message id = order id, confirmed.
pub(crate) struct Feeder {
    pub(crate) _connection: Connection,
    pub(crate) channel: Channel,
}

impl Feeder {
    pub(crate) async fn connect() -> Self {
        let connection = Connection::connect(&amqp_url(), ConnectionProperties::default())
            .await
            .expect("RabbitMQ is reachable");
        let channel = connection.create_channel().await.expect("a channel");
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .expect("confirms");
        Self {
            _connection: connection,
            channel,
        }
    }

    /// Publishes `orders` to `queue`, a thousand confirms in flight at most.
    pub(crate) async fn publish(&self, queue: &str, orders: &[Order]) {
        let mut confirms = VecDeque::with_capacity(1000);
        for order in orders {
            let body = serde_json::to_vec(order).expect("JSON");
            let properties = BasicProperties::default()
                .with_message_id(order.id.as_str().into())
                .with_content_type("application/json".into())
                .with_delivery_mode(2);
            let confirm = self
                .channel
                .basic_publish(
                    "".into(),
                    queue.into(),
                    BasicPublishOptions::default(),
                    &body,
                    properties,
                )
                .await
                .expect("publish");
            confirms.push_back(confirm);
            if confirms.len() >= 1000 {
                let confirmation = confirms.pop_front().expect("a confirm").await;
                assert!(confirmation.expect("a confirm").is_ack(), "publish nacked");
            }
        }
        for confirm in confirms {
            assert!(confirm.await.expect("a confirm").is_ack(), "publish nacked");
        }
    }
}
