//! `idem retention advise`: each consumer's retention, as its records say, against the
//! duplicates' ages its processes saw and the late duplicates they caught; and the retention
//! recommended.

use std::collections::BTreeMap;
use std::time::Duration;

use clap::Subcommand;
use idem_runtime::admin::ConsumerStats;
use idem_runtime::admin::DuplicateSummary;
use idem_runtime::admin::InboxAdmin;
use serde_json::json;

use crate::inbox::Table;
use crate::outcome::Done;
use crate::output::out;
use crate::output::{age, print_table};

use crate::outcome::Result;

/// The retention's subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum RetentionCommand {
    /// Per consumer: the retention it runs with, the duplicates' ages seen (99th percentile and
    /// oldest), the late duplicates caught (processed again because their record had expired or
    /// been deleted) and the oldest of them, and the retention recommended. Reads only.
    Advise {
        #[command(flatten)]
        table: Table,
        /// Only this consumer.
        #[arg(long)]
        consumer: Option<String>,
        /// Only what was seen over this last while, by whole days (`7d`: the last seven days
        /// and today; `90s`, `30m`, `24h` as well); everything kept (90 days) without it.
        #[arg(long, value_parser = crate::duration::parse_duration)]
        since: Option<Duration>,
    },
}

/// What the figures say of a consumer's retention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// Late duplicates older than the retention were processed again.
    TooShort,
    /// The oldest duplicate, late ones the retention now covers included, came past half the
    /// retention.
    Tight,
    /// The oldest duplicate came well within it.
    Enough,
    /// No duplicate was seen: nothing to go on.
    NoDuplicates,
    /// Duplicates were seen, but nothing tells the retention.
    Unknown,
}

impl Verdict {
    fn label(self) -> &'static str {
        match self {
            Verdict::TooShort => "too-short",
            Verdict::Tight => "tight",
            Verdict::Enough => "enough",
            Verdict::NoDuplicates => "no-duplicates",
            Verdict::Unknown => "retention-unknown",
        }
    }
}

/// Where the retention judged against comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// What the consumer's processes last claimed with.
    Processes,
    /// The longest its completed records were kept for.
    Records,
}

/// Digest hits this unlikely (or less) to be false alarms alone count as late duplicates.
const SIGNIFICANCE: f64 = 0.01;

/// What the figures say, and the retention to set when it should change.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Assessment {
    verdict: Verdict,
    recommended: Option<Duration>,
    /// The oldest late duplicate counted (its age known, or at least known), if any.
    late_max_age: Option<Duration>,
    /// The share of the digest's hits expected to be false alarms.
    digest_false_share: Option<f64>,
}

/// The verdict on a consumer's figures against its `retention`. Late duplicates count when
/// their record had expired, and the digest's hits when its false alarms, as the pieces it read
/// expected them, are unlikely to explain them (below [`SIGNIFICANCE`]). They make the
/// retention too short when the oldest of them is as old as the retention or older: a
/// retention applied since that covers them leaves them as the oldest duplicates seen, which
/// make the retention tight when past half of it. The recommendation is twice the oldest
/// duplicate (late ones counted), never below the redelivery window.
fn advise(retention: Option<Duration>, summary: &DuplicateSummary) -> Assessment {
    let late_deleted = summary.late_deleted;
    let digest_real = late_deleted > 0
        && poisson_tail(late_deleted, summary.expected_false_alarms) < SIGNIFICANCE;
    let expired = (summary.late_expired() > 0)
        .then_some(summary.late_expired_max_age)
        .flatten();
    let recognised = digest_real
        .then_some(summary.late_deleted_max_age)
        .flatten();
    let late_max_age = expired.max(recognised);
    let real_late = summary.late_expired() > 0 || digest_real;
    let digest_false_share =
        (late_deleted > 0).then(|| (summary.expected_false_alarms / late_deleted as f64).min(1.0));
    let seen = (summary.duplicates > 0).then_some(summary.max_age);
    let oldest = seen.max(late_max_age);
    let at_least = |duration: Duration| {
        rounded_up(duration.max(summary.redelivery_window.unwrap_or_default()))
    };
    let assess = |verdict, recommended| Assessment {
        verdict,
        recommended,
        late_max_age,
        digest_false_share,
    };
    let covered = match (retention, late_max_age) {
        (Some(retention), Some(late)) => late < retention,
        (Some(_), None) => true,
        (None, _) => false,
    };
    if real_late && !covered {
        return assess(Verdict::TooShort, oldest.map(|oldest| at_least(oldest * 2)));
    }
    let Some(oldest) = oldest else {
        return assess(Verdict::NoDuplicates, None);
    };
    let Some(retention) = retention else {
        return assess(Verdict::Unknown, None);
    };
    if oldest * 2 > retention {
        return assess(Verdict::Tight, Some(at_least(oldest * 2)));
    }
    assess(Verdict::Enough, None)
}

