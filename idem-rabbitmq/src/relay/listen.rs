//! Wake-ups across processes: PostgreSQL `LISTEN` on the outbox's channel, on which every
//! transaction that stages messages notifies when it commits.

use std::sync::Arc;

use idem_runtime::outbox::Outbox;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::settings::RelaySettings;
use crate::error::Result;
use crate::stop::StopSignal;

/// Listens on `outbox`'s channel and wakes the relay through `wake` at every notification, and
/// after every reconnection (notifications sent while it was away are lost). Returns `None`
/// when this crate is built without PostgreSQL.
///
/// # Errors
///
/// The first listening connection cannot be opened.
#[cfg(feature = "postgres")]
pub(super) async fn start(
    outbox: &Outbox,
    wake: &Arc<Notify>,
    settings: &RelaySettings,
    stop: StopSignal,
) -> Result<Option<JoinHandle<()>>> {
    let listener = postgres::Listener::connect(outbox).await?;
    let task = postgres::Task {
        listener: Some(listener),
        outbox: outbox.clone(),
        wake: Arc::clone(wake),
        backoff: settings.backoff,
        stop,
    };
    Ok(Some(tokio::spawn(task.run())))
}

/// Without PostgreSQL support, there is nothing to listen with.
#[cfg(not(feature = "postgres"))]
pub(super) async fn start(
    _outbox: &Outbox,
    _wake: &Arc<Notify>,
    _settings: &RelaySettings,
    _stop: StopSignal,
) -> Result<Option<JoinHandle<()>>> {
    Ok(None)
}

#[cfg(feature = "postgres")]
mod postgres {
    use std::sync::Arc;

    use idem_runtime::outbox::Outbox;
    use idem_runtime::outbox::Relaying;
    use idem_runtime::sea_orm::sqlx::postgres::PgListener;
    use idem_runtime::sea_orm::{DbErr, RuntimeErr};
    use idem_runtime::transport::Backoff;
    use tokio::sync::Notify;

    use crate::error::{Error, Result};
    use crate::stop::StopSignal;

    /// A `LISTEN`ing connection taken from the outbox's pool.
    pub(super) struct Listener(PgListener);

    impl Listener {
        /// Takes a connection of `outbox`'s pool and listens on its channel.
        pub(super) async fn connect(outbox: &Outbox) -> Result<Self> {
            let failed = |source: idem_runtime::sea_orm::sqlx::Error| Error::Database {
                operation: format!("LISTEN on {}", outbox.channel()),
                source: DbErr::Conn(RuntimeErr::SqlxError(Arc::new(source))),
            };
            let pool = outbox.connection().get_postgres_connection_pool();
            let mut listener = PgListener::connect_with(pool).await.map_err(failed)?;
            listener.listen(&outbox.channel()).await.map_err(failed)?;
            Ok(Self(listener))
        }
    }

    /// The listening task: wakes the relay, and reconnects with the back-off after a failure.
    pub(super) struct Task {
        pub(super) listener: Option<Listener>,
        pub(super) outbox: Outbox,
        pub(super) wake: Arc<Notify>,
        pub(super) backoff: Backoff,
        pub(super) stop: StopSignal,
    }

    impl Task {
        /// Listens until the relay stops, reconnecting after each failure.
        pub(super) async fn run(mut self) {
            let mut failures = 0u32;
            let mut current = self.listener.take();
            loop {
                let listener = match current.take() {
                    Some(listener) => listener,
                    None => {
                        let reconnect = Listener::connect(&self.outbox);
                        let Some(reconnected) = self.stop.unless_stopped(reconnect).await else {
                            return;
                        };
                        match reconnected {
                            Ok(listener) => {
                                failures = 0;
                                // Commits while it was away notified nobody.
                                self.wake.notify_one();
                                listener
                            }
                            Err(error) => {
                                failures = failures.saturating_add(1);
                                let delay = self.backoff.after(failures);
                                tracing::warn!(%error, retry_in = ?delay, "outbox relay cannot listen; retrying");
                                if !self.stop.sleep(delay).await {
                                    return;
                                }
                                continue;
                            }
                        }
                    }
                };
                self.listen(listener).await;
                if self.stop.is_set() {
                    return;
                }
            }
        }

        /// Wakes the relay at every notification until the connection fails or the relay
        /// stops.
        async fn listen(&mut self, mut listener: Listener) {
            loop {
                let Some(received) = self.stop.unless_stopped(listener.0.try_recv()).await else {
                    return;
                };
                match received {
                    Ok(Some(_)) => self.wake.notify_one(),
                    // The connection was lost and is back (sqlx reconnected it and listens
                    // again); notifications sent meanwhile are lost.
                    Ok(None) => self.wake.notify_one(),
                    Err(error) => {
                        tracing::warn!(%error, "outbox relay stopped listening; reconnecting");
                        return;
                    }
                }
            }
        }
    }
}
