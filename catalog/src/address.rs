//! Which addresses a webhook may reach, judged on URLs as a client parses them.
//!
//! A URL is parsed once, with the WHATWG parser of the `url` crate (the parser browsers and
//! curl-compatible clients agree with), and every decision is taken on its parsed host: the
//! host a connection would go to. Splitting the text by hand gets this wrong in ways an
//! attacker chooses: `http://x@127.0.0.1/` has the host `127.0.0.1`, not `x@127.0.0.1`, and
//! `http://2130706433/`, `http://0x7f000001/`, `http://0177.1/` and `http://127.1/` are all
//! `127.0.0.1` (the parser normalises them, as `inet_aton` would when resolving).
//!
//! The same check runs where a webhook is applied (the catalog refuses a private target
//! unless the subscription is `internal: true`) and where it is delivered (the control
//! plane checks the literal it connects to, and the addresses a name resolves to).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use url::{Host, Url};

/// Why a URL cannot be a webhook target or a provider's base URL.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    #[error("is not a URL: {0}")]
    Invalid(url::ParseError),
    #[error("must be an http:// or https:// URL")]
    Scheme,
    #[error("has no host")]
    NoHost,
    /// WHATWG URLs allow hosts (`` a`b ``, `a'b`) that an HTTP request cannot carry: such a
    /// URL would pass here and then fail every request made to it.
    #[error("cannot be the target of an HTTP request: {0}")]
    NotHttp(String),
    #[error(
        "targets a private, loopback or otherwise non-public address ({0}); set `internal: true` to allow it"
    )]
    Private(String),
}

/// Parses an absolute `http://` or `https://` URL (the scheme in any case) with a host.
pub fn parse_http_url(text: &str) -> Result<Url, UrlError> {
    let url = Url::parse(text.trim()).map_err(UrlError::Invalid)?;
    // The parser lower-cases the scheme, so `HTTP://` is `http://`.
    if !matches!(url.scheme(), "http" | "https") {
        return Err(UrlError::Scheme);
    }
    match url.host() {
        None | Some(Host::Domain("")) => return Err(UrlError::NoHost),
        Some(_) => {}
    }
    // What the HTTP client is handed: the URL without its credentials (hyper would not
    // send them), which must be a URI it can connect to (found by the `webhook_url` fuzz
    // target, docs/fuzzing.md).
    let mut target = url.clone();
    let _ = target.set_username("");
    let _ = target.set_password(None);
    http::Uri::try_from(target.as_str()).map_err(|e| UrlError::NotHttp(e.to_string()))?;
    Ok(url)
}

/// Parses a webhook target and, unless `internal`, refuses a host that is not public.
pub fn check_webhook_url(text: &str, internal: bool) -> Result<Url, UrlError> {
    let url = parse_http_url(text)?;
    if !internal && let Some(host) = url.host().filter(is_private_host) {
        return Err(UrlError::Private(host.to_string()));
    }
    Ok(url)
}

/// `localhost` and its subdomains, and every address [`is_private_ip`] refuses. Other names
/// are judged by the addresses they resolve to, at delivery.
pub fn is_private_host(host: &Host<&str>) -> bool {
    match host {
        Host::Domain(name) => {
            let name = name.trim_end_matches('.');
            name.eq_ignore_ascii_case("localhost")
                || name.to_ascii_lowercase().ends_with(".localhost")
        }
        Host::Ipv4(ip) => is_private_ip(IpAddr::V4(*ip)),
        Host::Ipv6(ip) => is_private_ip(IpAddr::V6(*ip)),
    }
}

/// Every address that is not a public unicast address: loopback, private (RFC 1918),
/// link-local (cloud metadata lives at 169.254.169.254), unspecified and "this network",
/// shared CGNAT space, benchmarking (198.18.0.0/15), documentation, multicast, reserved
/// and broadcast; for IPv6 also unique-local, link-local, multicast and documentation
/// ranges. An IPv6 address that carries an IPv4 address (mapped `::ffff:a.b.c.d`,
/// compatible `::a.b.c.d`, NAT64 `64:ff9b::a.b.c.d`, 6to4 `2002:AABB:CCDD::`) is judged
/// as the IPv4 address it reaches.
pub fn is_private_ip(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(ip) => is_private_v4(ip),
        IpAddr::V6(ip) => is_private_v6(ip),
    }
}

fn is_private_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_broadcast()
        || ip.is_multicast()
        || ip.is_documentation()
        || a == 0 // "this network", 0.0.0.0/8
        || (a == 100 && (64..128).contains(&b)) // shared address space (CGNAT), 100.64.0.0/10
        || (a == 198 && (b == 18 || b == 19)) // benchmarking, 198.18.0.0/15
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments, 192.0.0.0/24
        || a >= 240 // reserved, 240.0.0.0/4
}

