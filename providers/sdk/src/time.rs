//! Timestamps as clouds write them, turned into milliseconds since the Unix epoch (what
//! `listed-machine.created-at-ms` carries).

/// Milliseconds since the Unix epoch of an RFC 3339 timestamp: `2026-11-29T21:00:00Z`, with
/// optional fractional seconds (`.000`, any number of digits, cut to milliseconds), `Z`/`z` or
/// a `±hh:mm` offset, and `T`, `t` or a space between date and time. `None` for anything else,
/// and for times before 1970 (no machine was made then).
pub fn rfc3339_ms(value: &str) -> Option<u64> {
    let value = value.trim();
    let date = value.get(..10)?;
    let separator = value.get(10..11)?;
    let rest = value.get(11..)?;
    if !matches!(separator, "T" | "t" | " ") {
        return None;
    }
    let year = fixed(date.get(..4)?)?;
    let month = fixed(date.get(5..7)?).filter(|m| (1..=12).contains(m))?;
    let day = fixed(date.get(8..10)?).filter(|d| (1..=days_in_month(year, month)).contains(d))?;
    if date.get(4..5)? != "-" || date.get(7..8)? != "-" || year < 1970 {
        return None;
    }

    let hour = fixed(rest.get(..2)?).filter(|h| *h < 24)?;
    let minute = fixed(rest.get(3..5)?).filter(|m| *m < 60)?;
    let second = fixed(rest.get(6..8)?).filter(|s| *s <= 60)?;
    if rest.get(2..3)? != ":" || rest.get(5..6)? != ":" {
        return None;
    }
    let mut rest = rest.get(8..)?;
    let mut millis = 0;
    if let Some(fraction) = rest.strip_prefix('.') {
        let digits = fraction.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let kept = fraction.get(..digits.min(3))?;
        millis = fixed(kept)? * 10u64.pow(u32::try_from(3 - kept.len()).ok()?);
        rest = fraction.get(digits..)?;
    }
    let offset_secs: i64 = match rest {
        "Z" | "z" => 0,
        _ => {
            let sign = match rest.get(..1)? {
                "+" => 1,
                "-" => -1,
                _ => return None,
            };
            let hours = fixed(rest.get(1..3)?).filter(|h| *h < 24)?;
            let minutes = fixed(rest.get(4..6)?).filter(|m| *m < 60)?;
            if rest.get(3..4)? != ":" || rest.len() != 6 {
                return None;
            }
            sign * i64::try_from(hours * 3600 + minutes * 60).ok()?
        }
    };
    let local = days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second;
    let utc = i64::try_from(local).ok()?.checked_sub(offset_secs)?;
    let utc = u64::try_from(utc).ok()?;
    utc.checked_mul(1000)?.checked_add(millis)
}

/// Days since 1970-01-01 of a Gregorian date in or after 1970 (H. Hinnant's
/// `days_from_civil`, restricted to non-negative results).
pub(crate) fn days_from_civil(year: u64, month: u64, day: u64) -> u64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year / 400;
    let yoe = year - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn days_in_month(year: u64, month: u64) -> u64 {
    match month {
        2 if year.is_multiple_of(4) && (!year.is_multiple_of(100) || year.is_multiple_of(400)) => {
            29
        }
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// A field of only ASCII digits (no sign, no spaces).
fn fixed(text: &str) -> Option<u64> {
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        text.parse().ok()
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_ec2_and_moto_write() {
        assert_eq!(rfc3339_ms("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            rfc3339_ms("2026-11-29T21:00:00.000Z"),
            Some(1_795_986_000_000)
        );
        assert_eq!(
            rfc3339_ms("2026-11-29T21:00:00.123456Z"),
            Some(1_795_986_000_123)
        );
        assert_eq!(
            rfc3339_ms("2026-11-29T21:00:00.5Z"),
            Some(1_795_986_000_500)
        );
        assert_eq!(
            rfc3339_ms("2000-02-29T00:00:00+00:00"),
            Some(951_782_400_000)
        );
    }

    #[test]
    fn offsets_are_taken_back_to_utc() {
        let utc = rfc3339_ms("2026-11-29T21:00:00Z");
        assert_eq!(rfc3339_ms("2026-11-29T22:30:00+01:30"), utc);
        assert_eq!(rfc3339_ms("2026-11-29T16:00:00-05:00"), utc);
        assert_eq!(rfc3339_ms("2026-11-29 21:00:00z"), utc);
    }

    #[test]
    fn refuses_everything_else() {
        for value in [
            "",
            "2026-11-29",
            "2026-11-29T21:00:00",
            "2026-11-29T21:00:00.Z",
            "2026-13-01T00:00:00Z",
            "2026-02-29T00:00:00Z",
            "2026-11-31T00:00:00Z",
            "2026-11-29T24:00:00Z",
            "2026-11-29T21:00:00+0100",
            "2026-11-29T21:00:00 UTC",
            "1969-12-31T23:59:59Z",
            "1970-01-01T00:00:00+00:01",
            "+2026-11-29T21:00:00Z",
            "2026/11/29T21:00:00Z",
            "2026-11-29T21:00:00Zjunk",
            "२०२६-11-29T21:00:00Z",
        ] {
            assert_eq!(rfc3339_ms(value), None, "{value}");
        }
    }
}
