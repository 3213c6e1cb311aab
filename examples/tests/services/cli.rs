//! The example binaries' command lines, run as processes: `--help` lists the options and their
//! environment variables, bad values are refused with exit code 2 and a message naming the
//! option, and logs written to a pipe carry no colour codes. No service is needed: a refused
//! value stops the process before it connects anywhere, and the log checks point the broker at
//! a closed port. Run: `cargo test -p idem-examples --test services cli::`.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const BILLING: &str = env!("CARGO_BIN_EXE_billing");
const ORDERS: &str = env!("CARGO_BIN_EXE_orders");

/// A broker address nothing listens on.
const NO_BROKER: &str = "amqp://guest:guest@127.0.0.1:1/%2f";

/// The environment variables the binaries read, removed so that the caller's own settings do
/// not leak into a test.
const VARIABLES: [&str; 14] = [
    "AMQP_URL",
    "AMQP_CA_FILE",
    "AMQP_CLIENT_CERT",
    "AMQP_CLIENT_KEY",
    "BROKER_WAIT_MS",
    "DATABASE_URL",
    "ORDERS_EXCHANGE",
    "BILLING_QUEUE",
    "BILLING_CONNECTION_NAME",
    "BILLING_STATS_EVERY_MS",
    "BILLING_BATCH",
    "BILLING_CHECK_EACH_HANDLER",
    "BILLING_SLICES",
    "NO_COLOR",
];

/// `binary` with `args` and `env` on a clean environment; the broker is unreachable, so that a
/// run that got past its arguments fails rather than touching a real queue.
fn command(binary: &str, args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut command = Command::new(binary);
    for variable in VARIABLES {
        command.env_remove(variable);
    }
    command
        .env("AMQP_URL", NO_BROKER)
        .env("DATABASE_URL", scratch_database())
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null());
    command
}

fn run(binary: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    command(binary, args, env)
        .output()
        .expect("the binary runs")
}

