//! rustls configs for Switchyard's listeners and clients. Certificates, keys and CAs come
//! from [`Reloading`] files, so a handshake always uses the files as they are now.

use std::path::PathBuf;
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{
    ClientConfig, DigitallySignedStruct, DistinguishedName, RootCertStore, ServerConfig,
    SignatureScheme,
};

use crate::files::{self, Source, TlsError};
use crate::reload::Reloading;

/// ALPN names: gRPC needs HTTP/2; HTTP/1.1 for the node's clients and `/metrics` scrapers.
pub const H2: &[u8] = b"h2";
pub const HTTP11: &[u8] = b"http/1.1";

/// The one crypto provider (`ring`, as the upstream client uses).
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// `--tls-cert` and `--tls-key` as given (both or neither).
pub fn pair_flags(
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
) -> Result<Option<(Source, Source)>, TlsError> {
    match (cert, key) {
        (Some(cert), Some(key)) => {
            Ok(Some((Source::new("--tls-cert", cert), Source::new("--tls-key", key))))
        }
        (None, None) => Ok(None),
        (Some(_), None) => Err(TlsError::HalfPair { given: "--tls-cert", missing: "--tls-key" }),
        (None, Some(_)) => Err(TlsError::HalfPair { given: "--tls-key", missing: "--tls-cert" }),
    }
}

/// A certificate and key pair that follows its files: the server's certificate, or a
/// client's for mutual TLS.
#[derive(Debug)]
pub struct Identity(Reloading<CertifiedKey>);

impl Identity {
    pub fn open(
        cert: Source,
        key: Source,
        provider: Arc<CryptoProvider>,
    ) -> Result<Self, TlsError> {
        let load = move |files: &[Source]| match files {
            [cert, key] => files::certified_key(cert, key, &provider),
            _ => Err(TlsError::Settings("a certificate needs exactly one key".into())),
        };
        Ok(Self(Reloading::open("certificate and key", vec![cert, key], Box::new(load))?))
    }
}

impl ResolvesServerCert for Identity {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.get())
    }
}

impl rustls::client::ResolvesClientCert for Identity {
    fn resolve(&self, _hints: &[&[u8]], _schemes: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        Some(self.0.get())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// A listener's TLS: its certificate, and with `client_ca` the CA a client's certificate
/// must be signed by (mutual TLS; a client without one is refused at the handshake).
pub fn server_config(
    identity: (Source, Source),
    client_ca: Option<Source>,
    alpn: &[&[u8]],
) -> Result<Arc<ServerConfig>, TlsError> {
    let provider = provider();
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Settings(e.to_string()))?;
    let builder = match client_ca {
        Some(ca) => {
            let verifier = ClientCa::open(ca, Arc::clone(&provider))?;
            builder.with_client_cert_verifier(Arc::new(verifier))
        }
        None => builder.with_no_client_auth(),
    };
    let (cert, key) = identity;
    let mut config = builder.with_cert_resolver(Arc::new(Identity::open(cert, key, provider)?));
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

/// A client's TLS: the CA the server's certificate must be signed by (the public web's
/// CAs without one), and the client's own certificate for mutual TLS.
pub fn client_config(
    ca: Option<Source>,
    identity: Option<(Source, Source)>,
    alpn: &[&[u8]],
) -> Result<Arc<ClientConfig>, TlsError> {
    let provider = provider();
    let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Settings(e.to_string()))?;
    let builder = match ca {
        Some(ca) => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(ServerCa::open(ca, Arc::clone(&provider))?)),
        None => {
            let roots = RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.to_vec() };
            builder.with_root_certificates(roots)
        }
    };
    let mut config = match identity {
        Some((cert, key)) => {
            builder.with_client_cert_resolver(Arc::new(Identity::open(cert, key, provider)?))
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

// === impl ServerCa ===

/// Checks servers' certificates against a CA file that reloads when it changes.
#[derive(Debug)]
struct ServerCa {
    verifier: Reloading<Arc<WebPkiServerVerifier>>,
    provider: Arc<CryptoProvider>,
}

impl ServerCa {
    fn open(ca: Source, provider: Arc<CryptoProvider>) -> Result<Self, TlsError> {
        let for_load = Arc::clone(&provider);
        let load = move |files: &[Source]| {
            let file = files.first().ok_or_else(|| TlsError::Settings("no CA file".into()))?;
            WebPkiServerVerifier::builder_with_provider(files::roots(file)?, Arc::clone(&for_load))
                .build()
                .map_err(|e| TlsError::BadCa { file: file.clone(), reason: e.to_string() })
        };
        Ok(Self { verifier: Reloading::open("CA", vec![ca], Box::new(load))?, provider })
    }
}

impl ServerCertVerifier for ServerCa {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.verifier.get().verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        )
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

// === impl ClientCa ===

/// Checks clients' certificates against a CA file that reloads when it changes; a client
/// without a certificate is refused.
#[derive(Debug)]
struct ClientCa {
    verifier: Reloading<Arc<dyn ClientCertVerifier>>,
    provider: Arc<CryptoProvider>,
}

impl ClientCa {
    fn open(ca: Source, provider: Arc<CryptoProvider>) -> Result<Self, TlsError> {
        let for_load = Arc::clone(&provider);
        let load = move |files: &[Source]| {
            let file = files.first().ok_or_else(|| TlsError::Settings("no CA file".into()))?;
            WebPkiClientVerifier::builder_with_provider(files::roots(file)?, Arc::clone(&for_load))
                .build()
                .map_err(|e| TlsError::BadCa { file: file.clone(), reason: e.to_string() })
        };
        Ok(Self { verifier: Reloading::open("client CA", vec![ca], Box::new(load))?, provider })
    }
}

impl ClientCertVerifier for ClientCa {
    /// No hints: the list would have to outlive a reload. Switchyard's clients hold one
    /// certificate each and send it whatever the hints say.
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.verifier.get().verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}