fn is_private_v6(ip: Ipv6Addr) -> bool {
    let s = ip.segments();
    let embedded_v4 = |hi: u16, lo: u16| Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo));
    if let Some(v4) = ip.to_ipv4_mapped() {
        return is_private_v4(v4);
    }
    // IPv4-compatible (`::a.b.c.d`, deprecated but still routed by some stacks); `::` and
    // `::1` fall in here too and are judged below.
    if s[..6] == [0; 6] && !(ip.is_unspecified() || ip.is_loopback()) {
        return is_private_v4(embedded_v4(s[6], s[7]));
    }
    // NAT64, well-known prefix (RFC 6052): the gateway connects to the embedded address.
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return is_private_v4(embedded_v4(s[6], s[7]));
    }
    // 6to4 (RFC 3056): the relay reaches the embedded address.
    if s[0] == 0x2002 {
        return is_private_v4(embedded_v4(s[1], s[2]));
    }
    ip.is_loopback()
        || ip.is_unspecified()
        || ip.is_multicast()
        || (s[0] == 0x64 && s[1] == 0xff9b && s[2] == 1) // local-use NAT64, 64:ff9b:1::/48
        || (s[0] & 0xfe00) == 0xfc00 // unique local, fc00::/7
        || (s[0] & 0xffc0) == 0xfe80 // link-local, fe80::/10
        || (s[0] == 0x2001 && s[1] == 0x0db8) // documentation, 2001:db8::/32
        || (s[0] == 0x3fff && s[1] < 0x1000) // documentation, 3fff::/20
        || (s[0] == 0x0100 && s[1..4] == [0; 3]) // discard-only, 100::/64
}

/// `url` with its user name and password replaced by `***`, for listings: a URL may carry
/// credentials, and what the admin API shows is read by more people than wrote it. A URL
/// without credentials, or one that does not parse, is returned as it was.
pub fn redact_userinfo(url: &str) -> String {
    match Url::parse(url) {
        Ok(mut parsed) if has_userinfo(&parsed) => {
            let _ = parsed.set_password(None);
            if parsed.set_username(REDACTED).is_ok() { parsed.into() } else { url.to_owned() }
        }
        _ => url.to_owned(),
    }
}

/// What [`redact_userinfo`] puts where the credentials were.
pub const REDACTED: &str = "***";

/// Whether `url` carries credentials that [`redact_userinfo`] hid.
pub fn is_redacted(url: &str) -> bool {
    Url::parse(url).is_ok_and(|u| u.username() == REDACTED && u.password().is_none())
}

/// `url` with its credentials taken out, and them decoded: the URL as it may be handed to an
/// HTTP client (whose connection pool logs it at debug level), and the user name and
/// password for an `Authorization: Basic` header. A URL without credentials, or one that
/// does not parse, is returned as it was, with `None`.
pub fn split_userinfo(url: &str) -> (String, Option<(String, String)>) {
    match Url::parse(url) {
        Ok(mut parsed) if has_userinfo(&parsed) => {
            let decode =
                |s: &str| percent_encoding::percent_decode_str(s).decode_utf8_lossy().into_owned();
            let credentials =
                (decode(parsed.username()), parsed.password().map(decode).unwrap_or_default());
            let _ = parsed.set_password(None);
            let _ = parsed.set_username("");
            let mut bare: String = parsed.into();
            // The parser adds a `/` path to a bare host; the URL's own text had none.
            if !url.ends_with('/') && bare.ends_with('/') {
                bare.pop();
            }
            (bare, Some(credentials))
        }
        _ => (url.to_owned(), None),
    }
}

fn has_userinfo(url: &Url) -> bool {
    !url.username().is_empty() || url.password().is_some()
}

