//! The files a configuration was read from besides its own: what the
//! watcher (`server.watch_config`) watches with it, so that a renewed
//! certificate, htpasswd or JWKS file is applied as an edit of the
//! configuration would be.

use std::path::{Path, PathBuf};

use super::access::{AuthConfig, JwksSource};
use super::raw::RawConfig;
use super::{Config, Source};

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

/// The files the configuration at `path` names when `text` is its bytes,
/// taken from its keys alone (the files [`Config::files`] lists when it
/// loads, and those it would read if it does not): what the watcher
/// watches once it has seen `text`, so that a file named before it is
/// written, or the configuration changed after a file it named was moved,
/// is followed. `None` when `text` is not TOML of the configuration's
/// shape.
pub fn named_files(path: &Path, text: &str) -> Option<Vec<PathBuf>> {
    let source = Source::File(path.to_owned());
    let raw: RawConfig = super::built(&source, text).ok()?.try_deserialize().ok()?;
    let base = source.base_dir();
    let mut named: Vec<&String> = Vec::new();
    if let Some(tls) = &raw.server.tls {
        named.extend(tls.cert.iter().chain(&tls.key).chain(&tls.client_ca));
    }
    for up in raw.upstreams.values() {
        named.extend(up.tls_ca_file.iter().chain(&up.tls_client_cert).chain(&up.tls_client_key));
    }
    for auth in raw.routes.iter().filter_map(|r| r.auth.as_ref()) {
        named.extend(auth.basic.iter().filter_map(|b| b.htpasswd.as_ref()));
        named.extend(auth.jwt.iter().filter_map(|j| j.jwks_file.as_ref()));
    }
    named.extend(raw.rate_limit_store.iter().filter_map(|s| s.ca_file.as_ref()));
    let mut files: Vec<PathBuf> = named.into_iter().map(|f| base.join(f)).collect();
    let mut seen = std::collections::HashSet::new();
    files.retain(|f| seen.insert(f.clone()));
    Some(files)
}
