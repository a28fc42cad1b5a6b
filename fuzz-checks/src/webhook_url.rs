//! The webhook URL check: [`address::check_webhook_url`] where a catalog is applied, and
//! [`client::target`], the URI a delivery connects to.
//!
//! Invariants, for a target that is not `internal`: an accepted URL's host, as the delivery
//! URI carries it to the connector, is never a loopback, private, link-local, unspecified or
//! otherwise non-public address by any spelling (checked here against std's own address
//! classes and against how `inet_aton` would read a dotted name); both checks agree; an
//! `internal` target accepts whatever a public one does; and a URL's credentials never
//! survive [`address::redact_userinfo`].

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use switchyard_catalog::address;
use switchyard_control_plane::webhooks::client;

pub fn check(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    check_redaction(text);
    let applied = address::check_webhook_url(text, false);
    let delivered = client::target(text, false);
    assert_eq!(applied.is_ok(), delivered.is_ok(), "apply and delivery disagree on {text:?}");
    if address::check_webhook_url(text, true).is_err() {
        assert!(applied.is_err(), "internal refuses what public accepts: {text:?}");
    }
    let Ok(uri) = delivered else { return };
    let Some(host) = uri.host() else { panic!("an accepted URL has no host: {text:?} → {uri}") };
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = bare.parse::<IpAddr>() {
        assert!(is_public(ip), "{text:?} reaches {ip}");
    }
    if let Some(ip) = inet_aton(bare) {
        assert!(is_public(IpAddr::V4(ip)), "{text:?}: {bare} reads as {ip}");
    }
    let name = bare.trim_end_matches('.').to_ascii_lowercase();
    assert!(
        name != "localhost" && !name.ends_with(".localhost"),
        "{text:?} names localhost ({bare})"
    );
}

/// The redacted form of a URL with credentials carries neither of them.
fn check_redaction(text: &str) {
    let Ok(url) = url::Url::parse(text) else { return };
    let redacted = address::redact_userinfo(text);
    if url.password().is_some() || !url.username().is_empty() {
        let Ok(again) = url::Url::parse(&redacted) else {
            panic!("the redacted form of {text:?} does not parse: {redacted:?}")
        };
        assert!(again.password().is_none(), "a password survived redaction: {redacted:?}");
        assert!(
            again.username().is_empty() || again.username() == address::REDACTED,
            "a user name survived redaction: {redacted:?}"
        );
    }
}

/// Std's classes of addresses a webhook must not reach; an IPv6 address that carries an
/// IPv4 one (mapped or compatible) is judged as that.
fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4() {
                return is_public_v4(v4);
            }
            is_public_v6(v6)
        }
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    !(ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_unspecified()
        || ip.is_broadcast()
        || ip.is_multicast()
        || ip.octets()[0] == 0)
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    let s = ip.segments();
    !(ip.is_loopback()
        || ip.is_unspecified()
        || ip.is_multicast()
        || (s[0] & 0xfe00) == 0xfc00
        || (s[0] & 0xffc0) == 0xfe80)
}

/// How glibc's `inet_aton` (and so a resolver handed the name) reads `a`, `a.b`, `a.b.c`
/// and `a.b.c.d`, each part decimal, octal (`0…`) or hex (`0x…`).
fn inet_aton(name: &str) -> Option<Ipv4Addr> {
    let parts: Vec<u64> = name.split('.').map(number).collect::<Option<_>>()?;
    let (last, head) = parts.split_last()?;
    if head.len() > 3 || head.iter().any(|p| *p > 255) {
        return None;
    }
    let room = 8 * (4 - head.len() as u32);
    if room < 64 && *last >= 1u64 << room {
        return None;
    }
    let mut value: u64 = 0;
    for (i, p) in head.iter().enumerate() {
        value |= p << (24 - 8 * i as u32);
    }
    Some(Ipv4Addr::from((value | last) as u32))
}

/// One part: digits only (`from_str_radix` would also take a sign, which `inet_aton` does
/// not).
fn number(part: &str) -> Option<u64> {
    let (digits, radix) =
        if let Some(hex) = part.strip_prefix("0x").or_else(|| part.strip_prefix("0X")) {
            if hex.is_empty() {
                return Some(0);
            }
            (hex, 16)
        } else if part.len() > 1 && part.starts_with('0') {
            (&part[1..], 8)
        } else {
            (part, 10)
        };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    u64::from_str_radix(digits, radix).ok()
}