#[cfg(test)]
pub(crate) mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn split_userinfo_takes_the_credentials_out_decoded() {
        assert_eq!(
            split_userinfo("http://u%40x:p%3Aw@127.0.0.1:9/v1"),
            ("http://127.0.0.1:9/v1".to_owned(), Some(("u@x".to_owned(), "p:w".to_owned())))
        );
        assert_eq!(
            split_userinfo("https://user@example.com"),
            ("https://example.com".to_owned(), Some(("user".to_owned(), String::new())))
        );
        assert_eq!(
            split_userinfo("https://example.com/v1/"),
            ("https://example.com/v1/".to_owned(), None)
        );
        assert_eq!(split_userinfo("not a url"), ("not a url".to_owned(), None));
    }

    /// Every form of a non-public target the apply-time and delivery-time checks refuse.
    pub(crate) const PRIVATE_TARGETS: &[&str] = &[
        "http://127.0.0.1:9000/hook",
        "http://x@127.0.0.1:9000/hook",
        "http://user:pw@127.0.0.1:9000/hook",
        "http://hooks.example.com@127.0.0.1:9000/hook",
        "http://2130706433:9000/",
        "http://0x7f000001:9000/",
        "http://0177.0.0.1:9000/",
        "http://0177.1:9000/",
        "http://127.1:9000/",
        "http://127.0.1:9000/",
        "http://0x7f.1:9000/",
        "HTTP://127.0.0.1:9000/hook",
        "http://localhost:9000/",
        "http://LOCALHOST./",
        "http://api.localhost/",
        "http://[::1]:9000/",
        "http://[::]:9000/",
        "http://0.0.0.0:9000/",
        "http://0:9000/",
        "http://[::ffff:127.0.0.1]:9000/",
        "http://[::ffff:7f00:1]:9000/",
        "http://[::ffff:10.0.0.1]/",
        "http://[::7f00:1]:9000/",
        "http://[::127.0.0.1]:9000/",
        "http://[64:ff9b::7f00:1]:9000/",
        "http://[64:ff9b::10.1.2.3]/",
        "http://[64:ff9b:1::1]/",
        "http://[2002:7f00:1::]/",
        "http://[fc00::1]/",
        "http://[fd12:3456::1]/",
        "http://[fe80::1]/",
        "http://[febf::1]/",
        "http://[ff02::1]/",
        "http://[2001:db8::1]/",
        "http://10.1.2.3/",
        "http://172.16.0.1/",
        "http://172.31.255.255/",
        "http://192.168.1.1/",
        "http://169.254.169.254/latest/meta-data/",
        "http://100.64.0.1/",
        "http://100.127.255.255/",
        "http://198.18.0.1/",
        "http://198.19.255.255/",
        "http://224.0.0.1/",
        "http://239.255.255.250/",
        "http://255.255.255.255/",
        "http://240.0.0.1/",
        "http://192.0.2.1/",
        "http://198.51.100.1/",
        "http://203.0.113.1/",
        "http://192.0.0.8/",
        "https://x:y@[::ffff:192.168.0.1]:443/",
    ];

    /// Public targets, including ones that look private to a careless reader.
    pub(crate) const PUBLIC_TARGETS: &[&str] = &[
        "https://hooks.example.com/x",
        "HTTPS://hooks.example.com/x",
        "http://93.184.216.34/",
        "http://127.0.0.1.nip.io/",
        "http://127.0.0.1@hooks.example.com/",
        "http://[2606:4700::1111]/",
        "http://100.128.0.1/",
        "http://198.20.0.1/",
        "http://172.32.0.1/",
        "http://localhost.example.com/",
    ];

    #[test]
    fn every_form_of_a_private_target_is_refused_unless_internal() {
        for url in PRIVATE_TARGETS {
            assert!(
                matches!(check_webhook_url(url, false), Err(UrlError::Private(_))),
                "{url} must be refused: {:?}",
                check_webhook_url(url, false)
            );
            assert!(check_webhook_url(url, true).is_ok(), "{url} is allowed when internal");
        }
    }

    #[test]
    fn public_targets_pass() {
        for url in PUBLIC_TARGETS {
            assert!(
                check_webhook_url(url, false).is_ok(),
                "{url}: {:?}",
                check_webhook_url(url, false)
            );
        }
    }

    #[test]
    fn the_host_checked_is_the_host_connected_to() {
        for (text, host) in [
            ("http://x@127.0.0.1:9000/hook", "127.0.0.1"),
            ("http://2130706433:9000/", "127.0.0.1"),
            ("http://0x7f000001:9000/", "127.0.0.1"),
            ("http://0177.0.0.1/", "127.0.0.1"),
            ("http://127.1/", "127.0.0.1"),
            ("http://[::ffff:127.0.0.1]/", "[::ffff:7f00:1]"),
            ("HTTP://Hooks.Example.COM/x", "hooks.example.com"),
        ] {
            let url = parse_http_url(text).unwrap();
            assert_eq!(url.host().map(|h| h.to_string()).as_deref(), Some(host), "{text}");
        }
    }

    #[test]
    fn only_absolute_http_urls_with_a_host_parse() {
        for (text, want) in [
            ("ftp://example.com/", UrlError::Scheme),
            ("file:///etc/passwd", UrlError::Scheme),
            ("hooks.example.com/x", UrlError::Invalid(url::ParseError::RelativeUrlWithoutBase)),
            ("http://", UrlError::Invalid(url::ParseError::EmptyHost)),
            // A host WHATWG allows and an HTTP request cannot carry (fuzz/artifacts/webhook_url).
            ("http:////t0e2t5`t5h't5h':", UrlError::NotHttp("invalid uri character".into())),
        ] {
            assert_eq!(parse_http_url(text).err(), Some(want), "{text}");
        }
        assert!(parse_http_url("Http://h.example.com").is_ok());
    }

    #[test]
    fn credentials_in_urls_are_redacted() {
        for (url, shown) in [
            ("https://user:secret@h.example.com/p?q=1", "https://***@h.example.com/p?q=1"),
            ("https://token@h.example.com/p", "https://***@h.example.com/p"),
            ("https://:pw@h.example.com/p", "https://***@h.example.com/p"),
            ("https://h.example.com/p", "https://h.example.com/p"),
            ("https://h.example.com", "https://h.example.com"),
            ("not a url", "not a url"),
        ] {
            assert_eq!(redact_userinfo(url), shown, "{url}");
        }
        assert!(is_redacted("https://***@h.example.com/p"));
        assert!(!is_redacted("https://user:secret@h.example.com/p"));
        assert!(!is_redacted("https://h.example.com/p"));
    }
}
