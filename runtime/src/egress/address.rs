//! Which IP addresses a plugin may reach, and which host spellings are IP addresses at all.
//!
//! # Non-public addresses
//!
//! [`is_non_public`] is true for every address that reaches the operator's own machine, its
//! cluster or its cloud's control services rather than the Internet:
//! - IPv4: `0.0.0.0/8` (unspecified, "this network"), `127.0.0.0/8` (loopback), `10/8`,
//!   `172.16/12`, `192.168/16` (private), `169.254/16` (link-local: the metadata service
//!   169.254.169.254 of AWS, GCP, Azure, OpenStack), `100.64/10` (shared address space, used by
//!   Alibaba's metadata service 100.100.100.200 and by carrier NAT), `192.0.0.0/24` (IETF
//!   protocol assignments), multicast and `255.255.255.255`;
//! - IPv6: `::`, `::1`, `fe80::/10` (link-local), `fc00::/7` (unique local, including AWS's IMDS
//!   at `fd00:ec2::254`), `fec0::/10` (deprecated site-local), multicast;
//! - IPv6 forms that carry an IPv4 address are judged by that address: IPv4-mapped
//!   (`::ffff:169.254.169.254`), IPv4-compatible (`::169.254.169.254`) and the NAT64 prefix
//!   `64:ff9b::/96`.
//!
//! # IP spellings
//!
//! The C resolver accepts `2130706433`, `0x7f.1`, `0177.0.0.1` and `127.1` as 127.0.0.1. The
//! host never hands such a name to a resolver: [`HostKind::of`] classifies a host as a canonical
//! IP literal (dotted decimal without leading zeros, or a bracketed IPv6 address), a DNS name, or
//! an ambiguous numeric spelling, which is refused. A DNS name never ends in an all-numeric label
//! (top-level domains are alphabetic), so no real name is refused by this rule.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// What a request's host is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HostKind {
    /// A canonical IP literal: connect to exactly this address, no resolution.
    Ip(IpAddr),
    /// A DNS name, lowercase, without a trailing dot.
    Name(String),
    /// Looks like an IP address but is not a canonical spelling of one (decimal, octal, hex,
    /// shortened): refused, never resolved.
    AmbiguousNumeric,
}

impl HostKind {
    /// Classifies `host` as found in a URI (IPv6 in brackets).
    pub(crate) fn of(host: &str) -> HostKind {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        if let Some(inner) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            return match inner.parse::<Ipv6Addr>() {
                Ok(ip) => HostKind::Ip(IpAddr::V6(ip)),
                Err(_) => HostKind::AmbiguousNumeric,
            };
        }
        // Rust's parser accepts only four dotted decimal octets without leading zeros.
        if let Ok(ip) = host.parse::<Ipv4Addr>() {
            return HostKind::Ip(IpAddr::V4(ip));
        }
        let last = host.rsplit('.').next().unwrap_or_default();
        if last.is_empty() || looks_numeric(last) || host.contains(':') {
            return HostKind::AmbiguousNumeric;
        }
        HostKind::Name(host)
    }
}

/// A label the C resolver would read as a number: decimal, octal (`0…`) or hex (`0x…`).
fn looks_numeric(label: &str) -> bool {
    let hex = label
        .strip_prefix("0x")
        .is_some_and(|h| h.chars().all(|c| c.is_ascii_hexdigit()));
    hex || label.chars().all(|c| c.is_ascii_digit())
}

/// Whether `ip` is loopback, link-local, private, unspecified or otherwise not on the public
/// Internet (see the module docs for the exact ranges).
pub(crate) fn is_non_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_non_public_v4(v4),
        IpAddr::V6(v6) => match embedded_v4(v6) {
            Some(v4) => is_non_public_v4(v4),
            None => is_non_public_v6(v6),
        },
    }
}

fn is_non_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    a == 0
        || ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || (a == 100 && (64..128).contains(&b))
        || (a == 192 && b == 0 && c == 0)
        || ip.is_multicast()
        || ip.is_broadcast()
}

fn is_non_public_v6(ip: Ipv6Addr) -> bool {
    let first = ip.segments().first().copied().unwrap_or_default();
    ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_multicast()
        || (first & 0xffc0) == 0xfe80
        || (first & 0xffc0) == 0xfec0
        || (first & 0xfe00) == 0xfc00
}

/// The IPv4 address inside an IPv4-mapped, IPv4-compatible or NAT64 (`64:ff9b::/96`) address.
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return Some(v4);
    }
    let s = ip.segments();
    let tail = |s: &[u16; 8]| {
        let [.., hi, lo] = *s;
        Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo))
    };
    match s {
        // `::` and `::1` are IPv6's own unspecified and loopback addresses, judged as such.
        [0, 0, 0, 0, 0, 0, 0, 0] | [0, 0, 0, 0, 0, 0, 0, 1] => None,
        [0, 0, 0, 0, 0, 0, _, _] => Some(tail(&s)),
        [0x64, 0xff9b, 0, 0, 0, 0, _, _] => Some(tail(&s)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        match s.parse() {
            Ok(ip) => ip,
            Err(e) => panic!("{s}: {e}"),
        }
    }

    #[test]
    fn non_public_ranges() {
        for s in [
            "127.0.0.1",
            "127.255.0.9",
            "0.0.0.0",
            "0.1.2.3",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "100.100.100.200",
            "192.0.0.192",
            "224.0.0.1",
            "255.255.255.255",
            "::",
            "::1",
            "fe80::1",
            "fd00:ec2::254",
            "fec0::1",
            "ff02::1",
        ] {
            assert!(is_non_public(ip(s)), "{s} must be non-public");
        }
        for s in [
            "8.8.8.8",
            "52.94.0.1",
            "172.32.0.1",
            "100.128.0.1",
            "2600:1f18::1",
        ] {
            assert!(!is_non_public(ip(s)), "{s} is public");
        }
    }

    #[test]
    fn ipv6_forms_of_ipv4_are_judged_by_the_ipv4_address() {
        for s in [
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::ffff:a9fe:a9fe",
            "::169.254.169.254",
            "::127.0.0.1",
            "64:ff9b::169.254.169.254",
            "64:ff9b::a9fe:a9fe",
        ] {
            assert!(is_non_public(ip(s)), "{s} must be non-public");
        }
        assert!(!is_non_public(ip("::ffff:8.8.8.8")));
    }

    #[test]
    fn decimal_octal_hex_and_short_spellings_are_refused() {
        for s in [
            "2130706433",
            "0x7f000001",
            "0177.0.0.1",
            "0x7f.0.0.1",
            "127.1",
            "127.0.1",
            "017700000001",
            "169.254.43518",
            "[::ffff:127.0.0.1",
            "[zz]",
            "1.2.3.4.5",
        ] {
            assert_eq!(HostKind::of(s), HostKind::AmbiguousNumeric, "{s}");
        }
    }

    #[test]
    fn canonical_literals_and_names() {
        assert_eq!(
            HostKind::of("169.254.169.254"),
            HostKind::Ip(ip("169.254.169.254"))
        );
        assert_eq!(
            HostKind::of("[::ffff:127.0.0.1]"),
            HostKind::Ip(ip("::ffff:127.0.0.1"))
        );
        assert_eq!(
            HostKind::of("EC2.us-east-1.AmazonAWS.com."),
            HostKind::Name("ec2.us-east-1.amazonaws.com".into())
        );
        assert_eq!(
            HostKind::of("1password.example"),
            HostKind::Name("1password.example".into())
        );
    }
}
