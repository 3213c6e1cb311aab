//! Outbox backlogs for the relay's tests and benchmarks: rows as [`Outbox::stage`] writes them
//! for messages of named runs, written many per statement (staging a million messages one by
//! one would take longer than the drain it sets up).
//!
//! [`Outbox::stage`]: idem_runtime::outbox::Outbox::stage

use idem_runtime::sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement, Value};

/// Rows per insert: under SQLite's limit of bound values.
const ROWS_PER_INSERT: u64 = 2000;

/// A backlog: `runs` named runs of `per_run` messages each, to `exchange` with `routing_key`,
/// interleaved (the first message of every run, then the second of every run, ...), so that each
/// run's messages are spread over the whole backlog.
#[derive(Debug, Clone, Copy)]
pub struct Backlog<'a> {
    /// Prefixes the message ids and run names: backlogs with different prefixes share a table.
    pub prefix: &'a str,
    /// The exchange every message goes to.
    pub exchange: &'a str,
    /// The routing key of every message.
    pub routing_key: &'a str,
    /// How many runs.
    pub runs: u64,
    /// How many messages each run has.
    pub per_run: u64,
}

impl Backlog<'_> {
    /// How many messages it holds.
    pub fn len(&self) -> u64 {
        self.runs * self.per_run
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The id of message `i` of run `run`.
    pub fn message_id(&self, run: u64, i: u64) -> String {
        format!("{}-{run}-{i}", self.prefix)
    }

    /// Writes its messages into the outbox table `table` as pending, or, with `sent`, as sent
    /// long ago (for a cleaner to delete).
    pub async fn write(&self, db: &DatabaseConnection, table: &str, sent: bool) {
        let backend = db.get_database_backend();
        if self.len() >= GENERATED_FROM && self.generate(db, table, sent).await {
            return;
        }
        let total = self.len();
        let mut next = 0;
        while next < total {
            let rows = ROWS_PER_INSERT.min(total - next);
            let mut values = Vec::with_capacity(rows as usize * 5);
            let mut tuples = Vec::with_capacity(rows as usize);
            for n in next..next + rows {
                let (i, run) = (n / self.runs, n % self.runs);
                let at = values.len();
                tuples.push(format!(
                    "({}, {}, {}, {}, {}, {}, 0, {})",
                    placeholder(backend, at + 1),
                    placeholder(backend, at + 2),
                    placeholder(backend, at + 3),
                    placeholder(backend, at + 4),
                    placeholder(backend, at + 5),
                    "'text/plain'",
                    if sent { "0" } else { "NULL" },
                ));
                values.push(Value::from(self.message_id(run, i)));
                values.push(Value::from(self.exchange.to_owned()));
                values.push(Value::from(self.routing_key.to_owned()));
                values.push(Value::from(body(run, i).into_bytes()));
                values.push(Value::from(format!("run:{}-{run}", self.prefix)));
            }
            let sql = format!(
                "INSERT INTO {} (message_id, exchange, routing_key, payload, origin, \
                 content_type, staged_at, sent_at) VALUES {}",
                quoted(backend, table),
                tuples.join(", ")
            );
            db.execute_raw(Statement::from_sql_and_values(backend, sql, values))
                .await
                .unwrap_or_else(|error| panic!("the backlog's insert into {table}: {error}"));
            next += rows;
        }
    }
}

impl Backlog<'_> {
    /// Writes the backlog with rows the database generates, a million per statement, where it
    /// can (PostgreSQL's `generate_series`, MariaDB's sequence tables): many times faster than
    /// rows sent from here. Returns whether it could.
    async fn generate(&self, db: &DatabaseConnection, table: &str, sent: bool) -> bool {
        const ROWS: u64 = 1_000_000;
        let backend = db.get_database_backend();
        let sent_at = if sent { "0" } else { "NULL" };
        let (runs, prefix) = (self.runs, self.prefix);
        let mut next = 0;
        while next < self.len() {
            let last = (next + ROWS).min(self.len()) - 1;
            // Row `n` is message `n / runs` of run `n % runs`, as `write` numbers them.
            let (source, order, run, place, text, bytes) = match backend {
                DbBackend::Postgres => (
                    format!("generate_series({next}, {last}) AS s(n)"),
                    "n",
                    format!("(n % {runs})"),
                    format!("(n / {runs})"),
                    "::text",
                    "convert_to({}, 'UTF8')",
                ),
                DbBackend::MySql if mariadb(db).await => (
                    format!("seq_{next}_to_{last} AS s"),
                    "s.seq",
                    format!("(s.seq % {runs})"),
                    format!("(s.seq DIV {runs})"),
                    "",
                    "{}",
                ),
                _ => return false,
            };
            let concat = |parts: &[String]| match backend {
                DbBackend::Postgres => parts.join(" || "),
                _ => format!("CONCAT({})", parts.join(", ")),
            };
            let id = concat(&[
                format!("'{prefix}-'"),
                format!("{run}{text}"),
                "'-'".to_owned(),
                format!("{place}{text}"),
            ]);
            let body = concat(&[
                format!("{run}{text}"),
                "':'".to_owned(),
                format!("{place}{text}"),
            ]);
            let origin = concat(&[format!("'run:{prefix}-'"), format!("{run}{text}")]);
            let sql = format!(
                "INSERT INTO {} (message_id, exchange, routing_key, payload, origin, \
                 content_type, staged_at, sent_at) SELECT {id}, '{}', '{}', {}, {origin}, \
                 'text/plain', 0, {sent_at} FROM {source} ORDER BY {order}",
                quoted(backend, table),
                self.exchange,
                self.routing_key,
                bytes.replace("{}", &body),
            );
            db.execute_unprepared(&sql)
                .await
                .unwrap_or_else(|error| panic!("the backlog's insert into {table}: {error}"));
            next = last + 1;
        }
        true
    }
}

/// Backlogs from this size on are generated by the database where it can.
const GENERATED_FROM: u64 = 100_000;

/// Whether `db` is MariaDB, whose sequence tables generate rows.
async fn mariadb(db: &DatabaseConnection) -> bool {
    let sql = Statement::from_string(DbBackend::MySql, "SELECT VERSION()");
    let row = db.query_one_raw(sql).await.ok().flatten();
    row.and_then(|row| row.try_get_by_index::<String>(0).ok())
        .is_some_and(|version| version.contains("MariaDB"))
}

/// The body of message `i` of run `run`: `run:i`.
pub fn body(run: u64, i: u64) -> String {
    format!("{run}:{i}")
}

/// The run and the place in it a body names.
pub fn run_and_place(body: &[u8]) -> (u64, u64) {
    let text = std::str::from_utf8(body).expect("a text body");
    let (run, i) = text.split_once(':').expect("run:i");
    (
        run.parse().expect("a run number"),
        i.parse().expect("a place"),
    )
}

fn placeholder(backend: DbBackend, n: usize) -> String {
    match backend {
        DbBackend::Postgres => format!("${n}"),
        _ => "?".to_owned(),
    }
}

fn quoted(backend: DbBackend, table: &str) -> String {
    match backend {
        DbBackend::MySql => format!("`{table}`"),
        _ => format!("\"{table}\""),
    }
}
