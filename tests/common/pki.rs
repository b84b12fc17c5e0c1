//! A private CA made in the test (rcgen) and the PEM files of the
//! certificates it issued, for the TLS tests: `https://` upstreams, the
//! listener, `rediss://`.

use std::path::PathBuf;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair, KeyUsagePurpose};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// A private CA and the files of certificates it issued.
pub struct Pki {
    pub dir: tempfile::TempDir,
    pub ca: CertifiedIssuer<'static, KeyPair>,
}

impl Pki {
    pub fn new() -> Pki {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        let pki = Pki { dir: tempfile::tempdir().unwrap(), ca };
        std::fs::write(pki.path("ca.pem"), pki.ca.pem()).unwrap();
        pki
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Issues a certificate for `names` as `<stem>.pem` and `<stem>.key`;
    /// `expired` makes one that ran out in 2020.
    pub fn issue(&self, stem: &str, names: &[&str], expired: bool) {
        let mut params = CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
        if expired {
            params.not_before = rcgen::date_time_ymd(2019, 1, 1);
            params.not_after = rcgen::date_time_ymd(2020, 1, 1);
        }
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.ca).unwrap();
        std::fs::write(self.path(&format!("{stem}.pem")), cert.pem()).unwrap();
        std::fs::write(self.path(&format!("{stem}.key")), key.serialize_pem()).unwrap();
    }

    pub fn certs(&self, stem: &str) -> Vec<CertificateDer<'static>> {
        gateway::tls::load_certs(&self.path(&format!("{stem}.pem"))).unwrap()
    }

    pub fn key(&self, stem: &str) -> PrivateKeyDer<'static> {
        gateway::tls::load_key(&self.path(&format!("{stem}.key"))).unwrap()
    }

    pub fn roots(&self) -> rustls::RootCertStore {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.certs("ca")[0].clone()).unwrap();
        roots
    }
}
