//! The files a configuration was read from besides its own: what the
//! watcher (`server.watch_config`) watches with it, so that a renewed
//! certificate, htpasswd or JWKS file is applied as an edit of the
//! configuration would be.

use std::path::PathBuf;

use super::Config;
use super::access::{AuthConfig, JwksSource};

impl Config {
    /// Every certificate, key, CA, htpasswd and JWKS file it read, each
    /// once, in the order met.
    pub fn files(&self) -> Vec<PathBuf> {
        let mut files = Vec::new();
        if let Some(tls) = &self.server.tls {
            files.extend([tls.cert.clone(), tls.key.clone()]);
            files.extend(tls.client_ca.clone());
        }
        for up in &self.upstreams {
            files.extend(up.tls.iter().flat_map(|t| t.files.iter().cloned()));
        }
        for route in &self.routes {
            match route.access.as_ref().and_then(|a| a.auth.as_ref()) {
                Some(AuthConfig::Basic(b)) => files.push(b.htpasswd.clone()),
                Some(AuthConfig::Jwt(j)) => {
                    if let JwksSource::File { path, .. } = &j.source {
                        files.push(path.clone());
                    }
                }
                Some(AuthConfig::Forward(_)) | None => {}
            }
        }
        files.extend(self.rate_limit_store.iter().flat_map(|s| s.ca_file.as_ref().map(|c| c.path.clone())));
        let mut seen = std::collections::HashSet::new();
        files.retain(|f| seen.insert(f.clone()));
        files
    }
}