/// The probability that a Poisson count of mean `mean` reaches `count`.
fn poisson_tail(count: u64, mean: f64) -> f64 {
    if count == 0 {
        return 1.0;
    }
    if mean <= 0.0 {
        return 0.0;
    }
    if count as f64 <= mean {
        return 1.0; // about a half or more: never significant
    }
    // The first term, e^-mean mean^count / count!, in logarithms; the next ones shrink.
    let log_factorial: f64 = (1..=count).map(|k| (k as f64).ln()).sum();
    let mut term = (count as f64 * mean.ln() - mean - log_factorial).exp();
    let mut tail = 0.0;
    let mut k = count;
    while term > tail * 1e-16 && term > 0.0 {
        tail += term;
        k += 1;
        term *= mean / k as f64;
    }
    tail
}

/// Whole hours below two days, whole days above.
fn rounded_up(duration: Duration) -> Duration {
    let unit = if duration < Duration::from_secs(2 * 86_400) {
        3_600
    } else {
        86_400
    };
    Duration::from_secs(duration.as_secs().div_ceil(unit).max(1) * unit)
}

/// One consumer's advice.
struct Advice {
    consumer: String,
    retention: Option<(Duration, Source)>,
    summary: DuplicateSummary,
    assessment: Assessment,
}

/// Runs `command` on the inbox of the database at `url`.
pub(crate) async fn run(url: &str, command: RetentionCommand, json: bool) -> Result<Done> {
    let RetentionCommand::Advise {
        table,
        consumer,
        since,
    } = command;
    let inbox = crate::inbox::open(url, &table, false).await?;
    let stats = inbox.stats(consumer.as_deref()).await?;
    let summaries = match since {
        Some(since) => inbox.duplicate_summaries_since(since).await?,
        None => inbox.duplicate_summaries().await?,
    };
    let advice = advice_of(&stats, summaries, consumer.as_deref());
    print(&advice, json);
    Ok(Done::Ok)
}

/// The inbox of the database at `url`, opened to read only: nothing created, no probe
/// record written, so that credentials that cannot write do.
fn advice_of(
    stats: &[ConsumerStats],
    summaries: Vec<DuplicateSummary>,
    only: Option<&str>,
) -> Vec<Advice> {
    let mut by_consumer: BTreeMap<String, (Option<Duration>, DuplicateSummary)> = BTreeMap::new();
    for stats in stats {
        let empty = DuplicateSummary::default();
        by_consumer.insert(stats.consumer.clone(), (stats.retention, empty));
    }
    for summary in summaries {
        if only.is_some_and(|only| only != summary.consumer) {
            continue;
        }
        let consumer = summary.consumer.clone();
        by_consumer.entry(consumer).or_default().1 = summary;
    }
    by_consumer
        .into_iter()
        .map(|(consumer, (records, summary))| {
            // What the processes run with now, else what the records were kept for.
            let retention = (summary.retention.map(|r| (r, Source::Processes)))
                .or(records.map(|r| (r, Source::Records)));
            let assessment = advise(retention.map(|(r, _)| r), &summary);
            Advice {
                consumer,
                retention,
                summary,
                assessment,
            }
        })
        .collect()
}

