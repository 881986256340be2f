//! The output bounds of `wit/provider.wit` ("# Bounds"), enforced on everything a [`Provider`]
//! returns before it crosses into the host.
//!
//! The numbers are `vmop-contract`'s, the table the host checks answers against: they are
//! re-exported here, never copied.
//!
//! The host treats any value beyond a bound as a plugin fault and discards the whole answer. A
//! message that is merely long, or an address list a cloud padded, should not cost the user the
//! answer, so what can be shortened without changing its meaning is shortened here: messages
//! are truncated, the retry delay clamped, addresses capped. What cannot (an id, a location:
//! a shortened one would name a different machine or cloud) becomes a `permanent` error that
//! says the provider is at fault, instead of an answer the host would refuse anyway. A `list`
//! page is the one answer with many machines: [`page`] says what it keeps.
//!
//! [`Provider`]: crate::Provider

pub use vmop_contract::bounds::{
    MAX_ADDRESS, MAX_ADDRESSES, MAX_CAPABILITIES, MAX_CLUSTER, MAX_CURSOR, MAX_ID, MAX_INFO_FIELD,
    MAX_LOCATION, MAX_MESSAGE, MAX_OWNER, MAX_PAGE_MACHINES, MAX_PARAMETERS, MAX_RETRY_AFTER,
    MAX_RETRY_AFTER_MS,
};

use crate::{ListedMachine, Page, Parameter, PluginInfo, ProviderError, RateLimit, VmStatus};

pub use vmop_contract::text::truncate;

/// The error with its message truncated and its delay clamped.
pub fn error(err: ProviderError) -> ProviderError {
    let message = |m| truncate(m, MAX_MESSAGE);
    match err {
        ProviderError::Transient(m) => ProviderError::Transient(message(m)),
        ProviderError::RateLimited(RateLimit {
            retry_after_ms,
            message: m,
        }) => ProviderError::RateLimited(RateLimit {
            retry_after_ms: retry_after_ms.min(MAX_RETRY_AFTER_MS),
            message: message(m),
        }),
        ProviderError::Permanent(m) => ProviderError::Permanent(message(m)),
        ProviderError::InvalidSpec(m) => ProviderError::InvalidSpec(message(m)),
        ProviderError::Unauthorized(m) => ProviderError::Unauthorized(message(m)),
    }
}

/// Bounds a whole result: the error via [`error`], the value via `ok`.
pub fn result<T>(
    result: Result<T, ProviderError>,
    ok: impl FnOnce(T) -> Result<T, ProviderError>,
) -> Result<T, ProviderError> {
    result.and_then(ok).map_err(error)
}

/// The status with addresses over [`MAX_ADDRESS`] bytes dropped, at most [`MAX_ADDRESSES`]
/// kept (in order: the most useful come first) and the message truncated to [`MAX_MESSAGE`];
/// an id outside 1..=[`MAX_ID`] bytes is an error. An empty owner names no VM and becomes
/// `None`; one over [`MAX_OWNER`] bytes is an error (a cut uid, or none, would let another VM
/// take the machine).
pub fn status(mut status: VmStatus) -> Result<VmStatus, ProviderError> {
    if status.id.is_empty() || status.id.len() > MAX_ID {
        return Err(ProviderError::Permanent(format!(
            "provider bug: it returned a machine id of {} bytes (the contract allows 1..={MAX_ID})",
            status.id.len()
        )));
    }
    status.owner = status.owner.filter(|o| !o.is_empty());
    if let Some(owner) = status.owner.as_ref().filter(|o| o.len() > MAX_OWNER) {
        return Err(ProviderError::Permanent(format!(
            "provider bug: it returned a machine owner of {} bytes (the contract allows \
             1..={MAX_OWNER})",
            owner.len()
        )));
    }
    status.addresses.retain(|a| a.len() <= MAX_ADDRESS);
    status.addresses.truncate(MAX_ADDRESSES);
    status.message = status.message.map(|m| truncate(m, MAX_MESSAGE));
    Ok(status)
}

/// `Some` status bounded by [`status`].
pub fn optional_status(found: Option<VmStatus>) -> Result<Option<VmStatus>, ProviderError> {
    found.map(status).transpose()
}

