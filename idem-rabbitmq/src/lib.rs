//! RabbitMQ consumer and publisher for idem.
