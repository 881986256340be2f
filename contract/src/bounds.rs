//! The output bounds of `wit/provider.wit`, checked on everything a plugin returns before the
//! host uses any of it.
//!
//! # Guarantees
//!
//! - A plugin answer over a bound never reaches status, Events, logs or metrics: the call fails
//!   with the host's `CallError::ContractViolation` (a plugin fault) naming the field and the
//!   bound, not the content (tests: `bounds::tests`, and `tests/tests/sandbox/contract.rs`
//!   `oversized_outputs_are_contract_violations` on the hostile guest).
//! - A `retry-after` longer than [`MAX_RETRY_AFTER`] is a violation too, so a plugin cannot park
//!   a VM for years.

use std::time::Duration;

use crate::types::{Page, PluginInfo, ProviderError, VmStatus};

// The one table of the bounds, for the host (which checks answers against it) and the provider
// SDK (which keeps answers within it). `wit/provider.wit` states the same numbers in its
// "# Bounds" table, and the Python helper package (`providers/python/vmop_provider/bounds.py`)
// repeats them: `tests/wit_bounds.rs` fails when either differs from these constants.

/// `vm-status.id`, in bytes; never empty.
pub const MAX_ID: usize = 256;
/// `vm-status.owner`, in bytes; never empty when present.
pub const MAX_OWNER: usize = 256;
/// Entries of `vm-status.addresses`.
pub const MAX_ADDRESSES: usize = 16;
/// One entry of `vm-status.addresses`, in bytes.
pub const MAX_ADDRESS: usize = 256;
/// `vm-status.message`, every error message and each parameter's description, in bytes.
pub const MAX_MESSAGE: usize = 1024;
/// `rate-limit.retry-after-ms`: one hour.
pub const MAX_RETRY_AFTER_MS: u64 = 3_600_000;
/// [`MAX_RETRY_AFTER_MS`] as a duration.
pub const MAX_RETRY_AFTER: Duration = Duration::from_millis(MAX_RETRY_AFTER_MS);
/// `location(..)`, in bytes; never empty.
pub const MAX_LOCATION: usize = 512;
/// `plugin-info` name, version and wit-version, each capability and each parameter's name, in
/// bytes; the two names are never empty.
pub const MAX_INFO_FIELD: usize = 64;
/// Entries of `plugin-info.capabilities`.
pub const MAX_CAPABILITIES: usize = 32;
/// Entries of `plugin-info.parameters`.
pub const MAX_PARAMETERS: usize = 64;
/// Entries of one `list` page (EC2's largest DescribeInstances page).
pub const MAX_PAGE_MACHINES: usize = 1000;
/// `page.next`, in bytes; never empty when present (EC2's NextToken runs to about 1,500).
pub const MAX_CURSOR: usize = 4096;
/// `listed-machine.cluster`, in bytes; never empty when present.
pub const MAX_CLUSTER: usize = 256;

/// Which bound a plugin answer broke.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Violation {
    #[error("{field} is {len} bytes, over the bound of {max}")]
    TooLong {
        field: &'static str,
        len: usize,
        max: usize,
    },
    #[error("{field} is empty")]
    Empty { field: &'static str },
    #[error("{field} has {count} entries, over the bound of {max}")]
    TooMany {
        field: &'static str,
        count: usize,
        max: usize,
    },
    #[error("retry-after of {0:?} is over the bound of {max:?}", max = MAX_RETRY_AFTER)]
    RetryAfter(Duration),
}

fn length(field: &'static str, value: &str, max: usize) -> Result<(), Violation> {
    if value.len() > max {
        return Err(Violation::TooLong {
            field,
            len: value.len(),
            max,
        });
    }
    Ok(())
}

fn non_empty(field: &'static str, value: &str, max: usize) -> Result<(), Violation> {
    if value.is_empty() {
        return Err(Violation::Empty { field });
    }
    length(field, value, max)
}

fn count<T>(field: &'static str, items: &[T], max: usize) -> Result<(), Violation> {
    if items.len() > max {
        return Err(Violation::TooMany {
            field,
            count: items.len(),
            max,
        });
    }
    Ok(())
}

pub fn status(s: &VmStatus) -> Result<(), Violation> {
    non_empty("vm-status.id", &s.id, MAX_ID)?;
    count("vm-status.addresses", &s.addresses, MAX_ADDRESSES)?;
    for a in &s.addresses {
        length("vm-status.addresses[]", a, MAX_ADDRESS)?;
    }
    if let Some(m) = &s.message {
        length("vm-status.message", m, MAX_MESSAGE)?;
    }
    if let Some(o) = &s.owner {
        non_empty("vm-status.owner", o, MAX_OWNER)?;
    }
    Ok(())
}