/// A `list` page within the bounds, or an error where the page itself is wrong:
///
/// - more than [`MAX_PAGE_MACHINES`] machines is a `permanent` error (the provider asked its
///   cloud for too many): a cut page would skip the machines between its end and `next` for
///   good;
/// - a `next` over [`MAX_CURSOR`] bytes is a `permanent` error (a cut cursor is another
///   cursor); an empty `next` is the end of the listing (`None`: the contract has no empty
///   cursor, and clouds write an empty token on their last page);
/// - each machine's status is bounded as [`status`] bounds it, and an empty cluster is `None`.
///   A machine the contract cannot carry (an id or owner [`status`] refuses, a cluster over
///   [`MAX_CLUSTER`] bytes) is left out of the page, and why is pushed to `left_out` (the
///   adapter logs it): no call could name such a machine, and the host reads a machine missing
///   from a listing as "ask `get`", never as gone.
pub fn page(page: Page, left_out: &mut Vec<String>) -> Result<Page, ProviderError> {
    if page.machines.len() > MAX_PAGE_MACHINES {
        return Err(ProviderError::Permanent(format!(
            "provider bug: it returned a page of {} machines (the contract allows \
             {MAX_PAGE_MACHINES})",
            page.machines.len()
        )));
    }
    let next = page.next.filter(|n| !n.is_empty());
    if let Some(next) = next.as_ref().filter(|n| n.len() > MAX_CURSOR) {
        return Err(ProviderError::Permanent(format!(
            "provider bug: it returned a page cursor of {} bytes (the contract allows \
             1..={MAX_CURSOR})",
            next.len()
        )));
    }
    let machines = page
        .machines
        .into_iter()
        .filter_map(|machine| match listed(machine) {
            Ok(machine) => Some(machine),
            Err(reason) => {
                left_out.push(reason);
                None
            }
        })
        .collect();
    Ok(Page { machines, next })
}

/// One machine of a page bounded for [`page`], or why it cannot be listed.
fn listed(machine: ListedMachine) -> Result<ListedMachine, String> {
    let status = status(machine.status).map_err(|e| match e {
        ProviderError::Permanent(m) => m,
        other => format!("{other:?}"),
    })?;
    let cluster = machine.cluster.filter(|c| !c.is_empty());
    if let Some(cluster) = cluster.as_ref().filter(|c| c.len() > MAX_CLUSTER) {
        return Err(format!(
            "provider bug: machine {} carries a cluster mark of {} bytes (the contract allows \
             1..={MAX_CLUSTER})",
            status.id,
            cluster.len()
        ));
    }
    Ok(ListedMachine {
        status,
        cluster,
        created_at_ms: machine.created_at_ms,
    })
}

/// A location of 1..=[`MAX_LOCATION`] bytes, else an error: a cut location could equal another
/// cloud's.
pub fn location(location: String) -> Result<String, ProviderError> {
    if location.is_empty() || location.len() > MAX_LOCATION {
        return Err(ProviderError::Permanent(format!(
            "provider bug: it returned a location of {} bytes (the contract allows \
             1..={MAX_LOCATION})",
            location.len()
        )));
    }
    Ok(location)
}

