//! `idem dlq` against the real RabbitMQ and PostgreSQL: letters a consumer dead-lettered are
//! counted by reason and left in place, checked against the inbox, moved back to their queue
//! and processed once the handler is fixed; a replay killed half-way loses nothing.
//!
//! Run: `cargo test -p idem-cli --test dlq` with RabbitMQ and PostgreSQL up.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use idem_rabbitmq::PublishOptions;
use idem_rabbitmq::lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use idem_rabbitmq::lapin::types::{AMQPValue, FieldTable};
use idem_rabbitmq::lapin::{BasicProperties, Channel};
use idem_tests::proxy::Proxy;
use idem_tests::rabbit::{
    amqp_addr, amqp_url, amqp_url_through, ensure_management, setup_channel, with_id,
};
use idem_tests::{Fixture, Msg, TestBroker, unique};
use serde_json::Value;

/// Runs `idem args...` with the broker and, when given, the fixture's database and inbox.
fn idem(fixture: Option<&Fixture>, args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_idem"));
    command
        .args(args)
        .env("AMQP_URL", amqp_url())
        .env_remove("DATABASE_URL")
        .stdin(Stdio::null());
    if let Some(f) = fixture {
        command
            .env("DATABASE_URL", f.db.url())
            .env("IDEM_INBOX_TABLE", f.inbox.table().as_str());
    }
    command.output().expect("idem runs")
}

fn json(output: &Output) -> Value {
    assert!(output.status.success(), "{output:?}");
    serde_json::from_slice(&output.stdout).expect("JSON on stdout")
}

fn ids(letters: &[idem_tests::rabbit::DeadLetter]) -> Vec<String> {
    letters
        .iter()
        .map(|letter| letter.message_id.clone().unwrap_or_default())
        .collect()
}

