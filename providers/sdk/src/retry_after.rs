//! The HTTP `Retry-After` header (RFC 9110 §10.2.3): delta-seconds or an HTTP-date.
//!
//! Delays are capped at [`MAX_RETRY_AFTER`], the contract's bound, so a hostile or buggy
//! server cannot park a VM for years. A date is turned into a delay against the plugin's
//! clock: a skewed clock gives a wrong delay, but one within 0..=1 h, which beats ignoring
//! the server. Only the IMF-fixdate form is read (the one RFC 9110 requires senders to
//! produce); the obsolete RFC 850 and asctime forms give `None`, as does anything else, and
//! callers fall back to a default.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::time::days_from_civil;

/// The longest delay a plugin may ask for (`rate-limit.retry-after-ms`), the contract's.
pub use crate::bounds::MAX_RETRY_AFTER;

const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

/// The delay `value` asks for, measured from now.
pub fn parse(value: &str) -> Option<Duration> {
    parse_at(value, SystemTime::now())
}

/// The delay `value` asks for, measured from `now`; a date in the past is no delay.
pub fn parse_at(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    let delay = if value.bytes().all(|b| b.is_ascii_digit()) && !value.is_empty() {
        Duration::from_secs(value.parse::<u64>().unwrap_or(u64::MAX))
    } else {
        let date = UNIX_EPOCH.checked_add(Duration::from_secs(imf_fixdate(value)?))?;
        date.duration_since(now).unwrap_or(Duration::ZERO)
    };
    Some(delay.min(MAX_RETRY_AFTER))
}

/// Seconds since the Unix epoch of `Sun, 06 Nov 1994 08:49:37 GMT`.
fn imf_fixdate(value: &str) -> Option<u64> {
    let mut parts = value.split(' ');
    let weekday = parts.next()?;
    let day = parts.next()?;
    let month = parts.next()?;
    let year = parts.next()?;
    let time = parts.next()?;
    if parts.next()? != "GMT" || parts.next().is_some() {
        return None;
    }
    if weekday.len() != 4 || !weekday.ends_with(',') || day.len() != 2 || year.len() != 4 {
        return None;
    }
    let day = digits(day).filter(|d| (1..=31).contains(d))?;
    let month = MONTHS.iter().position(|m| *m == month)?;
    let year = digits(year).filter(|y| *y >= 1970)?;
    let mut hms = time.split(':');
    let (h, m, s) = (hms.next()?, hms.next()?, hms.next()?);
    if hms.next().is_some() || [h, m, s].iter().any(|p| p.len() != 2) {
        return None;
    }
    let hour = digits(h).filter(|h| *h < 24)?;
    let minute = digits(m).filter(|m| *m < 60)?;
    let second = digits(s).filter(|s| *s <= 60)?;
    let month = u64::try_from(month).ok()? + 1;
    let days = days_from_civil(year, month, day);
    Some(days * 86_400 + hour * 3600 + minute * 60 + second)
}

fn digits(text: &str) -> Option<u64> {
    if text.bytes().all(|b| b.is_ascii_digit()) {
        text.parse().ok()
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 1994-11-06T08:49:37Z, the example date of RFC 9110.
    const RFC_EXAMPLE: u64 = 784_111_777;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn reads_delta_seconds_capped_at_an_hour() {
        let now = at(0);
        assert_eq!(parse_at("7", now), Some(Duration::from_secs(7)));
        assert_eq!(parse_at(" 0 ", now), Some(Duration::ZERO));
        assert_eq!(
            parse_at("99999999999999999999999", now),
            Some(MAX_RETRY_AFTER)
        );
        assert_eq!(parse_at("-3", now), None);
        assert_eq!(parse_at("", now), None);
        assert_eq!(parse_at("1.5", now), None);
    }

    #[test]
    fn reads_imf_fixdates_against_now() {
        assert_eq!(
            imf_fixdate("Sun, 06 Nov 1994 08:49:37 GMT"),
            Some(RFC_EXAMPLE)
        );
        assert_eq!(imf_fixdate("Thu, 01 Jan 1970 00:00:00 GMT"), Some(0));
        assert_eq!(
            imf_fixdate("Tue, 29 Feb 2000 00:00:00 GMT"),
            Some(951_782_400)
        );
        let date = "Sun, 06 Nov 1994 08:49:37 GMT";
        assert_eq!(
            parse_at(date, at(RFC_EXAMPLE - 90)),
            Some(Duration::from_secs(90))
        );
        assert_eq!(parse_at(date, at(RFC_EXAMPLE + 5)), Some(Duration::ZERO));
        assert_eq!(parse_at(date, at(0)), Some(MAX_RETRY_AFTER));
    }

    #[test]
    fn refuses_other_date_forms_and_garbage() {
        for value in [
            "Sunday, 06-Nov-94 08:49:37 GMT",
            "Sun Nov  6 08:49:37 1994",
            "Sun, 06 Nov 1994 08:49:37 UTC",
            "Sun, 06 Nov 1994 08:49:37 GMT extra",
            "Sun, 6 Nov 1994 08:49:37 GMT",
            "Sun, 06 Foo 1994 08:49:37 GMT",
            "Sun, 06 Nov 1994 24:00:00 GMT",
            "Sun, 06 Nov 1969 08:49:37 GMT",
            "Sun, 32 Nov 1994 08:49:37 GMT",
            "soon",
        ] {
            assert_eq!(parse_at(value, at(0)), None, "{value}");
        }
    }
}
