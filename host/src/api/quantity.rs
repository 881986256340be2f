//! Kubernetes quantities (`4Gi`, `512Mi`, `1G`, `1.5Gi`) converted to whole MiB for the plugin
//! contract, which speaks `memory-mib: u64`.
//!
//! Exact: the value is computed in integers (no floating point), as Kubernetes itself does.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

const MIB: u128 = 1 << 20;

/// More digits than this (integer + fraction) cannot fit the `u128` arithmetic below; no
/// memory size needs them.
const MAX_DIGITS: usize = 30;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error("{0:?} is not a Kubernetes quantity (examples: 4Gi, 512Mi, 1G, 1.5Gi)")]
    Invalid(String),
    #[error("{0:?} is negative")]
    Negative(String),
    #[error("{0:?} is less than 1Mi")]
    BelowOneMib(String),
    #[error("{0:?} is too large")]
    TooLarge(String),
}

/// Converts a memory quantity to MiB, rounding **up** so that a machine never gets less memory
/// than asked for (`1G` = 10^9 bytes = 953.67 MiB → 954).
///
/// Errors: not a quantity, negative, below 1 MiB, or beyond `u64` MiB.
pub fn to_mib(quantity: &Quantity) -> Result<u64, QuantityError> {
    let text = quantity.0.trim();
    let parsed = parse(text).ok_or_else(|| QuantityError::Invalid(text.to_owned()))?;
    if parsed.negative && parsed.mantissa != 0 {
        return Err(QuantityError::Negative(text.to_owned()));
    }
    let too_large = || QuantityError::TooLarge(text.to_owned());
    // value = mantissa * 2^binary * 10^decimal, where decimal may be negative.
    let mut numerator = parsed
        .mantissa
        .checked_mul(2u128.checked_pow(parsed.binary_exp).ok_or_else(too_large)?)
        .ok_or_else(too_large)?;
    let mut denominator = MIB;
    let ten_pow = |e: i64| 10u128.checked_pow(u32::try_from(e.unsigned_abs()).ok()?);
    if parsed.decimal_exp >= 0 {
        numerator = numerator
            .checked_mul(ten_pow(parsed.decimal_exp).ok_or_else(too_large)?)
            .ok_or_else(too_large)?;
    } else {
        denominator = ten_pow(parsed.decimal_exp)
            .and_then(|d| d.checked_mul(MIB))
            .ok_or_else(|| QuantityError::BelowOneMib(text.to_owned()))?;
    }
    let mib = numerator.div_ceil(denominator);
    if numerator < denominator {
        return Err(QuantityError::BelowOneMib(text.to_owned()));
    }
    u64::try_from(mib).map_err(|_| too_large())
}

#[derive(Debug, PartialEq, Eq)]
struct Parsed {
    negative: bool,
    /// All digits of the number with the decimal point removed.
    mantissa: u128,
    binary_exp: u32,
    /// Power of ten, already including the fraction's digit count (negative).
    decimal_exp: i64,
}

/// `<sign>?<digits>(.<digits>)?<suffix>` with the suffixes of `resource.Quantity`.
fn parse(text: &str) -> Option<Parsed> {
    let (negative, rest) = match text.as_bytes().first()? {
        b'-' => (true, text.get(1..)?),
        b'+' => (false, text.get(1..)?),
        _ => (false, text),
    };
    let number_len = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    let (number, suffix) = rest.split_at(number_len);
    let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
    if int_part.is_empty() && frac_part.is_empty() {
        return None;
    }
    if frac_part.contains('.') || int_part.len() + frac_part.len() > MAX_DIGITS {
        return None;
    }
    let mut mantissa: u128 = 0;
    for digit in int_part.bytes().chain(frac_part.bytes()) {
        mantissa = mantissa * 10 + u128::from(digit - b'0');
    }
    let frac_digits = i64::try_from(frac_part.len()).ok()?;
    let (binary_exp, suffix_exp) = suffix_exponents(suffix)?;
    Some(Parsed {
        negative,
        mantissa,
        binary_exp,
        decimal_exp: suffix_exp - frac_digits,
    })
}

/// `(power of two, power of ten)` of a suffix: binary SI, decimal SI or a decimal exponent.
fn suffix_exponents(suffix: &str) -> Option<(u32, i64)> {
    let known = match suffix {
        "" => (0, 0),
        "Ki" => (10, 0),
        "Mi" => (20, 0),
        "Gi" => (30, 0),
        "Ti" => (40, 0),
        "Pi" => (50, 0),
        "Ei" => (60, 0),
        "n" => (0, -9),
        "u" => (0, -6),
        "m" => (0, -3),
        "k" => (0, 3),
        "M" => (0, 6),
        "G" => (0, 9),
        "T" => (0, 12),
        "P" => (0, 15),
        "E" => (0, 18),
        _ => return decimal_exponent(suffix).map(|e| (0, e)),
    };
    Some(known)
}

/// `e<signed integer>` or `E<signed integer>`.
fn decimal_exponent(suffix: &str) -> Option<i64> {
    let digits = suffix.strip_prefix(['e', 'E'])?;
    let (sign, digits) = match digits.as_bytes().first()? {
        b'-' => (-1, digits.get(1..)?),
        b'+' => (1, digits.get(1..)?),
        _ => (1, digits),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let value: u32 = digits.parse().ok()?;
    Some(sign * i64::from(value))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mib(s: &str) -> Result<u64, QuantityError> {
        to_mib(&Quantity(s.to_owned()))
    }

    #[test]
    fn binary_suffixes() {
        assert_eq!(mib("4Gi"), Ok(4096));
        assert_eq!(mib("512Mi"), Ok(512));
        assert_eq!(mib("1Ti"), Ok(1 << 20));
        assert_eq!(mib("2048Ki"), Ok(2));
    }

    #[test]
    fn fractions_are_exact() {
        assert_eq!(mib("1.5Gi"), Ok(1536));
        assert_eq!(mib("0.5Gi"), Ok(512));
        assert_eq!(mib(".25Gi"), Ok(256));
    }

    #[test]
    fn decimal_suffixes_round_up() {
        // 10^9 bytes = 953.674 MiB.
        assert_eq!(mib("1G"), Ok(954));
        assert_eq!(mib("1e9"), Ok(954));
        assert_eq!(mib("1048576"), Ok(1));
        assert_eq!(mib("1048577"), Ok(2));
        assert_eq!(mib("+2Gi"), Ok(2048));
    }

    #[test]
    fn invalid_inputs_are_errors() {
        for bad in [
            "", "Gi", "4GB", "4 Gi", "1.2.3Gi", "abc", "4gi", "1e", "1e+", "--1Gi",
        ] {
            assert_eq!(
                mib(bad),
                Err(QuantityError::Invalid(bad.trim().to_owned())),
                "{bad}"
            );
        }
    }

    #[test]
    fn out_of_range_inputs_are_errors() {
        assert_eq!(mib("-1Gi"), Err(QuantityError::Negative("-1Gi".into())));
        assert_eq!(mib("0"), Err(QuantityError::BelowOneMib("0".into())));
        assert_eq!(mib("1Ki"), Err(QuantityError::BelowOneMib("1Ki".into())));
        assert_eq!(mib("500m"), Err(QuantityError::BelowOneMib("500m".into())));
        assert_eq!(
            mib("1e-30"),
            Err(QuantityError::BelowOneMib("1e-30".into()))
        );
        assert!(matches!(
            mib("99999999999999999999Ei"),
            Err(QuantityError::TooLarge(_))
        ));
        assert!(matches!(mib("1e40"), Err(QuantityError::TooLarge(_))));
    }
}