/// A SQLite database in the temporary directory, so that no run leaves `billing.db` behind.
fn scratch_database() -> String {
    let path: PathBuf = std::env::temp_dir().join(format!("idem-cli-{}.db", std::process::id()));
    format!("sqlite://{}?mode=rwc", path.display())
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Asserts that the run was refused by the argument parser (exit code 2) with a message that
/// names `option`.
fn assert_refused(output: &Output, option: &str) {
    let stderr = text(&output.stderr);
    assert_eq!(
        output.status.code(),
        Some(2),
        "expected a refusal, got {:?}:\n{stderr}",
        output.status
    );
    assert!(
        stderr.starts_with("error: ") && stderr.contains(option),
        "the message should name {option}:\n{stderr}"
    );
    assert!(
        output.stdout.is_empty(),
        "nothing on stdout: {}",
        text(&output.stdout)
    );
}

#[test]
fn billing_help_lists_the_options_and_their_variables() {
    let output = run(BILLING, &["--help"], &[]);
    let help = text(&output.stdout);
    assert!(output.status.success(), "{help}{}", text(&output.stderr));
    for expected in [
        "Usage: billing",
        "--demo [<N>]",
        "--amqp-url <URL>",
        "--exchange <NAME>",
        "--database-url <URL>",
        "--queue <QUEUE>",
        "--connection-name <NAME>",
        "--stats-every-ms <MS>",
        "--batch <N>",
        "--check-each-handler",
        "--slices",
        "--broker-wait-ms <MS>",
        "[env: AMQP_URL]",
        "[env: BROKER_WAIT_MS=]",
        "[env: DATABASE_URL]",
        "[env: ORDERS_EXCHANGE=]",
        "[env: BILLING_QUEUE=]",
        "[env: BILLING_CONNECTION_NAME=]",
        "[env: BILLING_STATS_EVERY_MS=]",
        "[env: BILLING_BATCH=]",
        "[env: BILLING_CHECK_EACH_HANDLER=]",
        "[env: BILLING_SLICES=]",
        &format!("from 1 to {}", idem_runtime::transport::MAX_BATCH),
    ] {
        assert!(help.contains(expected), "no {expected:?} in:\n{help}");
    }
}

#[test]
fn help_never_shows_the_urls_from_the_environment() {
    let secret = "postgres://app:hunter2@db/billing";
    let output = run(
        BILLING,
        &["--help"],
        &[("DATABASE_URL", secret), ("AMQP_URL", secret)],
    );
    assert!(output.status.success());
    let help = text(&output.stdout);
    assert!(!help.contains("hunter2"), "{help}");
}

#[test]
fn orders_help_lists_the_count_and_the_broker_options() {
    let output = run(ORDERS, &["--help"], &[]);
    let help = text(&output.stdout);
    assert!(output.status.success(), "{help}{}", text(&output.stderr));
    for expected in [
        "Usage: orders [OPTIONS] [COUNT]",
        "[default: 10]",
        "--amqp-url <URL>",
        "--exchange <NAME>",
        "[env: ORDERS_EXCHANGE=]",
    ] {
        assert!(help.contains(expected), "no {expected:?} in:\n{help}");
    }
}

#[test]
fn options_that_need_another_are_refused_without_it() {
    assert_refused(&run(BILLING, &["--json"], &[]), "--demo");
    assert_refused(&run(BILLING, &["--check-each-handler"], &[]), "--batch");
    assert_refused(&run(BILLING, &["--slices"], &[]), "--batch");
}

#[test]
fn a_demo_of_no_orders_is_refused() {
    let output = run(BILLING, &["--demo", "0"], &[]);
    assert_refused(&output, "--demo");
    assert!(text(&output.stderr).contains("must be at least 1"));
}

#[test]
fn a_demo_size_that_is_not_a_number_is_refused() {
    assert_refused(&run(BILLING, &["--demo", "x"], &[]), "--demo");
    assert_refused(&run(BILLING, &["--demo", "-3"], &[]), "-3");
}

#[test]
fn an_unknown_option_is_refused() {
    assert_refused(&run(BILLING, &["--demo", "5", "--dmeo"], &[]), "--dmeo");
    assert_refused(&run(ORDERS, &["10", "20"], &[]), "20");
}

#[test]
fn batch_sizes_outside_the_runtime_range_are_refused_from_the_environment() {
    let too_big = (idem_runtime::transport::MAX_BATCH + 1).to_string();
    for bad in ["0", too_big.as_str(), "ten", "-1"] {
        assert_refused(&run(BILLING, &[], &[("BILLING_BATCH", bad)]), "--batch");
    }
    assert_refused(&run(BILLING, &["--batch", "0"], &[]), "--batch");
}

#[test]
fn a_stats_interval_that_is_not_a_positive_number_of_milliseconds_is_refused() {
    for bad in ["0", "1.5", "1s", "-20"] {
        assert_refused(
            &run(BILLING, &[], &[("BILLING_STATS_EVERY_MS", bad)]),
            "--stats-every-ms",
        );
    }
}

#[test]
fn orders_refuses_a_count_of_zero_or_a_word() {
    assert_refused(&run(ORDERS, &["0"], &[]), "[COUNT]");
    assert_refused(&run(ORDERS, &["many"], &[]), "[COUNT]");
}

/// Asserts that `stderr` holds log lines and no escape sequence.
fn assert_plain(stderr: &str, expected: &str) {
    assert!(stderr.contains(expected), "no {expected:?} in:\n{stderr}");
    assert!(
        !stderr.contains('\x1b'),
        "escape codes in logs written to a pipe:\n{stderr:?}"
    );
    assert!(
        !stderr.contains('\r'),
        "a progress line on a pipe:\n{stderr:?}"
    );
}

/// The first line `binary` logs to a pipe (standard error), without `NO_COLOR`; the process is
/// killed then, as both keep trying to reach the closed broker port for minutes.
fn first_log_line(binary: &str, args: &[&str]) -> String {
    let mut child = command(binary, args, &[("RUST_LOG", "info")])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts");
    let stderr = child.stderr.take().unwrap();
    let (sender, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if sender.send(line).is_err() {
                break;
            }
        }
    });
    let first = lines.recv_timeout(Duration::from_secs(30));
    child.kill().unwrap();
    child.wait().unwrap();
    first.expect("the binary logs a line at start")
}

