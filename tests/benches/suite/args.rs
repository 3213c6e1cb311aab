//! The command line.

use clap::{Parser, ValueEnum};
use idem_tests::Backend;

#[derive(Debug, Parser)]
#[command(about = "idem's benchmark suite: side by side on RabbitMQ with each database")]
pub(crate) struct Args {
    /// Messages per round for `raw` and the batch modes.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(10..))]
    pub(crate) messages: u64,
    /// Messages per round for the per-message modes, the outbox modes included (one commit per
    /// message, 10 to 30 times slower); default a fifth of `--messages`.
    #[arg(long, value_parser = clap::value_parser!(u64).range(10..))]
    pub(crate) per_message_messages: Option<u64>,
    /// Counted rounds per mode, after one warm-up round.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) rounds: u64,
    /// Databases to run on.
    #[arg(long, value_delimiter = ',', default_values = ["postgres", "mysql", "sqlite"])]
    pub(crate) backends: Vec<BackendArg>,
    /// Prefetch windows to run at.
    #[arg(long, value_delimiter = ',', default_values = ["100", "500"], value_parser = clap::value_parser!(u16).range(1..))]
    pub(crate) prefetch: Vec<u16>,
    /// Modes to run.
    #[arg(long, value_delimiter = ',', default_values = ["raw", "hand-per-message", "idem-per-message", "hand-batch", "hand-batch-multirow", "idem-batch", "idem-batch-checked", "idem-batch-slice", "idem-batch-during-cleanup", "hand-outbox", "idem-outbox"])]
    pub(crate) modes: Vec<Mode>,
    /// Largest batch of the batch modes (capped by the prefetch).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) batch_size: u64,
    /// Batches an idem batch binding runs at once (`Binding::batches_in_flight`); the
    /// binding's default unless given.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) batches_in_flight: Option<u64>,
    /// Longest wait for a batch to fill, in milliseconds.
    #[arg(long, default_value_t = 5)]
    pub(crate) max_wait_ms: u64,
    /// Expired records in the inbox table when each round of `idem-batch-during-cleanup`
    /// starts.
    #[arg(long, default_value_t = 1_000_000)]
    pub(crate) expired_rows: u64,
    /// Prints one JSON object per line instead of tables.
    #[arg(long)]
    pub(crate) json: bool,
    /// Runs idem's batch consumer on this many messages instead of the suite, on the first
    /// backend and prefetch, printing resident memory every 100 k messages.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) soak: Option<u64>,
    /// Runs the outbox relay's drains instead of the suite (issue 21), on each backend given.
    #[arg(long)]
    pub(crate) outbox_drain: bool,
    /// Messages of the large drain of `--outbox-drain`.
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(100..))]
    pub(crate) drain_backlog: u64,
    /// Messages held for a missing exchange during a drain of `--outbox-drain`.
    #[arg(long, default_value_t = 100_000)]
    pub(crate) drain_held: u64,
    /// Sent rows the cleaner deletes during a drain of `--outbox-drain`.
    #[arg(long, default_value_t = 10_000_000)]
    pub(crate) drain_sent: u64,
    /// Runs the batch and per-message consumers and the outbox relay, idem's and the
    /// hand-written ones, on tables filled with this many live records (and sent messages) each,
    /// after the same on empty tables, instead of the suite: `--table-sizes
    /// 1000000,5000000,20000000`. Keep to one backend per run on a small disk: each size's
    /// tables are dropped after its rounds.
    #[arg(long, value_delimiter = ',')]
    pub(crate) table_sizes: Vec<u64>,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    pub(crate) bench: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum BackendArg {
    Postgres,
    Mysql,
    Sqlite,
}

impl BackendArg {
    pub(crate) fn backend(self) -> Backend {
        match self {
            BackendArg::Postgres => Backend::Postgres,
            BackendArg::Mysql => Backend::MySql,
            BackendArg::Sqlite => Backend::Sqlite,
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            BackendArg::Postgres => "postgres",
            BackendArg::Mysql => "mysql",
            BackendArg::Sqlite => "sqlite",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Mode {
    Raw,
    HandPerMessage,
    IdemPerMessage,
    HandBatch,
    HandBatchMultirow,
    IdemBatch,
    /// `idem-batch` with [`idem_runtime::transport::BatchChecks::EachMessage`]: each handler
    /// checked, for handlers not trusted to leave their transaction whole.
    IdemBatchChecked,
    /// idem's batches with a slice handler: the fresh orders in one multi-row insert.
    IdemBatchSlice,
    IdemBatchDuringCleanup,
    HandOutbox,
    IdemOutbox,
}

impl Mode {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Mode::Raw => "raw",
            Mode::HandPerMessage => "hand-per-message",
            Mode::IdemPerMessage => "idem-per-message",
            Mode::HandBatch => "hand-batch",
            Mode::HandBatchMultirow => "hand-batch-multirow",
            Mode::IdemBatch => "idem-batch",
            Mode::IdemBatchChecked => "idem-batch-checked",
            Mode::IdemBatchSlice => "idem-batch-slice",
            Mode::IdemBatchDuringCleanup => "idem-batch-during-cleanup",
            Mode::HandOutbox => "hand-outbox",
            Mode::IdemOutbox => "idem-outbox",
        }
    }

    pub(crate) fn per_message(self) -> bool {
        matches!(
            self,
            Mode::HandPerMessage | Mode::IdemPerMessage | Mode::HandOutbox | Mode::IdemOutbox
        )
    }

    pub(crate) fn idem(self) -> bool {
        matches!(
            self,
            Mode::IdemPerMessage
                | Mode::IdemBatch
                | Mode::IdemBatchChecked
                | Mode::IdemBatchSlice
                | Mode::IdemBatchDuringCleanup
                | Mode::IdemOutbox
        )
    }

    /// Whether the mode relays an event per fresh order through an outbox.
    pub(crate) fn outbox(self) -> bool {
        matches!(self, Mode::HandOutbox | Mode::IdemOutbox)
    }

    pub(crate) fn batch(self) -> bool {
        matches!(
            self,
            Mode::HandBatch
                | Mode::HandBatchMultirow
                | Mode::IdemBatch
                | Mode::IdemBatchChecked
                | Mode::IdemBatchSlice
                | Mode::IdemBatchDuringCleanup
        )
    }
}