/// Waits until `queue` holds `depth` messages.
async fn wait_for_depth(broker: &TestBroker, queue: &str, depth: u32) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = broker.depth(queue).await;
        if now == depth {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{queue} holds {now}, not {depth}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the handler wrote `count` effects.
async fn wait_for_effects(f: &Fixture, count: i64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while f.effects("1 = 1").await < count {
        assert!(Instant::now() < deadline, "fewer than {count} effects");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The whole round: a consumer dead-letters two messages its handler failed permanently, one
/// it could not decode and one that reused a key with other content; `list` counts them by
/// reason and leaves them in their order; `--dry-run` tells the inbox's view of each and moves
/// nothing; `replay --reason` moves the handler's failures back once it is fixed, where they are
/// processed, and leaves the others in their order.
#[tokio::test(flavor = "multi_thread")]
async fn dead_letters_are_counted_checked_and_replayed_once_fixed() {
    let f = Fixture::new().await;
    let consumer = unique("dlq");
    let mut handler = f.recorder(&consumer);
    handler.permanent = true;
    handler.fail_next(2);
    let running = f.start(handler.clone()).await;
    let dlq = f.topology.dead_letter_queue().to_owned();
    let send = |id: &'static str, body: &'static str| {
        let f = &f;
        async move {
            f.send(
                &Msg::new(id, body),
                PublishOptions::default().message_id(id),
            )
            .await
        }
    };
    send("p1", "x").await;
    wait_for_depth(&f.broker, &dlq, 1).await;
    send("p2", "x").await;
    wait_for_depth(&f.broker, &dlq, 2).await;
    f.send_bytes(b"not json", PublishOptions::default().message_id("u1"))
        .await;
    send("p3", "x").await;
    wait_for_depth(&f.broker, &dlq, 3).await;
    wait_for_effects(&f, 1).await;
    send("p3", "other").await;
    wait_for_depth(&f.broker, &dlq, 4).await;

    for _ in 0..2 {
        let listed = json(&idem(None, &["dlq", "list", &dlq, "--json"]));
        assert_eq!(listed["messages"], 4, "{listed}");
        let reasons = listed["reasons"].as_array().unwrap();
        let by = |code: &str| {
            reasons
                .iter()
                .find(|r| r["reason"] == code)
                .unwrap_or_else(|| panic!("no {code} in {listed}"))
        };
        let failed = by("handler-permanent-error");
        assert_eq!(failed["count"], 2);
        assert_eq!(failed["first"]["message_id"], "p1");
        assert_eq!(failed["last"]["message_id"], "p2");
        assert_eq!(failed["first"]["key"], "p1");
        assert_eq!(failed["first"]["consumer"], consumer.as_str());
        assert!(failed["first"]["dead_lettered_ms"].as_u64().unwrap() > 0);
        assert_eq!(by("undecodable")["count"], 1);
        assert_eq!(by("undecodable")["samples"][0]["body"], "not json");
        assert_eq!(by("fingerprint-mismatch")["count"], 1);
    }
    let only = json(&idem(
        None,
        &["dlq", "list", &dlq, "--reason", "undecodable", "--json"],
    ));
    assert_eq!(only["messages"], 1, "{only}");

    let dry = json(&idem(
        Some(&f),
        &[
            "dlq",
            "replay",
            &dlq,
            "--to",
            &f.queue,
            "--dry-run",
            "--json",
        ],
    ));
    let verdicts: Vec<(String, String)> = dry["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let id = m["message_id"].as_str().unwrap().to_owned();
            (id, m["inbox"].as_str().unwrap().to_owned())
        })
        .collect();
    let expected = [
        ("p1", "new"),
        ("p2", "new"),
        ("u1", "no-key"),
        ("p3", "duplicate"),
    ];
    let expected: Vec<(String, String)> = expected
        .iter()
        .map(|(id, verdict)| ((*id).to_owned(), (*verdict).to_owned()))
        .collect();
    assert_eq!(verdicts, expected, "{dry}");
    assert_eq!(f.broker.depth(&dlq).await, 4, "a dry run moves nothing");

    // The handler works now: its failures go back to its queue and are processed.
    let replayed = json(&idem(
        None,
        &[
            "dlq",
            "replay",
            &dlq,
            "--to",
            &f.queue,
            "--reason",
            "handler-permanent-error",
            "--json",
        ],
    ));
    assert_eq!(replayed["moved"], 2, "{replayed}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while f.effects("1 = 1").await < 3 {
        assert!(
            Instant::now() < deadline,
            "the replayed messages were not processed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    running.shutdown().await;
    assert_eq!(f.effects("1 = 1").await, 3, "p1, p2 and p3 once each");
    assert_eq!(f.depth().await, 0);
    assert_eq!(ids(&f.broker.drain(&dlq).await), ["u1", "p3"]);
}

/// A channel whose publishes the broker confirms.
async fn confirming_channel() -> Channel {
    let channel = setup_channel().await;
    let options = ConfirmSelectOptions::default();
    channel.confirm_select(options).await.unwrap();
    channel
}

/// Publishes `count` letters named `<prefix>-<i>` to `queue`, confirmed: every third one
/// `undecodable`, the others `handler-error`.
async fn publish_letters(channel: &Channel, queue: &str, prefix: &str, count: usize) {
    let reason = |i: usize| {
        if i.is_multiple_of(3) {
            "undecodable"
        } else {
            "handler-error"
        }
    };
    publish_letters_of(channel, queue, prefix, count, reason).await;
}

/// Publishes `count` letters named `<prefix>-<i>` to `queue`, confirmed, the `i`th one
/// dead-lettered for `reason(i)`.
async fn publish_letters_of(
    channel: &Channel,
    queue: &str,
    prefix: &str,
    count: usize,
    reason: impl Fn(usize) -> &'static str,
) {
    for i in 0..count {
        let mut headers = FieldTable::default();
        headers.insert(
            idem_rabbitmq::headers::REASON.into(),
            AMQPValue::LongString(reason(i).into()),
        );
        let properties = BasicProperties::default()
            .with_message_id(format!("{prefix}-{i}").into())
            // Transient, as letters the broker dead-lettered itself can be: their copies are not.
            .with_delivery_mode(1)
            .with_headers(headers);
        channel
            .basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions::default(),
                format!("letter {i}").as_bytes(),
                properties,
            )
            .await
            .unwrap()
            .await
            .unwrap();
    }
}

/// A dead-letter queue `dlq_<name>_...` holding `count` letters `<prefix>-<i>` and an empty
/// queue `dlq_<name>_target_...` to replay them to.
async fn letters_to_replay(name: &str, prefix: &str, count: usize) -> (TestBroker, String, String) {
    let broker = TestBroker::connect().await;
    let dlq = unique(&format!("dlq_{name}"));
    let target = unique(&format!("dlq_{name}_target"));
    broker.declare_queue(&dlq, &[]).await;
    broker.declare_queue(&target, &[]).await;
    publish_letters(&confirming_channel().await, &dlq, prefix, count).await;
    (broker, dlq, target)
}

/// After a replay from `dlq` to `target` was interrupted with `letters` in play: every letter
/// is in one queue or the other, at most one in both, and not all were moved. Returns how
/// many are left.
async fn interrupted_between(broker: &TestBroker, dlq: &str, target: &str, letters: usize) -> u32 {
    let (left, moved) = (broker.depth(dlq).await, broker.depth(target).await);
    assert!(
        (left + moved) as usize == letters || (left + moved) as usize == letters + 1,
        "{left} left and {moved} moved of {letters}"
    );
    assert!(
        (moved as usize) < letters,
        "interrupted before the end: {moved}"
    );
    left
}

/// A second replay moves the `left` letters still in `dlq`; then `target` holds every one of
/// `expected`, at most one of them twice.
async fn finish_and_count(
    broker: &TestBroker,
    dlq: &str,
    target: &str,
    left: u32,
    expected: &[String],
) {
    let finished = json(&idem(
        None,
        &["dlq", "replay", dlq, "--to", target, "--json"],
    ));
    assert_eq!(finished["moved"].as_u64().unwrap(), u64::from(left));
    assert_eq!(broker.depth(dlq).await, 0);
    let mut got = ids(&broker.drain(target).await);
    let copies = got.len();
    got.sort();
    got.dedup();
    assert!(
        copies - got.len() <= 1,
        "{} copies twice",
        copies - got.len()
    );
    let mut expected = expected.to_vec();
    expected.sort();
    assert_eq!(got, expected, "every letter moved");
}

/// Runs `command` to its end, killed and failed if it outlives `limit`.
async fn run_within(command: &mut Command, limit: Duration) -> Output {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
            panic!("{command:?} did not end within {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    child.wait_with_output().unwrap()
}

/// Listing a quorum dead-letter queue, or a classic one, leaves its messages in their order,
/// and a replay to a queue that does not exist moves nothing (exit code 3).
#[tokio::test(flavor = "multi_thread")]
async fn listing_leaves_every_message_in_its_place() {
    ensure_management().await;
    let broker = TestBroker::connect().await;
    let channel = confirming_channel().await;
    let quorum = unique("dlq_quorum");
    broker
        .declare_queue(&quorum, &[("x-queue-type", "quorum")])
        .await;
    let classic = unique("dlq_classic");
    broker.declare_queue(&classic, &[]).await;
    for queue in [&quorum, &classic] {
        publish_letters(&channel, queue, "l", 12).await;
        for _ in 0..3 {
            let listed = json(&idem(None, &["dlq", "list", queue, "--json"]));
            assert_eq!(listed["messages"], 12, "{listed}");
            wait_for_depth(&broker, queue, 12).await;
        }
        let missing = idem(
            None,
            &["dlq", "replay", queue, "--to", "no-such-queue-here"],
        );
        assert_eq!(missing.status.code(), Some(3), "{missing:?}");
        let expected: Vec<String> = (0..12).map(|i| format!("l-{i}")).collect();
        assert_eq!(ids(&broker.drain(queue).await), expected, "{queue}");
    }
    let missing = idem(None, &["dlq", "list", "no-such-queue-here"]);
    assert_eq!(missing.status.code(), Some(3), "{missing:?}");
}

/// `replay --limit` moves that many of the asked reason, in order; a replay killed (SIGKILL)
/// half-way through thousands leaves every message in one queue or the other, at most one in
/// both; a second replay moves the rest.
#[tokio::test(flavor = "multi_thread")]
async fn a_replay_killed_half_way_loses_nothing() {
    const LETTERS: usize = 3_000;
    let (broker, dlq, target) = letters_to_replay("killed", "k", LETTERS).await;

    let limited = json(&idem(
        None,
        &[
            "dlq",
            "replay",
            &dlq,
            "--to",
            &target,
            "--reason",
            "undecodable",
            "--limit",
            "3",
            "--json",
        ],
    ));
    assert_eq!(limited["moved"], 3, "{limited}");
    let first: Vec<String> = ["k-0", "k-3", "k-6"].map(String::from).to_vec();
    let copies = broker.drain(&target).await;
    assert_eq!(ids(&copies), first);
    for copy in &copies {
        assert_eq!(copy.headers.get("x-idem-replayed-from"), Some(&dlq));
        assert_eq!(
            copy.reason(),
            "undecodable",
            "the letter's headers are kept"
        );
        assert_eq!(copy.delivery_mode, Some(2));
    }
    let limited_ids = first;

    let mut replay = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["dlq", "replay", &dlq, "--to", &target])
        .env("AMQP_URL", amqp_url())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while broker.depth(&target).await < 300 {
        assert!(Instant::now() < deadline, "the replay moved nothing");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    replay.kill().unwrap();
    replay.wait().unwrap();
    // The broker gives the killed command's unacknowledged message back.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let expected: Vec<String> = (0..LETTERS)
        .map(|i| format!("k-{i}"))
        .filter(|id| !limited_ids.contains(id))
        .collect();
    let left = interrupted_between(&broker, &dlq, &target, expected.len()).await;

    finish_and_count(&broker, &dlq, &target, left, &expected).await;
}

/// A replay whose last letter taken was moved (stopped by `--limit`, or at the end of the
/// queue) closes cleanly, every time: giving back the letters it kept must not name one it
/// acknowledged, or the broker closes the channel under the close and the command can hang.
#[tokio::test(flavor = "multi_thread")]
async fn replays_ending_on_a_moved_letter_end_every_time() {
    const RUNS: usize = 40;
    let (broker, dlq, target) = letters_to_replay("limited", "m", RUNS + 2).await;

    for run in 0..RUNS {
        let mut replay = Command::new(env!("CARGO_BIN_EXE_idem"));
        replay
            .args(["dlq", "replay", &dlq, "--to", &target, "--limit", "1"])
            .args(["--json"])
            .env("AMQP_URL", amqp_url());
        let output = run_within(&mut replay, Duration::from_secs(20)).await;
        assert_eq!(json(&output)["moved"], 1, "replay {run}");
        assert!(output.stderr.is_empty(), "replay {run}: {output:?}");
    }
    let moved: Vec<String> = (0..RUNS).map(|i| format!("m-{i}")).collect();
    assert_eq!(ids(&broker.drain(&target).await), moved, "in their order");
    assert_eq!(ids(&broker.drain(&dlq).await), ["m-40", "m-41"]);
}

/// A broker that accepts connections and never answers is given up on after `--timeout`, with
/// an error that says so, by `list` and `replay` alike.
#[tokio::test(flavor = "multi_thread")]
async fn a_broker_that_never_answers_is_given_up_on() {
    let proxy = Proxy::start(&amqp_addr()).await;
    proxy.silence().await;
    let commands: [&[&str]; 2] = [
        &["dlq", "list", "any.dlq", "--no-delivery-limit"],
        &["dlq", "replay", "any.dlq", "--to", "any"],
    ];
    for args in commands {
        let mut command = Command::new(env!("CARGO_BIN_EXE_idem"));
        command
            .args(args)
            .args(["--timeout", "1"])
            .env("AMQP_URL", amqp_url_through(&proxy));
        let output = run_within(&mut command, Duration::from_secs(30)).await;
        assert_eq!(output.status.code(), Some(1), "{output:?}");
        let said = String::from_utf8_lossy(&output.stderr);
        assert!(
            said.contains("did not answer within 1s (connecting)"),
            "{said}"
        );
    }
}

/// A replay whose connection the network cuts half-way stops with an error and loses nothing:
/// every letter is in one queue or the other, at most one in both, and a second replay moves
/// the rest.
#[tokio::test(flavor = "multi_thread")]
async fn a_replay_cut_from_the_broker_loses_nothing() {
    const LETTERS: usize = 2_000;
    let (broker, dlq, target) = letters_to_replay("cut", "c", LETTERS).await;
    let proxy = Proxy::start(&amqp_addr()).await;

    let mut command = Command::new(env!("CARGO_BIN_EXE_idem"));
    command
        .args(["dlq", "replay", &dlq, "--to", &target, "--json"])
        .env("AMQP_URL", amqp_url_through(&proxy));
    let replay = run_within(&mut command, Duration::from_secs(120));
    let cut = async {
        let deadline = Instant::now() + Duration::from_secs(60);
        while broker.depth(&target).await < 200 {
            assert!(Instant::now() < deadline, "the replay moved nothing");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        proxy.cut().await;
    };
    let (output, ()) = tokio::join!(replay, cut);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    assert!(output.stderr.starts_with(b"idem: "), "{output:?}");

    // The broker gives the cut connection's unacknowledged message back.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let reported =
        serde_json::from_slice::<Value>(&output.stdout).expect("JSON on stdout")["moved"]
            .as_u64()
            .unwrap();
    let moved = u64::from(broker.depth(&target).await);
    assert!(
        reported == moved || reported + 1 == moved,
        "{reported} reported moved, {moved} in the target queue"
    );
    let expected: Vec<String> = (0..LETTERS).map(|i| format!("c-{i}")).collect();
    let left = interrupted_between(&broker, &dlq, &target, LETTERS).await;
    finish_and_count(&broker, &dlq, &target, left, &expected).await;
}

/// A quorum dead-letter queue with a delivery limit: a look would return every letter it read,
/// which the broker counts toward the limit, and drops a letter past it. `list`, `--dry-run` and
/// a replay that skips letters refuse, naming the limit (exit 4); after ten lists every letter
/// is there, never delivered. The quorum dead-letter queues idem declares have no limit: they
/// are listed as often as asked.
#[tokio::test(flavor = "multi_thread")]
async fn looking_never_brings_a_letter_closer_to_being_dropped() {
    ensure_management().await;
    let broker = TestBroker::connect().await;
    let limited = unique("dlq_limited");
    broker.declare_quorum_queue(&limited, &[], 3).await;
    let channel = confirming_channel().await;
    publish_letters(&channel, &limited, "d", 5).await;
    let target = unique("dlq_limited_target");
    broker.declare_queue(&target, &[]).await;

    let looks: [&[&str]; 3] = [
        &["dlq", "list", &limited],
        &["dlq", "replay", &limited, "--to", &target, "--dry-run"],
        &[
            "dlq",
            "replay",
            &limited,
            "--to",
            &target,
            "--reason",
            "undecodable",
        ],
    ];
    for _ in 0..10 {
        for look in looks {
            let refused = idem(None, look);
            assert_eq!(refused.status.code(), Some(4), "{look:?}: {refused:?}");
            let said = String::from_utf8_lossy(&refused.stderr);
            assert!(said.contains("delivery limit of 3"), "{said}");
        }
    }
    let letters = broker.drain(&limited).await;
    assert_eq!(ids(&letters), ["d-0", "d-1", "d-2", "d-3", "d-4"]);
    for letter in &letters {
        let count = letter.headers.get("x-delivery-count").map(String::as_str);
        assert!(matches!(count, None | Some("0")), "looked at: {count:?}");
    }
    assert_eq!(broker.depth(&target).await, 0);

    // idem's own quorum dead-letter queue.
    let ours = broker.quorum_queue();
    broker.declare(&ours).await;
    let dlq = ours.dead_letter_queue();
    publish_letters(&channel, dlq, "o", 5).await;
    for _ in 0..10 {
        let listed = json(&idem(None, &["dlq", "list", dlq, "--json"]));
        assert_eq!(listed["messages"], 5, "{listed}");
        // The broker takes a listing's letters back as its connection closes, a moment later.
        wait_for_depth(&broker, dlq, 5).await;
    }
}

/// Two replays of one dead-letter queue at once, each of its own reason: neither ends saying
/// it did everything when it did not. One that could not move every letter asked for says so
/// and exits non-zero; run again, it moves the rest, and every letter ends moved once.
#[tokio::test(flavor = "multi_thread")]
async fn concurrent_replays_never_end_in_part_saying_done() {
    const LETTERS: usize = 1_500;
    ensure_management().await;
    let broker = TestBroker::connect().await;
    let dlq = unique("dlq_two");
    let target = unique("dlq_two_target");
    broker.declare_queue(&dlq, &[]).await;
    broker.declare_queue(&target, &[]).await;
    let reason = |i: usize| if i.is_multiple_of(2) { "a" } else { "b" };
    publish_letters_of(&confirming_channel().await, &dlq, "t", 2 * LETTERS, reason).await;

    let replay = |reason: &str| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_idem"));
        command
            .args([
                "dlq", "replay", &dlq, "--to", &target, "--reason", reason, "--json",
            ])
            .env("AMQP_URL", amqp_url());
        command
    };
    let (mut a, mut b) = (replay("a"), replay("b"));
    let (first, second) = tokio::join!(
        run_within(&mut a, Duration::from_secs(120)),
        run_within(&mut b, Duration::from_secs(120)),
    );
    let mut unfinished = Vec::new();
    for (reason, output) in [("a", &first), ("b", &second)] {
        if output.status.success() {
            let done = json(output);
            assert_eq!(
                done["moved"], LETTERS,
                "exit 0 means all of {reason}: {done}"
            );
        } else {
            let code = output.status.code();
            assert!(matches!(code, Some(4 | 5)), "{reason}: {output:?}");
            let said =
                String::from_utf8_lossy(&output.stdout) + String::from_utf8_lossy(&output.stderr);
            assert!(
                said.contains("another replay") || said.contains("could not be read"),
                "{reason} says why: {output:?}"
            );
            unfinished.push(reason);
        }
    }
    for reason in unfinished {
        let again = run_within(&mut replay(reason), Duration::from_secs(120)).await;
        assert!(again.status.success(), "{reason} again: {again:?}");
        // Run right after the other ended: what that one gave back is read too.
        let done = json(&again);
        assert_eq!(
            done["moved"], LETTERS,
            "exit 0 means all of {reason}: {done}"
        );
    }
    wait_for_depth(&broker, &dlq, 0).await;
    let mut moved = ids(&broker.drain(&target).await);
    moved.sort();
    moved.dedup();
    assert_eq!(moved.len(), 2 * LETTERS, "every letter moved");
}

/// Letters another client held when a replay counted the queue (a listing, or a replay that
/// just ended and whose returns the broker counts a moment later) and gave back while it ran
/// are moved too: a replay that exits 0 left none of its reason behind.
#[tokio::test(flavor = "multi_thread")]
async fn a_replay_moves_what_another_client_gave_back_while_it_ran() {
    const LETTERS: usize = 1_000;
    const HELD: usize = 200;
    ensure_management().await;
    let broker = TestBroker::connect().await;
    let dlq = unique("dlq_given_back");
    let target = unique("dlq_given_back_target");
    broker.declare_queue(&dlq, &[]).await;
    broker.declare_queue(&target, &[]).await;
    publish_letters_of(&confirming_channel().await, &dlq, "g", LETTERS, |_| "a").await;
    // Another client holds the first letters, unacknowledged.
    let holder = setup_channel().await;
    for _ in 0..HELD {
        let options = idem_rabbitmq::lapin::options::BasicGetOptions { no_ack: false };
        let got = holder
            .basic_get(dlq.as_str().into(), options)
            .await
            .unwrap();
        assert!(got.is_some(), "a letter to hold");
    }
    let mut replay = Command::new(env!("CARGO_BIN_EXE_idem"));
    replay
        .args(["dlq", "replay", &dlq, "--to", &target, "--json"])
        .env("AMQP_URL", amqp_url());
    let giving_back = async {
        // Once the replay counted the queue without them, the holder goes.
        tokio::time::sleep(Duration::from_millis(300)).await;
        holder.close(200, "done".into()).await.unwrap();
    };
    let (done, ()) = tokio::join!(
        run_within(&mut replay, Duration::from_secs(120)),
        giving_back
    );
    let done = json(&done);
    assert_eq!(done["moved"], LETTERS, "exit 0 means every letter: {done}");
    assert_eq!(broker.depth(&dlq).await, 0);
    assert_eq!(broker.drain(&target).await.len(), LETTERS);
}

/// A letter whose `x-idem-queue` names another queue than the replay's target is moved as asked,
/// and said: its consumer reads another queue.
#[tokio::test(flavor = "multi_thread")]
async fn a_replay_to_another_queue_than_the_letters_says_so() {
    ensure_management().await;
    let broker = TestBroker::connect().await;
    let dlq = unique("dlq_elsewhere");
    let target = unique("dlq_elsewhere_target");
    broker.declare_queue(&dlq, &[]).await;
    broker.declare_queue(&target, &[]).await;
    let options = with_id("e-1").header(idem_rabbitmq::headers::QUEUE, "billing.orders");
    broker.send_bytes(&dlq, b"{}", options).await;
    let moved = idem(None, &["dlq", "replay", &dlq, "--to", &target, "--json"]);
    assert_eq!(json(&moved)["moved"], 1, "{moved:?}");
    let said = String::from_utf8_lossy(&moved.stderr);
    assert!(said.contains("billing.orders"), "{said}");
    assert_eq!(json(&moved)["other_queue"], 1, "{moved:?}");
}

/// `idem dlq list | ...` whose reader goes away ends quietly: no panic, its usual exit code;
/// a failure with `--json` is one JSON object on standard output.
#[tokio::test(flavor = "multi_thread")]
async fn output_to_a_closed_pipe_and_failures_in_json() {
    ensure_management().await;
    let broker = TestBroker::connect().await;
    let dlq = unique("dlq_pipe");
    broker.declare_queue(&dlq, &[]).await;
    publish_letters(&confirming_channel().await, &dlq, "p", 30).await;
    let script = r#""$IDEM" dlq list "$QUEUE" --samples 30 | true; exit "${PIPESTATUS[0]}""#;
    let piped = Command::new("bash")
        .args(["-c", script])
        .env("IDEM", env!("CARGO_BIN_EXE_idem"))
        .env("QUEUE", &dlq)
        .env("AMQP_URL", amqp_url())
        .output()
        .unwrap();
    assert_eq!(piped.status.code(), Some(0), "{piped:?}");
    assert!(piped.stderr.is_empty(), "{piped:?}");
    assert_eq!(broker.depth(&dlq).await, 30);

    let failed = idem(None, &["dlq", "list", "no-such-queue-here", "--json"]);
    assert_eq!(failed.status.code(), Some(3), "{failed:?}");
    let said: Value = serde_json::from_slice(&failed.stdout).expect("JSON on stdout");
    assert!(
        said["error"]
            .as_str()
            .unwrap()
            .contains("no-such-queue-here"),
        "{said}"
    );
}
