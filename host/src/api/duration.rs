//! The one duration grammar of vmop's flags and annotations: an integer followed by `ms`, `s`,
//! `m` or `h`, a bare integer being seconds (`500ms`, `90`, `30s`, `5m`, `1h`).
//!
//! Anything else is refused with an error that says the grammar, never ignored. A duration is
//! at most [`MAX`], so arithmetic on it (jitter, deadlines, `Instant + Duration`) cannot
//! overflow whatever a user writes.

use std::time::Duration;

/// The longest duration accepted: one year.
pub const MAX: Duration = Duration::from_secs(366 * 24 * 3600);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error(
        "{0:?} is not a duration: write an integer followed by ms, s, m or h (500ms, 30s, 5m, 1h)"
    )]
    Syntax(String),
    #[error("{0:?} is longer than the longest duration accepted (366 days)")]
    TooLong(String),
    #[error("{0:?} must be longer than zero")]
    Zero(String),
}

/// Parses `text` (surrounding blanks ignored).
pub fn parse(text: &str) -> Result<Duration, DurationError> {
    let trimmed = text.trim();
    let syntax = || DurationError::Syntax(text.to_owned());
    let split = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    if number.is_empty() {
        return Err(syntax());
    }
    // Digits only, so the one failure left is a number past u64: too long either way.
    let n: u64 = number
        .parse()
        .map_err(|_| DurationError::TooLong(text.to_owned()))?;
    let millis_per_unit: u64 = match unit {
        "ms" => 1,
        "s" | "" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return Err(syntax()),
    };
    let millis = n
        .checked_mul(millis_per_unit)
        .ok_or_else(|| DurationError::TooLong(text.to_owned()))?;
    let duration = Duration::from_millis(millis);
    if duration > MAX {
        return Err(DurationError::TooLong(text.to_owned()));
    }
    Ok(duration)
}

/// [`parse`], refusing zero (a period or a timeout of zero means nothing).
pub fn parse_positive(text: &str) -> Result<Duration, DurationError> {
    match parse(text)? {
        Duration::ZERO => Err(DurationError::Zero(text.to_owned())),
        d => Ok(d),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grammar() {
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse(" 30s "), Ok(Duration::from_secs(30)));
        assert_eq!(parse("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse("0s"), Ok(Duration::ZERO));
        for bad in [
            "", "s", "ms", "1.5m", "-3s", "10d", "ten", "5 m", "1h30m", "+5s",
        ] {
            assert_eq!(
                parse(bad),
                Err(DurationError::Syntax(bad.to_owned())),
                "{bad}"
            );
        }
    }

    #[test]
    fn nothing_past_a_year_so_no_overflow_downstream() {
        assert_eq!(parse("8784h"), Ok(MAX));
        for long in [
            "8785h",
            "18446744073709551615s",
            "18446744073709551616",
            "99999999999999999999999h",
        ] {
            assert_eq!(
                parse(long),
                Err(DurationError::TooLong(long.to_owned())),
                "{long}"
            );
        }
    }

    #[test]
    fn positive_refuses_zero() {
        assert_eq!(
            parse_positive("0ms"),
            Err(DurationError::Zero("0ms".to_owned()))
        );
        assert_eq!(parse_positive("1ms"), Ok(Duration::from_millis(1)));
    }

    proptest::proptest! {
        /// Whatever is written, parsing ends in a duration within the bound or an error.
        #[test]
        fn parsing_never_panics_and_stays_bounded(
            text in proptest::prop_oneof![".{0,40}", "[0-9]{0,30}(ms|s|m|h|d)?"],
        ) {
            if let Ok(d) = parse(&text) {
                proptest::prop_assert!(d <= MAX);
            }
        }
    }
}
