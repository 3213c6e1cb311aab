//! The RabbitMQ adapter on the real broker: consuming per message and in batches, dead letters,
//! duplicates, outages, nodes, shutdown, TLS, publishing and declared topologies.
//!
//! One test binary per topic area: each file a module, its tests named `file::test`.

mod rabbitmq_batch;
mod rabbitmq_dead_letter;
mod rabbitmq_duplicates;
mod rabbitmq_nodes;
mod rabbitmq_outage;
mod rabbitmq_publisher;
mod rabbitmq_setup;
mod rabbitmq_shutdown;
mod rabbitmq_tls;
