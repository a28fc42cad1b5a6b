//! Throw-away certificates for tests of TLS between Switchyard's parts (node ↔ control plane,
//! CLI ↔ control plane, clients ↔ node, control plane ↔ etcd): a certificate authority and
//! leaf certificates it signs, written as PEM files into a temporary directory, as an
//! operator's PKI would hand them over.
//!
//! Used by the store tests, the end-to-end harness and the bench's `tls-cost`:
//!
//! ```ignore
//! let ca = Ca::new("switchyard test CA");
//! let server = ca.leaf("control", &["localhost", "127.0.0.1"]);
//! // server.cert / server.key are PEM file paths; ca.cert_path() is the CA's PEM file.
//! ```

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

/// A certificate authority whose files live as long as it does.
pub struct Ca {
    dir: tempfile::TempDir,
    issuer: Issuer<'static, KeyPair>,
    cert_path: PathBuf,
}

/// A leaf certificate and its private key, as PEM files.
#[derive(Clone, Debug)]
pub struct Leaf {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Ca {
    pub fn new(name: &str) -> Self {
        let dir = tempfile::tempdir().expect("temp dir for certificates");
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().expect("CA key");
        let cert = params.self_signed(&key).expect("CA certificate");
        let cert_path = dir.path().join("ca.pem");
        std::fs::write(&cert_path, cert.pem()).expect("write CA certificate");
        let issuer = Issuer::new(params, key);
        Self { dir, issuer, cert_path }
    }

    /// The CA certificate's PEM file (what `--control-ca`, `--client-ca`, `--etcd-ca` take).
    pub fn cert_path(&self) -> &Path {
        &self.cert_path
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A certificate valid now for a day, usable as server and client certificate, for the
    /// given DNS names and IP addresses; files `<name>.pem` and `<name>-key.pem`.
    pub fn leaf(&self, name: &str, hosts: &[&str]) -> Leaf {
        let now = SystemTime::now();
        self.leaf_valid(
            name,
            hosts,
            now - Duration::from_secs(3600),
            now + Duration::from_secs(86_400),
        )
    }

    /// A certificate that expired an hour ago.
    pub fn expired_leaf(&self, name: &str, hosts: &[&str]) -> Leaf {
        let now = SystemTime::now();
        self.leaf_valid(
            name,
            hosts,
            now - Duration::from_secs(2 * 86_400),
            now - Duration::from_secs(3600),
        )
    }

    pub fn leaf_valid(
        &self,
        name: &str,
        hosts: &[&str],
        not_before: SystemTime,
        not_after: SystemTime,
    ) -> Leaf {
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, name);
        params.subject_alt_names = hosts
            .iter()
            .map(|host| match host.parse() {
                Ok(ip) => SanType::IpAddress(ip),
                Err(_) => SanType::DnsName((*host).try_into().expect("DNS name")),
            })
            .collect();
        params.key_usages =
            vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        params.extended_key_usages =
            vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        params.not_before = not_before.into();
        params.not_after = not_after.into();
        let key = KeyPair::generate().expect("leaf key");
        let cert = params.signed_by(&key, &self.issuer).expect("leaf certificate");
        let leaf = Leaf {
            cert: self.dir.path().join(format!("{name}.pem")),
            key: self.dir.path().join(format!("{name}-key.pem")),
        };
        std::fs::write(&leaf.cert, cert.pem()).expect("write certificate");
        std::fs::write(&leaf.key, key.serialize_pem()).expect("write key");
        leaf
    }
}

impl Leaf {
    /// Copies the pair over `target`'s files (a rotation as an operator's tooling does it:
    /// the key first, then the certificate).
    pub fn install_as(&self, target: &Leaf) {
        std::fs::copy(&self.key, &target.key).expect("copy key");
        std::fs::copy(&self.cert, &target.cert).expect("copy certificate");
    }
}
