//! The main listener's settings that are more than a value: its TLS
//! certificate, and which code serves its connections per HTTP version
//! (hyper's server connections, or the gateway's own).

use std::path::PathBuf;
use std::sync::Arc;

/// `server.http1`: hyper's HTTP/1.1 server connection, or the gateway's own
/// (`listener::h1`), which forwards an upstream's 1xx.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Http1Server {
    Hyper,
    Gateway,
}

/// `server.http2`: hyper's HTTP/2 server connection, or the gateway's own
/// on the h2 crate (`listener::h2`), which forwards an upstream's 1xx.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Http2Server {
    Hyper,
    Gateway,
}

/// `[server.tls]`: the listener's certificate, read at load.
#[derive(Debug, Clone)]
pub struct ListenerTls {
    pub config: Arc<rustls::ServerConfig>,
    /// The files it was read from (for `gateway check` and the watcher).
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
}

impl PartialEq for ListenerTls {
    /// By the files named: what they hold is read again on every reload.
    fn eq(&self, other: &Self) -> bool {
        self.cert == other.cert && self.client_ca == other.client_ca
    }
}