pub fn error(e: &ProviderError) -> Result<(), Violation> {
    match e {
        ProviderError::RateLimited {
            retry_after,
            message,
        } => {
            if *retry_after > MAX_RETRY_AFTER {
                return Err(Violation::RetryAfter(*retry_after));
            }
            length("rate-limit.message", message, MAX_MESSAGE)
        }
        ProviderError::Transient(m)
        | ProviderError::Permanent(m)
        | ProviderError::InvalidSpec(m)
        | ProviderError::Unauthorized(m) => length("provider-error message", m, MAX_MESSAGE),
    }
}

/// A call's result: the answer, or the provider's error.
pub fn result<T>(
    r: &Result<T, ProviderError>,
    ok: impl FnOnce(&T) -> Result<(), Violation>,
) -> Result<(), Violation> {
    match r {
        Ok(v) => ok(v),
        Err(e) => error(e),
    }
}

/// A `list` page: at most [`MAX_PAGE_MACHINES`] machines, each a bounded status.
pub fn page(p: &Page) -> Result<(), Violation> {
    count("page.machines", &p.machines, MAX_PAGE_MACHINES)?;
    for m in &p.machines {
        status(&m.status)?;
        if let Some(c) = &m.cluster {
            non_empty("listed-machine.cluster", c, MAX_CLUSTER)?;
        }
    }
    if let Some(next) = &p.next {
        non_empty("page.next", next, MAX_CURSOR)?;
    }
    Ok(())
}

pub fn location(l: &str) -> Result<(), Violation> {
    non_empty("location", l, MAX_LOCATION)
}

pub fn info(i: &PluginInfo) -> Result<(), Violation> {
    non_empty("plugin-info.name", &i.name, MAX_INFO_FIELD)?;
    length("plugin-info.version", &i.version, MAX_INFO_FIELD)?;
    length("plugin-info.wit-version", &i.wit_version, MAX_INFO_FIELD)?;
    count(
        "plugin-info.capabilities",
        &i.capabilities,
        MAX_CAPABILITIES,
    )?;
    for c in &i.capabilities {
        length("plugin-info.capabilities[]", c, MAX_INFO_FIELD)?;
    }
    count("plugin-info.parameters", &i.parameters, MAX_PARAMETERS)?;
    for p in &i.parameters {
        non_empty("plugin-info.parameters[].name", &p.name, MAX_INFO_FIELD)?;
        length(
            "plugin-info.parameters[].description",
            &p.description,
            MAX_MESSAGE,
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Phase;

    fn vm(id: &str) -> VmStatus {
        VmStatus {
            id: id.into(),
            phase: Phase::Running,
            addresses: vec!["10.0.0.1".into()],
            message: None,
            owner: None,
        }
    }

    #[test]
    fn statuses_within_bounds_pass_and_others_name_the_field() {
        assert_eq!(status(&vm("i-1")), Ok(()));
        assert_eq!(
            status(&vm("")),
            Err(Violation::Empty {
                field: "vm-status.id"
            })
        );
        let long = "x".repeat(MAX_ID + 1);
        assert!(
            matches!(status(&vm(&long)), Err(Violation::TooLong { field: "vm-status.id", len, .. }) if len == MAX_ID + 1)
        );
        let mut many = vm("i-1");
        many.addresses = vec!["a".into(); MAX_ADDRESSES + 1];
        assert!(matches!(status(&many), Err(Violation::TooMany { .. })));
        let mut chatty = vm("i-1");
        chatty.message = Some("m".repeat(MAX_MESSAGE + 1));
        assert!(status(&chatty).is_err());
        let mut owned = vm("i-1");
        owned.owner = Some("u".repeat(MAX_OWNER + 1));
        assert!(matches!(
            status(&owned),
            Err(Violation::TooLong {
                field: "vm-status.owner",
                ..
            })
        ));
        owned.owner = Some(String::new());
        assert!(matches!(status(&owned), Err(Violation::Empty { .. })));
        owned.owner = Some("u-1".into());
        assert_eq!(status(&owned), Ok(()));
    }

    #[test]
    fn errors_bound_messages_and_retry_after() {
        let slow = ProviderError::RateLimited {
            retry_after: Duration::from_millis(u64::MAX),
            message: "slow".into(),
        };
        assert!(matches!(error(&slow), Err(Violation::RetryAfter(_))));
        let ok = ProviderError::RateLimited {
            retry_after: MAX_RETRY_AFTER,
            message: "slow".into(),
        };
        assert_eq!(error(&ok), Ok(()));
        let huge = ProviderError::Transient("e".repeat(2 << 20));
        let violation = error(&huge).unwrap_err();
        assert!(
            violation.to_string().len() < 100,
            "the violation must not quote the content"
        );
    }

    #[test]
    fn location_must_be_present_and_short() {
        assert_eq!(location("aws:1:us-east-1"), Ok(()));
        assert!(location("").is_err());
        assert!(location(&"l".repeat(MAX_LOCATION + 1)).is_err());
    }
}