fn print(advice: &[Advice], json: bool) {
    let secs = |duration: Option<Duration>| duration.map(|d| d.as_secs_f64());
    if json {
        let all: Vec<_> = advice
            .iter()
            .map(|a| {
                let s = &a.summary;
                json!({
                    "consumer": a.consumer,
                    "retention_s": secs(a.retention.map(|(r, _)| r)),
                    "retention_source": a.retention.map(|(_, source)| match source {
                        Source::Processes => "processes",
                        Source::Records => "records",
                    }),
                    "redelivery_window_s": secs(s.redelivery_window),
                    "duplicates": s.duplicates,
                    "p99_age_below_s": secs(s.age_below(0.99)),
                    "max_age_s": s.max_age.as_secs_f64(),
                    "late": s.late,
                    "late_expired": s.late_expired(),
                    "late_expired_max_age_s": secs(s.late_expired_max_age),
                    "late_from_digest": s.late_deleted,
                    "late_from_digest_max_age_s": secs(s.late_deleted_max_age),
                    "expected_false_alarms": s.expected_false_alarms,
                    "digest_false_share": a.assessment.digest_false_share,
                    "late_max_age_s": secs(a.assessment.late_max_age),
                    "verdict": a.assessment.verdict.label(),
                    "recommended_s": secs(a.assessment.recommended),
                })
            })
            .collect();
        out!("{}", serde_json::Value::Array(all));
        return;
    }
    let shown = |duration: Option<Duration>| duration.map_or_else(|| "-".into(), age);
    let rows: Vec<Vec<String>> = advice
        .iter()
        .map(|a| {
            let s = &a.summary;
            vec![
                a.consumer.clone(),
                shown(a.retention.map(|(r, _)| r)),
                shown(s.redelivery_window),
                s.duplicates.to_string(),
                (s.age_below(0.99)).map_or_else(|| "-".into(), |d| format!("< {}", age(d))),
                shown((s.duplicates > 0).then_some(s.max_age)),
                late_cell(a),
                late_age_cell(a),
                a.assessment.verdict.label().to_owned(),
                shown(a.assessment.recommended),
            ]
        })
        .collect();
    let header = [
        "consumer",
        "retention",
        "window",
        "duplicates",
        "99% aged",
        "oldest",
        "late",
        "oldest late",
        "verdict",
        "recommended",
    ];
    print_table(&header, &rows);
}

/// `3`, or `3 (digest 2, ~0% false)`: the late duplicates, those the digest caught, and the
/// share of these its false alarms would explain.
fn late_cell(advice: &Advice) -> String {
    let s = &advice.summary;
    match advice.assessment.digest_false_share {
        Some(share) => format!(
            "{} (digest {}, ~{:.0}% false)",
            s.late,
            s.late_deleted,
            share * 100.0
        ),
        None => s.late.to_string(),
    }
}

