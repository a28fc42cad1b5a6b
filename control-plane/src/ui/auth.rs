//! Signing in to the console: the admin token in a cookie, a CSRF token for the forms that
//! change something, and a bound on wrong tokens.
//!
//! The cookie holds the admin token itself (base64url, so that any token fits a cookie
//! value): `HttpOnly` (no script reads it), `SameSite=Strict` (no other site's page sends
//! it), `Path=/ui`, and `Secure` when the listener serves TLS. Every replica accepts it
//! with no session state, and rotating the admin token signs every browser out.
//!
//! Forms that change something carry a CSRF token derived from the admin token (HMAC), and
//! their `Origin` must be this host's: `SameSite=Strict` alone leaves out older browsers.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use http::HeaderMap;
use sha2::Sha256;

use crate::auth::Token;

pub const COOKIE: &str = "switchyard_console";

/// Wrong tokens one client address may send per [`WINDOW`] before it is refused for the
/// rest of the window: enough for typos, far too few to guess a 16-character token.
const WRONG_PER_WINDOW: u32 = 5;
const WINDOW: Duration = Duration::from_secs(60);
/// Addresses remembered at most; beyond it the oldest windows are dropped first.
const MAX_TRACKED: usize = 10_000;

pub struct Credentials {
    token: Token,
    csrf: String,
    /// Adds `Secure` to the cookie.
    pub tls: bool,
}

impl Credentials {
    pub fn new(admin_token: &str, tls: bool) -> Self {
        // The key is the token: only a holder of the token can make a valid CSRF token.
        let csrf = match Hmac::<Sha256>::new_from_slice(admin_token.as_bytes()) {
            Ok(mut mac) => {
                mac.update(b"switchyard console csrf");
                URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes())
            }
            // HMAC takes a key of any length; this branch is never taken.
            Err(_) => String::new(),
        };
        Self { token: Token::new(admin_token), csrf, tls }
    }

    pub fn csrf(&self) -> &str {
        &self.csrf
    }

    pub fn token_matches(&self, presented: &str) -> bool {
        self.token.matches(presented)
    }

    /// Whether the request's cookie holds the admin token.
    pub fn signed_in(&self, headers: &HeaderMap) -> bool {
        cookie(headers, COOKIE)
            .and_then(|v| URL_SAFE_NO_PAD.decode(v).ok())
            .and_then(|b| String::from_utf8(b).ok())
            .is_some_and(|t| self.token.matches(&t))
    }

    /// Whether a form post is this console's own: its CSRF token, and an `Origin` (when
    /// the browser sends one) naming the host it was sent to.
    pub fn form_is_ours(&self, headers: &HeaderMap, csrf: Option<&str>) -> bool {
        let same_origin = match headers.get(http::header::ORIGIN).and_then(|v| v.to_str().ok()) {
            None => true,
            Some(origin) => {
                let host = headers.get(http::header::HOST).and_then(|v| v.to_str().ok());
                let origin_host = origin.split_once("://").map(|(_, h)| h);
                host.is_some() && origin_host == host
            }
        };
        let presented = csrf.unwrap_or("");
        let token_ok = !presented.is_empty()
            && presented.len() == self.csrf.len()
            && presented.bytes().zip(self.csrf.bytes()).fold(0u8, |a, (x, y)| a | (x ^ y)) == 0;
        same_origin && token_ok
    }

    pub fn cookie_for(&self, token: &str) -> String {
        format!("{COOKIE}={}; {}", URL_SAFE_NO_PAD.encode(token.as_bytes()), self.attributes())
    }

    pub fn cleared_cookie(&self) -> String {
        format!("{COOKIE}=; Max-Age=0; {}", self.attributes())
    }

    fn attributes(&self) -> &'static str {
        if self.tls {
            "Path=/ui; HttpOnly; SameSite=Strict; Secure"
        } else {
            "Path=/ui; HttpOnly; SameSite=Strict"
        }
    }
}

fn cookie<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get_all(http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v)
}

/// Counts wrong tokens per client address in fixed windows.
#[derive(Default)]
pub struct WrongTokens(Mutex<HashMap<Option<IpAddr>, (Instant, u32)>>);

impl WrongTokens {
    /// Whether `peer` may try a token now.
    pub fn allowed(&self, peer: Option<IpAddr>, now: Instant) -> bool {
        let Ok(map) = self.0.lock() else { return false };
        map.get(&peer)
            .is_none_or(|(start, n)| now.duration_since(*start) >= WINDOW || *n < WRONG_PER_WINDOW)
    }

    pub fn record_wrong(&self, peer: Option<IpAddr>, now: Instant) {
        let Ok(mut map) = self.0.lock() else { return };
        if map.len() >= MAX_TRACKED {
            map.retain(|_, (start, _)| now.duration_since(*start) < WINDOW);
        }
        let entry = map.entry(peer).or_insert((now, 0));
        if now.duration_since(entry.0) >= WINDOW {
            *entry = (now, 0);
        }
        entry.1 += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(http::header::HeaderName, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in pairs {
            h.append(n.clone(), v.parse().unwrap());
        }
        h
    }

    #[test]
    fn only_the_cookie_of_the_admin_token_signs_in() {
        let c = Credentials::new("0123456789abcdef", false);
        let good = c.cookie_for("0123456789abcdef");
        let value = good.split(';').next().unwrap();
        assert!(c.signed_in(&headers(&[(http::header::COOKIE, value)])));
        let wrong = Credentials::new("x", false).cookie_for("fedcba9876543210");
        let wrong = wrong.split(';').next().unwrap();
        assert!(!c.signed_in(&headers(&[(http::header::COOKIE, wrong)])));
        assert!(!c.signed_in(&headers(&[(http::header::COOKIE, "switchyard_console=%%")])));
        assert!(!c.signed_in(&HeaderMap::new()));
        assert!(good.contains("HttpOnly") && good.contains("SameSite=Strict"));
        assert!(!good.contains("Secure"));
        assert!(Credentials::new("t", true).cookie_for("t").contains("; Secure"));
    }

    #[test]
    fn a_form_needs_the_csrf_token_and_this_hosts_origin() {
        let c = Credentials::new("0123456789abcdef", false);
        let csrf = c.csrf().to_owned();
        let host = (http::header::HOST, "127.0.0.1:7400");
        assert!(c.form_is_ours(&headers(std::slice::from_ref(&host)), Some(&csrf)));
        assert!(c.form_is_ours(
            &headers(&[host.clone(), (http::header::ORIGIN, "http://127.0.0.1:7400")]),
            Some(&csrf)
        ));
        assert!(!c.form_is_ours(
            &headers(&[host.clone(), (http::header::ORIGIN, "https://evil.example")]),
            Some(&csrf)
        ));
        assert!(!c.form_is_ours(&headers(std::slice::from_ref(&host)), None));
        assert!(!c.form_is_ours(&headers(&[host]), Some("forged")));
        assert_ne!(Credentials::new("another token!!!", false).csrf(), csrf);
    }

    #[test]
    fn wrong_tokens_are_refused_after_five_in_a_window_per_address() {
        let limits = WrongTokens::default();
        let (a, b) = (Some("10.0.0.1".parse().unwrap()), Some("10.0.0.2".parse().unwrap()));
        let start = Instant::now();
        for _ in 0..WRONG_PER_WINDOW {
            assert!(limits.allowed(a, start));
            limits.record_wrong(a, start);
        }
        assert!(!limits.allowed(a, start));
        assert!(limits.allowed(b, start), "another address is not held up");
        assert!(limits.allowed(a, start + WINDOW), "a new window starts afresh");
    }
}
