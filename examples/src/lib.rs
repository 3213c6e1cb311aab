//! Runnable idem services.
