//! Durations as operators type them: a number and a unit.

use std::time::Duration;

/// `90s`, `30m`, `24h`, `7d`; zero is refused.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let refused = || format!("{text:?}: a number and s, m, h or d (`24h`, `7d`)");
    let unit = text.chars().last().ok_or_else(refused)?;
    let unit_secs = match unit {
        's' => 1,
        'm' => 60,
        'h' => 3600,
        'd' => 86_400,
        _ => return Err(refused()),
    };
    let number: u64 = text[..text.len() - unit.len_utf8()]
        .parse()
        .map_err(|_| refused())?;
    if number == 0 {
        return Err(format!("{text:?}: a duration of zero"));
    }
    let secs = number.checked_mul(unit_secs).ok_or_else(refused)?;
    Ok(Duration::from_secs(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_a_unit() {
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
        for refused in ["7", "0h", "h", "", "7é", "-1d", "7w", "7 d"] {
            assert!(parse_duration(refused).is_err(), "{refused:?}");
        }
    }
}