/// Name, version and wit-version truncated to [`MAX_INFO_FIELD`]; capabilities longer than
/// that dropped and at most [`MAX_CAPABILITIES`] kept; parameters with an empty name or one
/// longer than [`MAX_INFO_FIELD`] dropped (a cut name would declare another parameter), at most
/// [`MAX_PARAMETERS`] kept, descriptions truncated to [`MAX_MESSAGE`]. `info` has no error to
/// report a fault with.
pub fn info(info: PluginInfo) -> PluginInfo {
    let short = |s| truncate(s, MAX_INFO_FIELD);
    let mut capabilities = info.capabilities;
    capabilities.retain(|c| c.len() <= MAX_INFO_FIELD);
    capabilities.truncate(MAX_CAPABILITIES);
    let parameters: Vec<Parameter> = info
        .parameters
        .into_iter()
        .filter(|p| (1..=MAX_INFO_FIELD).contains(&p.name.len()))
        .take(MAX_PARAMETERS)
        .map(|p| Parameter {
            description: truncate(p.description, MAX_MESSAGE),
            ..p
        })
        .collect();
    PluginInfo {
        name: short(info.name),
        version: short(info.version),
        wit_version: short(info.wit_version),
        capabilities,
        parameters,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ParameterKind, Phase};

    fn vm(id: &str) -> VmStatus {
        VmStatus {
            id: id.into(),
            phase: Phase::Running,
            addresses: Vec::new(),
            message: None,
            owner: None,
        }
    }

    #[test]
    fn errors_are_truncated_and_delays_clamped() {
        let huge = "m".repeat(2 << 20);
        match error(ProviderError::InvalidSpec(huge.clone())) {
            ProviderError::InvalidSpec(m) => assert!(m.len() <= MAX_MESSAGE),
            other => panic!("variant changed: {other:?}"),
        }
        let limited = error(ProviderError::RateLimited(RateLimit {
            retry_after_ms: u64::MAX,
            message: huge,
        }));
        match limited {
            ProviderError::RateLimited(r) => {
                assert_eq!(r.retry_after_ms, MAX_RETRY_AFTER_MS);
                assert!(r.message.len() <= MAX_MESSAGE);
            }
            other => panic!("variant changed: {other:?}"),
        }
        let small = error(ProviderError::RateLimited(RateLimit {
            retry_after_ms: 2000,
            message: "slow".into(),
        }));
        assert!(matches!(small, ProviderError::RateLimited(r) if r.retry_after_ms == 2000));
    }

    #[test]
    fn status_keeps_the_first_sixteen_short_addresses() {
        let mut s = vm("i-1");
        s.addresses = (0..10_000)
            .map(|i| format!("10.0.{}.{}", i / 256, i % 256))
            .collect();
        s.addresses.insert(1, "a".repeat(MAX_ADDRESS + 1));
        s.message = Some("w".repeat(5000));
        let bounded = status(s).unwrap();
        assert_eq!(bounded.addresses.len(), MAX_ADDRESSES);
        assert_eq!(
            bounded.addresses.first().map(String::as_str),
            Some("10.0.0.0")
        );
        assert_eq!(
            bounded.addresses.get(1).map(String::as_str),
            Some("10.0.0.1")
        );
        assert!(bounded.message.is_some_and(|m| m.len() <= MAX_MESSAGE));
    }

    #[test]
    fn ids_and_locations_out_of_bounds_are_errors() {
        assert!(status(vm(&"i".repeat(MAX_ID))).is_ok());
        assert!(matches!(
            status(vm(&"i".repeat(MAX_ID + 1))),
            Err(ProviderError::Permanent(m)) if m.contains("257 bytes")
        ));
        assert!(status(vm("")).is_err());
        assert!(optional_status(None).is_ok_and(|s| s.is_none()));
        let owned = |owner: &str| VmStatus {
            owner: Some(owner.into()),
            ..vm("i-1")
        };
        assert!(status(owned(&"u".repeat(MAX_OWNER + 1))).is_err());
        assert_eq!(status(owned("")).ok().and_then(|s| s.owner), None);
        assert_eq!(
            status(owned("u-1")).ok().and_then(|s| s.owner).as_deref(),
            Some("u-1")
        );
        assert!(location("aws:1:r:e".into()).is_ok());
        assert!(location(String::new()).is_err());
        assert!(location("l".repeat(MAX_LOCATION + 1)).is_err());
    }

    #[test]
    fn result_bounds_errors_raised_by_the_check() {
        let bounded = result(Ok(vm(&"i".repeat(300))), status);
        assert!(matches!(bounded, Err(ProviderError::Permanent(m)) if m.len() <= MAX_MESSAGE));
        let failed: Result<VmStatus, _> =
            result(Err(ProviderError::Transient("x".repeat(2000))), status);
        assert!(matches!(failed, Err(ProviderError::Transient(m)) if m.len() <= MAX_MESSAGE));
    }

    fn listed(id: &str) -> ListedMachine {
        ListedMachine {
            status: vm(id),
            cluster: Some("c-1".into()),
            created_at_ms: Some(1),
        }
    }

    #[test]
    fn pages_keep_what_the_contract_can_carry() {
        let mut wordy = listed("i-2");
        wordy.status.message = Some("w".repeat(5000));
        let mut unmarked = listed("i-3");
        unmarked.cluster = Some(String::new());
        let mut foreign = listed("i-4");
        foreign.cluster = Some("c".repeat(MAX_CLUSTER + 1));
        let machines = vec![
            listed("i-1"),
            listed(&"i".repeat(MAX_ID + 1)),
            wordy,
            unmarked,
            foreign,
            listed(""),
        ];
        let mut left_out = Vec::new();
        let bounded = page(
            Page {
                machines,
                next: Some("n".repeat(MAX_CURSOR)),
            },
            &mut left_out,
        )
        .unwrap();
        let ids: Vec<&str> = bounded
            .machines
            .iter()
            .map(|m| m.status.id.as_str())
            .collect();
        assert_eq!(ids, ["i-1", "i-2", "i-3"]);
        assert_eq!(left_out.len(), 3, "{left_out:?}");
        assert!(
            left_out
                .iter()
                .any(|r| r.contains("i-4") && r.contains("257 bytes"))
        );
        let kept = |i: usize| bounded.machines.get(i).unwrap();
        assert!(
            kept(1)
                .status
                .message
                .as_ref()
                .is_some_and(|m| m.len() <= MAX_MESSAGE)
        );
        assert_eq!(kept(2).cluster, None, "an empty mark is no mark");
        assert_eq!(kept(0).created_at_ms, Some(1));
        assert_eq!(bounded.next.map(|n| n.len()), Some(MAX_CURSOR));
    }

    #[test]
    fn pages_too_long_or_with_a_long_cursor_are_errors() {
        let mut left_out = Vec::new();
        let full = Page {
            machines: vec![listed("i-1"); MAX_PAGE_MACHINES],
            next: None,
        };
        assert!(page(full.clone(), &mut left_out).is_ok());
        let mut over = full;
        over.machines.push(listed("i-2"));
        assert!(matches!(
            page(over, &mut left_out),
            Err(ProviderError::Permanent(m)) if m.contains("1001 machines")
        ));
        let long = Page {
            machines: Vec::new(),
            next: Some("n".repeat(MAX_CURSOR + 1)),
        };
        assert!(matches!(
            page(long, &mut left_out),
            Err(ProviderError::Permanent(m)) if m.contains("cursor of 4097 bytes")
        ));
        let last = Page {
            machines: Vec::new(),
            next: Some(String::new()),
        };
        assert_eq!(page(last, &mut left_out).ok().and_then(|p| p.next), None);
        assert!(left_out.is_empty());
    }

    #[test]
    fn info_is_bounded() {
        let parameter = |name: &str, description: String| Parameter {
            name: name.into(),
            kind: ParameterKind::Text,
            description,
            mutable: true,
        };
        let mut capabilities: Vec<String> = (0..40).map(|i| format!("cap-{i}")).collect();
        capabilities.insert(0, "c".repeat(MAX_INFO_FIELD + 1));
        let mut parameters = vec![parameter("p", String::new()); 70];
        parameters.insert(0, parameter("", String::new()));
        parameters.insert(1, parameter(&"n".repeat(MAX_INFO_FIELD + 1), String::new()));
        parameters.insert(2, parameter("wordy", "d".repeat(MAX_MESSAGE + 1)));
        let bounded = info(PluginInfo {
            name: "n".repeat(100),
            version: "1.0.0".into(),
            wit_version: "0.2.0".into(),
            capabilities,
            parameters,
        });
        assert!(bounded.name.len() <= MAX_INFO_FIELD);
        assert_eq!(bounded.version, "1.0.0");
        assert_eq!(bounded.capabilities.len(), MAX_CAPABILITIES);
        assert_eq!(
            bounded.capabilities.first().map(String::as_str),
            Some("cap-0")
        );
        assert_eq!(bounded.parameters.len(), MAX_PARAMETERS);
        let first = bounded.parameters.first().unwrap();
        assert_eq!(first.name, "wordy", "bad names are dropped");
        assert!(first.description.len() <= MAX_MESSAGE);
    }
}
