//! `idem retention advise`: each consumer's retention, as its records say, against the
//! duplicates' ages its processes saw and the late duplicates they caught; and the retention
//! recommended.

use std::collections::BTreeMap;
use std::time::Duration;

use clap::Subcommand;
use idem_runtime::{ConsumerStats, DuplicateSummary};
use serde_json::json;

use crate::inbox::Table;
use crate::outcome::Done;
use crate::output::out;
use crate::output::{age, print_table};

use crate::outcome::Result;

/// The retention's subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum RetentionCommand {
    /// Per consumer: the retention its records were kept for, the duplicates' ages seen (99th
    /// percentile and oldest), the late duplicates caught (processed again because their record
    /// had expired or been deleted), and the retention recommended.
    Advise {
        #[command(flatten)]
        table: Table,
        /// Only this consumer.
        #[arg(long)]
        consumer: Option<String>,
    },
}

/// What the figures say of a consumer's retention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// Late duplicates were processed again.
    TooShort,
    /// The oldest duplicate came past half the retention.
    Tight,
    /// The oldest duplicate came well within it.
    Enough,
    /// No duplicate was seen: nothing to go on.
    NoDuplicates,
    /// Duplicates were seen, but no record tells the retention.
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

/// One consumer's advice.
struct Advice {
    consumer: String,
    retention: Option<Duration>,
    summary: DuplicateSummary,
    verdict: Verdict,
    recommended: Option<Duration>,
}

/// The verdict on a consumer's figures, and the retention to set when it should change: twice
/// the longer of the retention and the oldest duplicate when late duplicates came, twice the
/// oldest duplicate when it came past half the retention. Late duplicates the digest
/// recognised count only beyond what its false alarms would explain; with no retention known
/// (no completed record left), there is no recommendation.
fn advise(retention: Option<Duration>, summary: &DuplicateSummary) -> (Verdict, Option<Duration>) {
    let certain = summary.late.saturating_sub(summary.late_deleted);
    let beyond_alarms = summary.late_deleted as f64 > 2.0 * summary.expected_false_alarms + 3.0;
    let Some(retention) = retention else {
        let verdict = match (certain > 0 || beyond_alarms, summary.duplicates) {
            (true, _) => Verdict::TooShort,
            (false, 0) => Verdict::NoDuplicates,
            (false, _) => Verdict::Unknown,
        };
        return (verdict, None);
    };
    // Never below the redelivery window the processes were configured with.
    let at_least = |duration: Duration| {
        rounded_up(duration.max(summary.redelivery_window.unwrap_or_default()))
    };
    if certain > 0 || beyond_alarms {
        let longer = retention.max(summary.max_age);
        return (Verdict::TooShort, Some(at_least(longer * 2)));
    }
    if summary.duplicates == 0 {
        return (Verdict::NoDuplicates, None);
    }
    if summary.max_age * 2 >= retention {
        return (Verdict::Tight, Some(at_least(summary.max_age * 2)));
    }
    (Verdict::Enough, None)
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

/// Runs `command` on the inbox of the database at `url`.
pub(crate) async fn run(url: &str, command: RetentionCommand, json: bool) -> Result<Done> {
    let RetentionCommand::Advise { table, consumer } = command;
    let inbox = crate::inbox::open(url, &table, false).await?;
    let stats = inbox.stats(consumer.as_deref()).await?;
    let summaries = inbox.duplicate_summaries().await?;
    let advice = advice_of(&stats, summaries, consumer.as_deref());
    print(&advice, json);
    Ok(Done::Ok)
}

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
        .map(|(consumer, (retention, summary))| {
            let (verdict, recommended) = advise(retention, &summary);
            Advice {
                consumer,
                retention,
                summary,
                verdict,
                recommended,
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
                json!({
                    "consumer": a.consumer,
                    "retention_s": secs(a.retention),
                    "redelivery_window_s": secs(a.summary.redelivery_window),
                    "duplicates": a.summary.duplicates,
                    "p99_age_below_s": secs(a.summary.age_below(0.99)),
                    "max_age_s": a.summary.max_age.as_secs_f64(),
                    "late": a.summary.late,
                    "late_from_digest": a.summary.late_deleted,
                    "expected_false_alarms": a.summary.expected_false_alarms,
                    "verdict": a.verdict.label(),
                    "recommended_s": secs(a.recommended),
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
            vec![
                a.consumer.clone(),
                shown(a.retention),
                shown(a.summary.redelivery_window),
                a.summary.duplicates.to_string(),
                a.summary
                    .age_below(0.99)
                    .map_or_else(|| "-".into(), |d| format!("< {}", age(d))),
                shown((a.summary.duplicates > 0).then_some(a.summary.max_age)),
                a.summary.late.to_string(),
                a.verdict.label().to_owned(),
                shown(a.recommended),
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
        "verdict",
        "recommended",
    ];
    print_table(&header, &rows);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(duplicates: u64, max_age_secs: u64, late: u64) -> DuplicateSummary {
        let mut summary = DuplicateSummary::default();
        summary.duplicates = duplicates;
        summary.max_age = Duration::from_secs(max_age_secs);
        summary.late = late;
        summary
    }

    #[test]
    fn the_advice_follows_the_oldest_and_the_late_duplicates() {
        let day = Some(Duration::from_secs(86_400));
        let (verdict, to) = advise(day, &summary(10, 3_600, 2));
        assert_eq!(verdict, Verdict::TooShort);
        assert_eq!(to, Some(Duration::from_secs(2 * 86_400)));
        let (verdict, to) = advise(day, &summary(10, 50_000, 0));
        assert_eq!(verdict, Verdict::Tight);
        assert_eq!(to, Some(Duration::from_secs(28 * 3_600)));
        assert_eq!(advise(day, &summary(10, 600, 0)), (Verdict::Enough, None));
        assert_eq!(
            advise(day, &summary(0, 0, 0)),
            (Verdict::NoDuplicates, None)
        );
        assert_eq!(advise(None, &summary(10, 600, 0)), (Verdict::Unknown, None));
    }

    #[test]
    fn digest_hits_count_beyond_its_false_alarms() {
        let day = Some(Duration::from_secs(86_400));
        let mut alarms = summary(10, 600, 4);
        alarms.late_deleted = 4;
        alarms.expected_false_alarms = 3.0;
        let within = advise(day, &alarms).0;
        assert_eq!(within, Verdict::Enough, "within the false alarms expected");
        alarms.late = 40;
        alarms.late_deleted = 40;
        assert_eq!(advise(day, &alarms).0, Verdict::TooShort);
    }

    #[test]
    fn recommendations_are_whole_hours_or_days() {
        assert_eq!(
            rounded_up(Duration::from_secs(1)),
            Duration::from_secs(3_600)
        );
        let three_days = Duration::from_secs(3 * 86_400);
        assert_eq!(rounded_up(three_days - Duration::from_secs(5)), three_days);
    }
}
