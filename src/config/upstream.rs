//! The runtime shape of `[upstreams.NAME]`: where its endpoints are, how
//! they are spoken to, and how the gateway protects them.

use std::net::{IpAddr, SocketAddr};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http::uri::{Authority, Scheme};
use rustls_pki_types::ServerName;

/// `[upstreams.NAME]`.
#[derive(Debug, Clone, PartialEq)]
pub struct UpstreamConfig {
    pub name: String,
    /// Where requests go: `url`, or each of `endpoints`; for a discovered
    /// upstream, the addresses its name resolves to now (empty as loaded:
    /// the table fills them in from `crate::discovery`).
    pub endpoints: Vec<EndpointConfig>,
    /// `discover`: the endpoints come from DNS.
    pub discover: Option<Discover>,
    pub balance: Balance,
    /// Time allowed to establish a TCP connection.
    pub connect_timeout: Duration,
    /// Idle keep-alive connections kept per endpoint.
    pub pool_max_idle_per_host: usize,
    /// How long an idle pooled connection is kept; keep it below the
    /// upstream's own keep-alive timeout.
    pub pool_idle_timeout: Duration,
    /// Requests in flight to the upstream (all endpoints) and its queue.
    pub admission: Option<Admission>,
    pub health: Option<HealthConfig>,
    pub outlier: Option<OutlierConfig>,
    pub retry_budget: RetryBudget,
    /// The TLS client config of its `https://` endpoints.
    pub tls: Option<UpstreamTls>,
    /// How requests go to it: HTTP/1.1 or HTTP/2.
    pub protocol: Protocol,
    /// HTTP/2: connections per endpoint, each multiplexing many requests.
    pub max_connections: usize,
}

/// The TLS client config of an upstream's `https://` endpoints, with the
/// bytes it was made from: two are equal when their files held the same
/// bytes, so a reload that reads unchanged certificate files keeps the
/// upstream as it is.
#[derive(Clone)]
pub struct UpstreamTls {
    pub config: Arc<rustls::ClientConfig>,
    /// The CA file's, client certificate's and key's contents, and ALPN.
    pub(crate) source: Vec<u8>,
    /// The files they were read from (for the watcher).
    pub files: Vec<PathBuf>,
}

impl PartialEq for UpstreamTls {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

impl std::fmt::Debug for UpstreamTls {
    /// Not the key's bytes.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamTls").field("source_bytes", &self.source.len()).finish_non_exhaustive()
    }
}

/// The protocol spoken to an upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// HTTP/1.1, a request at a time per pooled connection.
    Http1,
    /// HTTP/2 with prior knowledge (cleartext, or over TLS without ALPN
    /// negotiation).
    H2c,
    /// Over TLS: HTTP/2 when the upstream offers `h2` by ALPN, else
    /// HTTP/1.1.
    Auto,
}

/// One endpoint of an upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointConfig {
    /// As configured: the `endpoint` label of its metrics.
    pub url: String,
    /// Always `http`.
    pub scheme: Scheme,
    /// The `Host` the upstream sees when the route sends the upstream's own
    /// (`localhost` for a Unix socket).
    pub authority: Authority,
    /// Where connections go.
    pub address: Address,
    /// For an `https://` endpoint: the name its certificate must carry, sent
    /// as SNI (the URL's host, or `tls_server_name`).
    pub tls_name: Option<ServerName<'static>>,
    /// Its share of the upstream's requests against the others' (1 unless
    /// the file says).
    pub weight: u32,
}

/// `discover = { dns = "name:port" }` or `{ srv = "_http._tcp.name" }`:
/// each address the name resolves to is an endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Discover {
    pub name: DiscoverName,
    /// `http` or `https` for every address.
    pub scheme: Scheme,
    /// Resolved again at least this often.
    pub interval: Duration,
    /// Record TTLs are clamped to `min_ttl..max_ttl`; a name not found for
    /// `max_ttl` since its last answer loses its addresses.
    pub min_ttl: Duration,
    pub max_ttl: Duration,
    /// For `https`: the name certificates must carry (`tls_server_name`,
    /// else the configured name, never an address).
    pub tls_name: Option<ServerName<'static>>,
}

/// What is looked up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DiscoverName {
    /// A and AAAA records of `host`; every address on `port`.
    Dns { host: String, port: u16 },
    /// SRV records of the name: their targets' addresses on their ports.
    Srv(String),
}

