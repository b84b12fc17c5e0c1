//! TLS with rustls (the ring provider): the client side for `https://`
//! upstreams and the server side for `[server.tls]`. Certificates and keys
//! are read from PEM files when the config is loaded, so a bad file is a
//! config error naming its key, not a failure at the first connection.

use std::io;
use std::path::Path;
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls::{CertificateError, ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// The crypto provider every TLS config here uses.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The largest certificate or key file read: a PEM chain is a few KiB, and
/// a path to something endless (`/dev/zero`) must not exhaust memory.
const MAX_PEM_FILE: u64 = 1024 * 1024;

/// Refuses what is not a regular file of a sane size.
fn check_file(path: &Path) -> Result<(), String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if !meta.is_file() {
        return Err(format!("{} is not a regular file", path.display()));
    }
    if meta.len() > MAX_PEM_FILE {
        return Err(format!("{} is larger than 1 MiB; not a PEM certificate or key", path.display()));
    }
    Ok(())
}

/// The certificates in a PEM file (at least one).
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    check_file(path)?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<_, _>>())
        .map_err(|e| format!("cannot read certificates from {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{} holds no PEM certificate", path.display()));
    }
    Ok(certs)
}

/// The private key in a PEM file (PKCS#8, PKCS#1 or SEC1).
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    check_file(path)?;
    PrivateKeyDer::from_pem_file(path).map_err(|e| {
        let encrypted = std::fs::read_to_string(path).is_ok_and(|t| t.contains("ENCRYPTED"));
        match encrypted {
            true => format!("{}: encrypted private keys are not supported; decrypt it first", path.display()),
            false => format!("cannot read a private key from {}: {e}", path.display()),
        }
    })
}

fn roots(certs: Vec<CertificateDer<'static>>, path: &Path) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    for cert in certs {
        roots.add(cert).map_err(|e| format!("{}: not a usable CA certificate: {e}", path.display()))?;
    }
    Ok(roots)
}

/// A CA file's PEM text, checked as `client_config` checks a `ca_file`, for
/// a client that takes the PEM itself (the `redis` crate's).
pub fn load_ca_pem(path: &Path) -> Result<Vec<u8>, String> {
    roots(load_certs(path)?, path)?;
    std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

/// Which of the client settings a problem is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientKey {
    CaFile,
    ClientCert,
    ClientKey,
}

/// The client config of an upstream: `ca_file`'s certificates as the only
/// roots, else webpki's (Mozilla's) roots; a client certificate for mutual
/// TLS. Sessions are resumed (rustls keeps a small in-memory cache per
/// config, and each upstream has one config).
pub fn client_config(
    ca_file: Option<&Path>,
    client_auth: Option<(&Path, &Path)>,
    alpn: &[&[u8]],
) -> Result<Arc<ClientConfig>, (ClientKey, String)> {
    let roots = match ca_file {
        Some(path) => {
            roots(load_certs(path).map_err(|m| (ClientKey::CaFile, m))?, path).map_err(|m| (ClientKey::CaFile, m))?
        }
        None => RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.to_vec() },
    };
    let verifier = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider())
        .build()
        .map_err(|e| (ClientKey::CaFile, e.to_string()))?;
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| (ClientKey::CaFile, e.to_string()))?
        .with_webpki_verifier(verifier);
    let mut config = match client_auth {
        Some((cert, key)) => {
            let certs = load_certs(cert).map_err(|m| (ClientKey::ClientCert, m))?;
            let key = load_key(key).map_err(|m| (ClientKey::ClientKey, m))?;
            builder
                .with_client_auth_cert(certs, key)
                .map_err(|e| (ClientKey::ClientCert, format!("certificate and key do not go together: {e}")))?
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

/// The listener's config: its certificate chain and key, ALPN `h2` and
/// `http/1.1`, and with `client_ca` a client certificate signed by it is
/// required (mutual TLS). An error says which of `[server.tls]`'s keys it
/// is about: `cert`, `key` or `client_ca`.
pub fn server_config(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
) -> Result<Arc<ServerConfig>, (&'static str, String)> {
    let certs = load_certs(cert).map_err(|m| ("cert", m))?;
    let key = load_key(key).map_err(|m| ("key", m))?;
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| ("cert", e.to_string()))?;
    let builder = match client_ca {
        Some(path) => {
            let ca = |m| ("client_ca", m);
            let roots = roots(load_certs(path).map_err(ca)?, path).map_err(ca)?;
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
                .build()
                .map_err(|e| ("client_ca", format!("{}: {e}", path.display())))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|e| ("key", format!("certificate and key do not go together: {e}")))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// What failed in a TLS handshake, in plain words first (expired, unknown
/// issuer, name mismatch, ...), then rustls' own description.
pub fn describe_failure(e: &io::Error) -> String {
    let Some(tls) = e.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>()) else {
        return e.to_string();
    };
    let plain = match tls {
        rustls::Error::InvalidCertificate(c) => match c {
            CertificateError::Expired | CertificateError::ExpiredContext { .. } => "certificate expired",
            CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => "certificate not valid yet",
            CertificateError::UnknownIssuer => "certificate signed by an unknown issuer",
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
                "certificate name mismatch"
            }
            CertificateError::Revoked => "certificate revoked",
            CertificateError::BadSignature => "bad certificate signature",
            _ => "invalid certificate",
        },
        rustls::Error::AlertReceived(_) => "the peer refused the handshake",
        rustls::Error::NoApplicationProtocol => "no common application protocol (ALPN)",
        _ => "handshake failed",
    };
    format!("{plain}: {tls}")
}
