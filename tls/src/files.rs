//! PEM files as flags name them, read into what rustls takes. Every error names the flag
//! and the file, never the file's content (a key must not reach a log).

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;

/// A file given on the command line, with the flag that gave it: `--tls-key /etc/x.pem`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Source {
    pub flag: &'static str,
    pub path: PathBuf,
}

impl Source {
    pub fn new(flag: &'static str, path: impl Into<PathBuf>) -> Self {
        Self { flag, path: path.into() }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.flag, self.path.display())
    }
}

/// What is wrong with TLS files or settings, or with a handshake.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{file}: cannot read: {source}")]
    Read { file: Source, source: std::io::Error },
    #[error("{0}: no certificate in it (expected a PEM block `BEGIN CERTIFICATE`)")]
    NoCertificate(Source),
    #[error(
        "{0}: no private key in it (expected a PEM block `BEGIN PRIVATE KEY`, `BEGIN RSA PRIVATE KEY` or `BEGIN EC PRIVATE KEY`)"
    )]
    NoKey(Source),
    #[error("{file}: not valid PEM: {reason}")]
    BadPem { file: Source, reason: String },
    #[error("{file}: unusable private key: {reason}")]
    BadKey { file: Source, reason: String },
    #[error("{key} is not the key of the certificate in {cert}")]
    KeyMismatch { cert: Source, key: Source },
    #[error("{file}: unusable CA certificate: {reason}")]
    BadCa { file: Source, reason: String },
    #[error("{given} needs {missing} too")]
    HalfPair { given: &'static str, missing: &'static str },
    #[error("TLS settings: {0}")]
    Settings(String),
    #[error("{url}: {host:?} is not a host name or IP address a certificate can be for")]
    ServerName { url: String, host: String },
    #[error("cannot connect to {peer}: {source}")]
    Connect { peer: String, source: std::io::Error },
    #[error("TLS handshake with {peer} failed: {reason}")]
    Handshake { peer: String, reason: String },
}

fn read(file: &Source) -> Result<Vec<u8>, TlsError> {
    std::fs::read(&file.path).map_err(|source| TlsError::Read { file: file.clone(), source })
}

fn bad_pem(file: &Source, e: &pem::Error) -> TlsError {
    TlsError::BadPem { file: file.clone(), reason: e.to_string() }
}

/// Every certificate in a PEM file, in order (a leaf, then its intermediates).
pub fn certificates(file: &Source) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = read(file)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad_pem(file, &e))?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate(file.clone()));
    }
    crate::expiry::record(file.flag, &file.path, &certs);
    Ok(certs)
}

/// The first private key in a PEM file (PKCS#8, PKCS#1 or SEC1).
pub fn private_key(file: &Source) -> Result<PrivateKeyDer<'static>, TlsError> {
    let bytes = read(file)?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| match e {
        pem::Error::NoItemsFound => TlsError::NoKey(file.clone()),
        e => bad_pem(file, &e),
    })
}

/// A certificate and its key, checked to belong together.
pub fn certified_key(
    cert: &Source,
    key: &Source,
    provider: &CryptoProvider,
) -> Result<CertifiedKey, TlsError> {
    let chain = certificates(cert)?;
    let der = private_key(key)?;
    let signing = provider
        .key_provider
        .load_private_key(der)
        .map_err(|e| TlsError::BadKey { file: key.clone(), reason: e.to_string() })?;
    let pair = CertifiedKey::new(chain, signing);
    match pair.keys_match() {
        Ok(()) => Ok(pair),
        // A key type whose public half rustls cannot derive: the handshake will tell.
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => Ok(pair),
        Err(rustls::Error::InconsistentKeys(_)) => {
            Err(TlsError::KeyMismatch { cert: cert.clone(), key: key.clone() })
        }
        Err(e) => Err(TlsError::BadPem { file: cert.clone(), reason: e.to_string() }),
    }
}

/// The trust anchors of a CA file: every certificate in it.
pub fn roots(file: &Source) -> Result<Arc<RootCertStore>, TlsError> {
    let mut store = RootCertStore::empty();
    for cert in certificates(file)? {
        store
            .add(cert)
            .map_err(|e| TlsError::BadCa { file: file.clone(), reason: e.to_string() })?;
    }
    Ok(Arc::new(store))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn errors_name_the_flag_and_the_file_and_not_the_content() {
        let dir = tempfile::tempdir().unwrap();
        let missing = Source::new("--tls-key", dir.path().join("nope.pem"));
        let e = private_key(&missing).unwrap_err().to_string();
        assert!(
            e.starts_with("--tls-key ") && e.contains("nope.pem") && e.contains("cannot read"),
            "{e}"
        );

        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not pem at all\n").unwrap();
        let e = certificates(&Source::new("--tls-cert", &empty)).unwrap_err().to_string();
        assert!(e.contains("--tls-cert") && e.contains("no certificate"), "{e}");
        let e = private_key(&Source::new("--tls-key", &empty)).unwrap_err().to_string();
        assert!(e.contains("--tls-key") && e.contains("no private key"), "{e}");
    }

    #[test]
    fn a_key_of_another_certificate_is_refused_naming_both_files() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str| {
            let key = rcgen::KeyPair::generate().unwrap();
            let cert = rcgen::CertificateParams::new(vec!["localhost".into()])
                .unwrap()
                .self_signed(&key)
                .unwrap();
            let (c, k) = (
                dir.path().join(format!("{name}.pem")),
                dir.path().join(format!("{name}-key.pem")),
            );
            std::fs::write(&c, cert.pem()).unwrap();
            std::fs::write(&k, key.serialize_pem()).unwrap();
            (Source::new("--tls-cert", c), Source::new("--tls-key", k))
        };
        let (a_cert, a_key) = write("a");
        let (_, b_key) = write("b");
        let provider = rustls::crypto::ring::default_provider();
        assert!(certified_key(&a_cert, &a_key, &provider).is_ok());
        let e = certified_key(&a_cert, &b_key, &provider).unwrap_err().to_string();
        assert!(e.contains("b-key.pem") && e.contains("a.pem") && e.contains("not the key"), "{e}");
        assert!(!e.contains("PRIVATE KEY-----"), "no key material in errors: {e}");
    }
}