impl Discover {
    /// `dns` or `srv`, as the status endpoints and metrics say.
    pub fn source(&self) -> &'static str {
        match self.name {
            DiscoverName::Dns { .. } => "dns",
            DiscoverName::Srv(_) => "srv",
        }
    }

    /// The name as configured, for logs (`name:port` or the SRV name).
    pub fn describe(&self) -> String {
        match &self.name {
            DiscoverName::Dns { host, port } => format!("{host}:{port}"),
            DiscoverName::Srv(name) => name.clone(),
        }
    }

    /// The service's own name: the `Host` an endpoint is sent when the
    /// route asks for the upstream's (for SRV the name without its leading
    /// `_service._proto` labels), without a final dot.
    pub fn domain(&self) -> &str {
        let name = match &self.name {
            DiscoverName::Dns { host, .. } => host.as_str(),
            DiscoverName::Srv(name) => {
                let mut rest = name.as_str();
                while let Some(after) = rest.strip_prefix('_').and_then(|r| r.split_once('.').map(|(_, a)| a)) {
                    rest = after;
                }
                rest
            }
        };
        name.strip_suffix('.').unwrap_or(name)
    }

    /// The endpoint for one address of the answer: everything a configured
    /// endpoint has, its `url` (the `endpoint` label) being the address.
    pub fn endpoint(&self, ip: IpAddr, port: u16) -> EndpointConfig {
        let socket = SocketAddr::new(ip, port);
        let addr = socket.to_string();
        let authority = format!("{}:{port}", self.domain())
            .parse()
            .unwrap_or_else(|_| addr.parse().expect("a socket address is an authority"));
        EndpointConfig {
            url: addr.clone(),
            scheme: self.scheme.clone(),
            authority,
            address: Address::Ip(socket),
            tls_name: self.tls_name.clone(),
            weight: 1,
        }
    }

    /// Whether `other` makes the same endpoints of the same answer (a
    /// reload that changes only timings keeps the addresses known).
    pub fn same_target(&self, other: &Discover) -> bool {
        self.name == other.name && self.scheme == other.scheme && self.tls_name == other.tls_name
    }
}

impl Address {
    /// `host:port` over TCP: [`Address::Ip`] when the host is an IP address.
    pub fn tcp(host_port: String) -> Address {
        match host_port.parse() {
            Ok(addr) => Address::Ip(addr),
            Err(_) => Address::Tcp(host_port),
        }
    }
}

/// Where an endpoint's connections go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Address {
    /// `host:port`, resolved at each connect.
    Tcp(String),
    /// An IP address and port, parsed once at load: a new connection does
    /// not parse it again (see benches/README.md, "A new connection's cost").
    Ip(SocketAddr),
    /// A Unix stream socket (`unix:PATH`; a relative path is resolved
    /// against the config file's folder at load; `unix:@NAME`, a Linux
    /// abstract socket, is NAME after a NUL byte, as tokio takes it).
    Unix(PathBuf),
}

impl std::fmt::Display for Address {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Address::Tcp(addr) => f.write_str(addr),
            Address::Ip(addr) => write!(f, "{addr}"),
            Address::Unix(path) => match path.as_os_str().as_bytes().strip_prefix(b"\0") {
                // An abstract socket, spelt as configured.
                Some(name) => write!(f, "unix:@{}", String::from_utf8_lossy(name)),
                None => write!(f, "unix:{}", path.display()),
            },
        }
    }
}

/// How an upstream spreads requests over its endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Balance {
    /// The fewer in flight of two endpoints picked at random.
    LeastRequest,
    /// Strict rotation over the endpoints that may take traffic.
    RoundRobin,
}

/// `max_requests` and its FIFO queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admission {
    pub max_requests: MaxRequests,
    /// Requests that may wait; past it, 503 at once.
    pub queue: usize,
    /// Longest wait in the queue; past it, 503.
    pub queue_timeout: Duration,
}

/// The limit on requests in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaxRequests {
    /// As configured.
    Fixed(usize),
    /// `"auto"`: learned from the upstream's latency, within `auto_min` and
    /// `auto_max` (see `crate::upstream::adaptive`).
    Auto(AutoBounds),
}

/// `auto_min` and `auto_max`: the learned limit stays within them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AutoBounds {
    pub min: usize,
    pub max: usize,
}

impl MaxRequests {
    /// The limit a new admission starts with: a learned one starts at its
    /// floor, where it measures the upstream's minimum latency.
    pub fn initial(self) -> usize {
        match self {
            MaxRequests::Fixed(n) => n,
            MaxRequests::Auto(b) => b.min,
        }
    }
}

/// `[upstreams.NAME.health]`: active checks of each endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthConfig {
    /// `GET` this; a 2xx within `timeout` is a pass.
    pub path: String,
    pub interval: Duration,
    pub timeout: Duration,
    /// Consecutive failed checks that mark an endpoint unhealthy.
    pub unhealthy_after: u32,
    /// Consecutive passed checks that mark it healthy again.
    pub healthy_after: u32,
}

/// `[upstreams.NAME.outlier]`: passive ejection after failures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutlierConfig {
    pub consecutive_failures: u32,
    pub ejection_time: Duration,
}

/// Retries allowed beyond `min_per_second` as a share of recent requests.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryBudget {
    pub ratio: f32,
    pub min_per_second: u32,
}
