//! When the certificates the process loaded expire, for `/metrics`:
//! `switchyard_tls_certificate_expiry_timestamp_seconds{role, file}`, the Unix time the first
//! certificate of a file expires (a chain is no better than its shortest-lived member). Set
//! on every load, rotations included, so the alert on it (deploy/prometheus/alerts.yaml)
//! clears once a renewed file is picked up. The node and the control plane register the one
//! family of the process in their registries.
//!
//! `role` is the flag that named the file (`tls-cert`, `control-ca`, `client-ca`, …) and
//! `file` its path: a handful of series per process.

use std::sync::OnceLock;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use rustls::pki_types::CertificateDer;
use std::path::Path;

pub const NAME: &str = "tls_certificate_expiry_timestamp_seconds";
const HELP: &str = "When the first certificate of a PEM file this process loaded expires (Unix seconds), by the flag that named it and its path";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ExpiryLabels {
    /// The flag without its dashes: `tls-cert`, `control-ca`, `client-ca`, …
    pub role: String,
    pub file: String,
}

/// The process's one family.
pub fn expiry() -> &'static Family<ExpiryLabels, Gauge> {
    static EXPIRY: OnceLock<Family<ExpiryLabels, Gauge>> = OnceLock::new();
    EXPIRY.get_or_init(Family::default)
}

/// Registers the family in a registry whose prefix is `switchyard`.
pub fn register(registry: &mut Registry) {
    registry.register(NAME, HELP, expiry().clone());
}

/// Records the expiry of the certificates of the file `flag` named (those whose date could
/// be read).
pub(crate) fn record(flag: &str, file: &Path, certs: &[CertificateDer<'_>]) {
    let Some(first) = certs.iter().filter_map(|c| not_after(c)).min() else {
        return;
    };
    let labels = ExpiryLabels {
        role: flag.trim_start_matches('-').to_owned(),
        file: file.display().to_string(),
    };
    expiry().get_or_create(&labels).set(first);
}

/// One DER element: its tag, its content and what follows it.
fn element(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let (bytes, rest) = rest.split_at(n);
        (bytes.iter().fold(0usize, |acc, b| (acc << 8) | usize::from(*b)), rest)
    };
    if rest.len() < len {
        return None;
    }
    let (content, rest) = rest.split_at(len);
    Some((tag, content, rest))
}

const SEQUENCE: u8 = 0x30;
const VERSION: u8 = 0xa0;

/// The `notAfter` of an X.509 certificate, in Unix seconds (RFC 5280 §4.1: the fifth field
/// of `tbsCertificate`, after an optional version, the serial number, the signature
/// algorithm and the issuer). Read by hand: the one date is all that is needed, and rustls
/// does not expose it.
pub fn not_after(der: &[u8]) -> Option<i64> {
    let (SEQUENCE, cert, _) = element(der)? else { return None };
    let (SEQUENCE, tbs, _) = element(cert)? else { return None };
    let mut rest = tbs;
    if rest.first() == Some(&VERSION) {
        rest = element(rest)?.2;
    }
    for _serial_algorithm_issuer in 0..3 {
        rest = element(rest)?.2;
    }
    let (SEQUENCE, validity, _) = element(rest)? else { return None };
    let (_, _, after_not_before) = element(validity)?;
    let (tag, time, _) = element(after_not_before)?;
    parse_time(tag, time)
}

const UTC_TIME: u8 = 0x17;
const GENERALIZED_TIME: u8 = 0x18;

/// `YYMMDDHHMMSSZ` (UTCTime, years 1950–2049) or `YYYYMMDDHHMMSSZ` (GeneralizedTime), the
/// two forms RFC 5280 §4.1.2.5 allows.
fn parse_time(tag: u8, text: &[u8]) -> Option<i64> {
    let text = std::str::from_utf8(text).ok()?.strip_suffix('Z')?;
    let (year, rest) = match tag {
        UTC_TIME => {
            let (yy, rest) = text.split_at_checked(2)?;
            let yy: i64 = yy.parse().ok()?;
            (if yy >= 50 { 1900 + yy } else { 2000 + yy }, rest)
        }
        GENERALIZED_TIME => {
            let (yyyy, rest) = text.split_at_checked(4)?;
            (yyyy.parse().ok()?, rest)
        }
        _ => return None,
    };
    if rest.len() != 10 || !rest.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let field = |i: usize| rest.get(i..i + 2).and_then(|s| s.parse::<i64>().ok());
    let (month, day) = (field(0)?, field(2)?);
    let (hour, minute, second) = (field(4)?, field(6)?, field(8)?);
    Some(days_from_civil(year, month, day) * 86_400 + hour * 3_600 + minute * 60 + second)
}

/// Days from 1970-01-01 to a date of the proleptic Gregorian calendar (Howard Hinnant's
/// `days_from_civil`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let day_of_year = (153 * ((month + 9) % 12) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn cert_until(year: i32, month: u8, day: u8) -> CertificateDer<'static> {
        let mut params = rcgen::CertificateParams::new(vec!["node.example".into()]).unwrap();
        params.not_after = rcgen::date_time_ymd(year, month, day);
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().clone()
    }

    #[test]
    fn not_after_reads_utc_and_generalized_times() {
        // 2030-01-02T00:00:00Z is a UTCTime; 2050 and later are GeneralizedTime.
        assert_eq!(not_after(&cert_until(2030, 1, 2)), Some(1_893_542_400));
        assert_eq!(not_after(&cert_until(2051, 3, 1)), Some(2_561_241_600));
    }

    #[test]
    fn not_after_of_something_else_is_none() {
        assert_eq!(not_after(b"not a certificate"), None);
        assert_eq!(not_after(&[SEQUENCE, 0x85, 1, 2, 3, 4, 5]), None);
    }

    #[test]
    fn record_keeps_the_first_expiry_of_a_file_by_flag_and_path() {
        let file = Path::new("/etc/switchyard/chain.pem");
        record("--tls-cert", file, &[cert_until(2031, 6, 1), cert_until(2030, 1, 2)]);
        let labels =
            ExpiryLabels { role: "tls-cert".into(), file: "/etc/switchyard/chain.pem".into() };
        assert_eq!(expiry().get_or_create(&labels).get(), 1_893_542_400);
    }
}
