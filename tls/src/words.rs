//! rustls's errors as an operator reads them: which side refused, and why.

use std::time::{Duration, UNIX_EPOCH};

use rustls::pki_types::UnixTime;
use rustls::{AlertDescription, CertificateError, Error};

/// Why a handshake failed, seen from the side that reports it. `trust` names the CA file
/// the certificate was checked against (`--control-ca FILE`, `--client-ca FILE`), if any.
pub fn describe(e: &Error, trust: Option<&str>) -> String {
    match e {
        Error::InvalidCertificate(c) => certificate(c, trust),
        Error::NoCertificatesPresented => "no client certificate presented".to_owned(),
        Error::AlertReceived(alert) => alert_received(*alert),
        Error::InvalidMessage(_) | Error::InappropriateMessage { .. } => {
            "the peer does not speak TLS (plain http:// on that port?)".to_owned()
        }
        Error::NoApplicationProtocol => {
            "no common application protocol (ALPN): the peer is not a Switchyard listener?"
                .to_owned()
        }
        other => other.to_string(),
    }
}

fn certificate(c: &CertificateError, trust: Option<&str>) -> String {
    match c {
        CertificateError::Expired => "certificate expired".to_owned(),
        CertificateError::ExpiredContext { not_after, .. } => {
            format!("certificate expired (valid until {})", time(*not_after))
        }
        CertificateError::NotValidYet => "certificate not valid yet".to_owned(),
        CertificateError::NotValidYetContext { not_before, .. } => {
            format!("certificate not valid yet (valid from {})", time(*not_before))
        }
        CertificateError::UnknownIssuer => match trust {
            Some(ca) => format!("unknown issuer: the certificate is not signed by the CA in {ca}"),
            None => "unknown issuer: the certificate is not signed by a trusted CA".to_owned(),
        },
        CertificateError::NotValidForNameContext { expected, presented } => format!(
            "name mismatch: certificate is for {}, not {}",
            if presented.is_empty() {
                "no name".to_owned()
            } else {
                presented.iter().map(|n| bare_name(n)).collect::<Vec<_>>().join(", ")
            },
            expected.to_str()
        ),
        CertificateError::NotValidForName => {
            "name mismatch: certificate is for another host".to_owned()
        }
        CertificateError::Revoked => "certificate revoked".to_owned(),
        CertificateError::BadSignature => "certificate signature does not verify".to_owned(),
        other => format!("invalid certificate: {other:?}"),
    }
}

/// rustls presents a certificate's names as `DnsName("x")` or `IpAddress(1.2.3.4)`; an
/// operator wants `x`.
fn bare_name(presented: &str) -> &str {
    match presented.split_once('(') {
        Some((_, rest)) => rest.trim_end_matches(')').trim_matches('"'),
        None => presented,
    }
}

fn alert_received(alert: AlertDescription) -> String {
    match alert {
        AlertDescription::CertificateRequired => {
            "the peer requires a client certificate (mutual TLS: give --tls-cert and --tls-key)"
                .to_owned()
        }
        AlertDescription::UnknownCA | AlertDescription::BadCertificate => {
            "the peer refused our certificate: not signed by the CA it trusts".to_owned()
        }
        AlertDescription::CertificateExpired => {
            "the peer refused our certificate: expired".to_owned()
        }
        AlertDescription::CertificateUnknown | AlertDescription::UnsupportedCertificate => {
            format!("the peer refused our certificate ({alert:?})")
        }
        AlertDescription::NoApplicationProtocol => {
            "no common application protocol (ALPN): the peer is not a Switchyard listener?"
                .to_owned()
        }
        other => format!("the peer ended the handshake ({other:?})"),
    }
}

fn time(t: UnixTime) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(t.as_secs())).to_string()
}

/// An error and its causes on one line, each said once (tonic's transport error says only
/// "transport error", and hyper's connect error repeats itself one level down). The one
/// error-chain formatter of the workspace: the node's upstream calls, the control plane's
/// webhook deliveries and the CLI's messages all say their errors through it.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut last = text.clone();
    let mut source = e.source();
    while let Some(cause) = source {
        let line = cause.to_string();
        if line != last && !text.ends_with(&line) {
            text.push_str(": ");
            text.push_str(&line);
        }
        last = line;
        source = cause.source();
    }
    text
}

/// The rustls error inside an I/O error, if that is what it is.
pub fn rustls_error(e: &std::io::Error) -> Option<&Error> {
    e.get_ref().and_then(|inner| inner.downcast_ref::<Error>())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use rustls::pki_types::ServerName;

    /// An error whose text is `text` and whose cause is `source`.
    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<Layer>>);

    impl std::fmt::Display for Layer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Layer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|l| l as &(dyn std::error::Error + 'static))
        }
    }

    #[test]
    fn a_chain_says_each_cause_once() {
        let refused = Layer("Connection refused (os error 111)", None);
        // hyper-util's connect error prints its cause and also returns it as its source.
        let connect =
            Layer("tcp connect error: Connection refused (os error 111)", Some(Box::new(refused)));
        let client = Layer("client error (Connect)", Some(Box::new(connect)));
        assert_eq!(
            chain(&client),
            "client error (Connect): tcp connect error: Connection refused (os error 111)"
        );
        let plain = Layer("transport error", Some(Box::new(Layer("timed out", None))));
        assert_eq!(chain(&plain), "transport error: timed out");
    }

    #[test]
    fn the_common_refusals_read_as_words() {
        let mismatch = Error::InvalidCertificate(CertificateError::NotValidForNameContext {
            expected: ServerName::try_from("cp.example.com").unwrap().to_owned(),
            presented: vec!["DnsName(\"localhost\")".into(), "127.0.0.1".into()],
        });
        assert_eq!(
            describe(&mismatch, None),
            "name mismatch: certificate is for localhost, 127.0.0.1, not cp.example.com"
        );
        let unknown = Error::InvalidCertificate(CertificateError::UnknownIssuer);
        assert!(describe(&unknown, Some("--control-ca /ca.pem")).contains("--control-ca /ca.pem"));
        let expired = Error::InvalidCertificate(CertificateError::ExpiredContext {
            time: UnixTime::since_unix_epoch(Duration::from_secs(86_400)),
            not_after: UnixTime::since_unix_epoch(Duration::from_secs(3_600)),
        });
        assert_eq!(
            describe(&expired, None),
            "certificate expired (valid until 1970-01-01T01:00:00Z)"
        );
    }
}