#[test]
fn billing_logs_to_a_pipe_without_colour_codes() {
    let first = first_log_line(BILLING, &[]);
    assert_plain(&first, "billing starting");
    assert!(
        first.contains("broker=amqp://guest:***@127.0.0.1:1/"),
        "the broker, its password hidden: {first}"
    );
}

#[test]
fn orders_logs_to_a_pipe_without_colour_codes() {
    assert_plain(&first_log_line(ORDERS, &["3"]), "publishing orders");
}

/// With RabbitMQ down, the demo says so: each attempt is logged with the broker's address (its
/// password hidden), and after the wait it gives up with an error naming the address and how to
/// start RabbitMQ. So does `orders`.
#[test]
fn a_demo_without_a_broker_gives_up_after_its_wait_and_says_how_to_start_rabbitmq() {
    let no_broker = "amqp://guest:s3cret@127.0.0.1:1/%2f";
    for (binary, args) in [(BILLING, &["--demo", "3"][..]), (ORDERS, &["3"][..])] {
        let started = std::time::Instant::now();
        let output = command(
            binary,
            args,
            &[("AMQP_URL", no_broker), ("BROKER_WAIT_MS", "3000")],
        )
        .output()
        .expect("the binary runs");
        let stderr = text(&output.stderr);
        assert!(!output.status.success(), "{stderr}");
        assert!(started.elapsed() < Duration::from_secs(30), "{stderr}");
        for expected in [
            "cannot reach the broker",
            "could not be reached within 3s",
            "amqp://guest:***@127.0.0.1:1/",
            "rabbitmq-server -detached",
        ] {
            assert!(stderr.contains(expected), "no {expected:?} in:\n{stderr}");
        }
        assert!(!stderr.contains("s3cret"), "{stderr}");
    }
}

/// A broker behind TLS with a private CA: `orders` publishes through it given the CA file
/// (`AMQP_CA_FILE`), and without it says why each try failed; an unreadable CA file is refused
/// before anything is published, naming the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orders_reach_a_tls_broker_given_its_ca_file() {
    use idem_tests::tls::{Certificates, ClientAuth, TlsListener};
    let certificates = Certificates::make("orders");
    let listener = TlsListener::start(
        &idem_tests::rabbit::amqp_addr(),
        &certificates,
        ClientAuth::None,
    )
    .await;
    let url = listener.url();
    let ca = certificates.ca_file.display().to_string();
    let exchange = idem_tests::unique("idem-cli-tls");
    let broker = idem_tests::rabbit::TestBroker::connect().await;
    let queue = broker.classic_queue();
    broker.declare(&queue).await;
    let kind = idem_rabbitmq::lapin::ExchangeKind::Topic;
    broker.declare_exchange(&exchange, kind).await;
    broker.bind(queue.queue(), &exchange, "#").await;
    let orders = |env: Vec<(&'static str, String)>| {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let mut command = command(ORDERS, &["3"], &env);
        tokio::task::block_in_place(|| command.output().expect("the binary runs"))
    };
    let base = || {
        vec![
            ("AMQP_URL", url.clone()),
            ("ORDERS_EXCHANGE", exchange.clone()),
            ("BROKER_WAIT_MS", "2000".to_owned()),
        ]
    };

    let mut trusted = base();
    trusted.push(("AMQP_CA_FILE", ca.clone()));
    let output = orders(trusted);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let stdout = text(&output.stdout);
    let messages: u32 = (stdout.split(" as ").nth(1))
        .and_then(|rest| rest.split(' ').next())
        .and_then(|count| count.parse().ok())
        .unwrap_or_else(|| panic!("no message count in {stdout:?}"));
    assert!(messages >= 3, "{stdout}");
    assert_eq!(broker.depth(queue.queue()).await, messages);

    let output = orders(base());
    let stderr = text(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("certificate"), "no reason in:\n{stderr}");

    let mut unreadable = base();
    unreadable.push(("AMQP_CA_FILE", "/nonexistent/ca.pem".to_owned()));
    let output = orders(unreadable);
    let stderr = text(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains("cannot read the CA file /nonexistent/ca.pem"),
        "{stderr}"
    );
}