/// The oldest late duplicate counted: `30d`, or `≥ 8d` when the digest tells a bound.
fn late_age_cell(advice: &Advice) -> String {
    let s = &advice.summary;
    match advice.assessment.late_max_age {
        None => "-".into(),
        Some(oldest) if Some(oldest) == s.late_expired_max_age => age(oldest),
        Some(oldest) => format!(">= {}", age(oldest)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: u64 = 86_400;

    fn days(n: u64) -> Duration {
        Duration::from_secs(n * DAY)
    }

    fn summary(duplicates: u64, max_age_secs: u64) -> DuplicateSummary {
        let mut summary = DuplicateSummary::default();
        summary.duplicates = duplicates;
        summary.max_age = Duration::from_secs(max_age_secs);
        summary
    }

    /// `late` copies whose record had expired, the oldest `age` old.
    fn expired_late(mut summary: DuplicateSummary, late: u64, age: Duration) -> DuplicateSummary {
        summary.late += late;
        summary.late_expired_max_age = Some(age);
        summary
    }

    /// `late` copies the digest caught, the oldest at least `age` old, `expected` false alarms
    /// expected.
    fn digest_late(
        mut summary: DuplicateSummary,
        late: u64,
        age: Duration,
        expected: f64,
    ) -> DuplicateSummary {
        summary.late += late;
        summary.late_deleted += late;
        summary.late_deleted_max_age = Some(age);
        summary.expected_false_alarms = expected;
        summary
    }

    #[test]
    fn the_advice_follows_the_oldest_duplicates() {
        let day = Some(days(1));
        let tight = advise(day, &summary(10, 50_000));
        assert_eq!(tight.verdict, Verdict::Tight);
        assert_eq!(tight.recommended, Some(Duration::from_secs(28 * 3_600)));
        let enough = advise(day, &summary(10, 600));
        assert_eq!(
            (enough.verdict, enough.recommended),
            (Verdict::Enough, None)
        );
        assert_eq!(advise(day, &summary(0, 0)).verdict, Verdict::NoDuplicates);
        assert_eq!(advise(None, &summary(10, 600)).verdict, Verdict::Unknown);
    }

    /// A copy 30 days after its message under a retention of 7 days: twice those 30 days are
    /// recommended; with them applied, the same copy makes the retention neither too short nor
    /// tight, nor does the recommendation grow.
    #[test]
    fn the_recommendation_covers_the_oldest_late_copy_and_holds_once_applied() {
        let seen = expired_late(summary(0, 0), 1, days(30));
        let before = advise(Some(days(7)), &seen);
        assert_eq!(before.verdict, Verdict::TooShort);
        assert_eq!(before.recommended, Some(days(60)));
        assert_eq!(before.late_max_age, Some(days(30)));
        let applied = advise(before.recommended, &seen);
        assert_eq!(
            (applied.verdict, applied.recommended),
            (Verdict::Enough, None)
        );
        // Without a known retention, the copies still say how long to keep records.
        let unknown = advise(None, &seen);
        assert_eq!(
            (unknown.verdict, unknown.recommended),
            (Verdict::TooShort, Some(days(60)))
        );
    }

    /// Three copies against a digest expected to err 0.001 times in all: real, too short,
    /// and the recommendation covers the age the digest tells.
    #[test]
    fn a_few_digest_hits_count_when_false_alarms_cannot_explain_them() {
        let three = digest_late(summary(0, 0), 3, days(8), 0.001);
        let advice = advise(Some(days(7)), &three);
        assert_eq!(advice.verdict, Verdict::TooShort);
        assert_eq!(advice.recommended, Some(days(16)));
        let share = advice.digest_false_share.unwrap();
        assert!(share < 0.001, "{share}");
    }

    #[test]
    fn digest_hits_false_alarms_explain_are_reported_not_counted() {
        let alarms = digest_late(summary(10, 600), 4, days(8), 3.0);
        let advice = advise(Some(days(1)), &alarms);
        assert_eq!(
            advice.verdict,
            Verdict::Enough,
            "within the false alarms expected"
        );
        assert_eq!(advice.digest_false_share, Some(0.75));
        assert_eq!(advice.late_max_age, None);
        let many = digest_late(summary(10, 600), 40, days(8), 3.0);
        assert_eq!(advise(Some(days(1)), &many).verdict, Verdict::TooShort);
    }

    #[test]
    fn the_poisson_tail_is_what_it_should_be() {
        let close = |a: f64, b: f64| (a - b).abs() <= b * 1e-9;
        assert!(close(poisson_tail(1, 0.001), 1.0 - (-0.001f64).exp()));
        assert!(close(poisson_tail(3, 0.001), 1.665_417_166_527_8e-10));
        assert!(close(poisson_tail(4, 1.0), 0.018_988_156_876_153_8));
        assert_eq!(poisson_tail(2, 0.0), 0.0);
        assert_eq!(poisson_tail(0, 5.0), 1.0);
        assert_eq!(poisson_tail(3, 3.0), 1.0);
    }

    #[test]
    fn recommendations_are_whole_hours_or_days() {
        assert_eq!(
            rounded_up(Duration::from_secs(1)),
            Duration::from_secs(3_600)
        );
        let three_days = days(3);
        assert_eq!(rounded_up(three_days - Duration::from_secs(5)), three_days);
    }
}
